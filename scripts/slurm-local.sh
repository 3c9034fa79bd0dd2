#!/usr/bin/env bash
# A throwaway one-node Slurm cluster on this machine, for tests: no systemd, no system files.
#
#   scripts/slurm-local.sh up ROOT          start munged, slurmctld and slurmd with everything under
#                                           ROOT (ROOT/etc/slurm.conf), wait until the node is idle
#   scripts/slurm-local.sh exec ROOT CMD..  run a client command (sbatch, scancel, scontrol, squeue)
#                                           against that cluster
#   scripts/slurm-local.sh down ROOT        stop the daemons (by their pid files) and the namespace
#
# The cluster lives in a network namespace of its own (`ip netns`, name in ROOT/netns) with only a
# loopback interface: slurmctld listens on all of that namespace's addresses, which are
# 127.0.0.1 and ::1, and nothing outside it can reach the daemons. Jobs run inside it too. munge's
# socket is under ROOT. Needs root (the daemons run as root here), iproute2, and Slurm and munge
# installed (scripts/install-slurm.sh); nsenter (util-linux). Tuned for tests: a requeued job starts again within seconds
# (cred_expire=5, scheduling every second), and exit code 75 requeues a job (RequeueExit).
set -euo pipefail
export PATH="/usr/sbin:/sbin:$PATH"
cmd="${1:-}"; root="${2:-}"
if [[ -z "$cmd" || -z "$root" ]]; then
  echo "usage: $0 up|down ROOT" >&2; exit 2
fi
mkdir -p "$root"
root="$(cd "$root" && pwd)"

stop_pid() { # pidfile name
  local f="$1" pid
  [[ -f "$f" ]] || return 0
  pid="$(cat "$f" 2>/dev/null || true)"
  [[ -n "$pid" ]] || return 0
  kill -TERM "$pid" 2>/dev/null || return 0
  for _ in $(seq 1 100); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
}

ns_file="$root/netns"
if [[ "$cmd" == down ]]; then
  stop_pid "$root/run/slurmd.pid"
  stop_pid "$root/run/slurmctld.pid"
  stop_pid "$root/munge/run/munged.pid"
  if [[ -f "$ns_file" ]]; then ip netns del "$(cat "$ns_file")" 2>/dev/null || true; rm -f "$ns_file"; fi
  exit 0
fi
if [[ "$cmd" == exec ]]; then
  shift 2
  exec nsenter --net="/run/netns/$(cat "$ns_file")" env SLURM_CONF="$root/etc/slurm.conf" "$@"
fi
[[ "$cmd" == up ]] || { echo "unknown command $cmd (up, exec or down)" >&2; exit 2; }

for tool in ip munged mungekey slurmctld slurmd sinfo; do
  command -v "$tool" >/dev/null || { echo "$tool is not installed: run scripts/install-slurm.sh" >&2; exit 1; }
done
mkdir -p "$root"/{munge/etc,munge/run,munge/log,munge/lib,etc,state,spool,run,log}
# munged wants its key and state dirs private, and every dir above its socket searchable.
chmod 755 "$root" "$root/munge" "$root/munge/run"
chmod 700 "$root/munge/etc" "$root/munge/log" "$root/munge/lib"
sock="$root/munge/run/munge.socket.2"
if (( ${#sock} >= 100 )); then
  echo "munge socket path too long (${#sock} chars; unix sockets allow < 108): $sock" >&2; exit 1
fi
[[ -f "$root/munge/etc/munge.key" ]] || mungekey --create --keyfile="$root/munge/etc/munge.key"
ns="ralph-slurm-$$"
ip netns add "$ns"
echo "$ns" > "$ns_file"
# nsenter switches the network namespace only (`ip netns exec` would also remount /sys, hiding
# the cgroup filesystem slurmd looks for).
in_ns() { nsenter --net="/run/netns/$ns" "$@"; }
in_ns ip link set lo up
# A second loopback address: getaddrinfo's AI_ADDRCONFIG (which Slurm uses) finds no IPv4 at all
# when 127.0.0.1 is the only address.
in_ns ip addr add 127.0.0.2/8 dev lo
in_ns munged -S "$sock" --key-file="$root/munge/etc/munge.key" --pid-file="$root/munge/run/munged.pid" \
  --log-file="$root/munge/log/munged.log" --seed-file="$root/munge/lib/munged.seed"

node="$(hostname -s)"
read -r cpus mem < <(slurmd -C | awk '{for(i=1;i<=NF;i++){split($i,a,"="); if(a[1]=="CPUs")c=a[2]; if(a[1]=="RealMemory")m=a[2]}} END{print c, m}')
mem=$(( mem * 9 / 10 ))
cat > "$root/etc/slurm.conf" <<CONF
ClusterName=ralphtest
SlurmctldHost=$node(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$sock,cred_expire=5
StateSaveLocation=$root/state
SlurmdSpoolDir=$root/spool
SlurmctldPidFile=$root/run/slurmctld.pid
SlurmdPidFile=$root/run/slurmd.pid
SlurmctldLogFile=$root/log/slurmctld.log
SlurmdLogFile=$root/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=256
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1,sched_interval=1
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$root/log/jobcomp.txt
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
JobRequeue=1
RequeueExit=75
KillWait=10
MinJobAge=600
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE OverSubscribe=FORCE:4 State=UP
CONF
export SLURM_CONF="$root/etc/slurm.conf"
in_ns slurmctld
in_ns slurmd
for _ in $(seq 1 300); do
  state="$(in_ns sinfo -h -o %T 2>/dev/null || true)"
  if [[ "$state" == idle ]]; then exit 0; fi
  sleep 0.1
done
echo "the Slurm node did not become idle within 30 s (state: ${state:-unknown}); logs in $root/log" >&2
exit 1
