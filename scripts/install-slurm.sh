#!/usr/bin/env bash
# Installs Slurm (slurmctld, slurmd, the client commands), munge and iproute2 from Debian's
# packages for the Slurm end-to-end test (tests/it/slurm.rs), unless sbatch, slurmctld, slurmd,
# munged, ip and nsenter are already on PATH. Nothing is started or enabled here: the test starts a one-node cluster of its
# own under a temporary directory (scripts/slurm-local.sh) and stops it at the end.
# Needs root (or passwordless sudo) and the Debian package mirror; about 15 s.
set -euo pipefail
have() { command -v "$1" >/dev/null 2>&1; }
# iproute2 (`ip netns`) and util-linux (`nsenter`) for the cluster's own network namespace.
if have sbatch && have slurmctld && have slurmd && have munged && have mungekey && have ip && have nsenter; then
  slurmctld -V
  exit 0
fi
sudo=""
if [[ "$(id -u)" != 0 ]]; then
  if ! have sudo || ! sudo -n true 2>/dev/null; then
    echo "error: Slurm is not installed, and installing it needs root or passwordless sudo" >&2
    echo "hint: as root, apt-get install -y --no-install-recommends slurmctld slurmd slurm-client munge iproute2" >&2
    exit 1
  fi
  sudo="sudo -n"
fi
if ! have apt-get; then
  echo "error: Slurm is not installed and apt-get is not available (a Debian or Ubuntu machine is expected)" >&2
  echo "hint: install slurmctld, slurmd, the Slurm client commands and munge with this system's package manager" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq >/dev/null
# --no-install-recommends keeps out the ~30 plugin and -dev packages the test does not need.
# The packages' postinst scripts try to start the daemons through invoke-rc.d; without systemd
# (a container, CI) that is refused and harmless.
$sudo apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge iproute2 util-linux >/dev/null
slurmctld -V
