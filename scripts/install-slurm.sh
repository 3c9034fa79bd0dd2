#!/usr/bin/env bash
# Installs Slurm (slurmctld, slurmd, the client commands) and munge from Debian's packages for the
# Slurm end-to-end test (tests/it/slurm.rs), unless sbatch, slurmctld, slurmd and munged are
# already on PATH. Nothing is started or enabled here: the test starts a one-node cluster of its
# own under a temporary directory (scripts/slurm-local.sh) and stops it at the end.
# Needs root (or passwordless sudo) and the Debian package mirror; about 15 s.
set -euo pipefail
have() { command -v "$1" >/dev/null 2>&1; }
if have sbatch && have slurmctld && have slurmd && have munged && have mungekey; then
  slurmctld -V
  exit 0
fi
sudo=""
if [[ "$(id -u)" != 0 ]]; then sudo="sudo -n"; fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq >/dev/null
# --no-install-recommends keeps out the ~30 plugin and -dev packages the test does not need.
# The packages' postinst scripts try to start the daemons through invoke-rc.d; without systemd
# (a container, CI) that is refused and harmless.
$sudo apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null
slurmctld -V
