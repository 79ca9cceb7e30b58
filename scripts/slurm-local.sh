#!/usr/bin/env bash
# slurm-local.sh — a real one-node Slurm cluster on this machine, for testing the batch scripts.
#
#   scripts/slurm-local.sh start  WORKDIR   # writes WORKDIR/slurm.conf, starts munged, slurmctld, slurmd
#   scripts/slurm-local.sh status WORKDIR   # daemons alive? node state (sinfo)
#   scripts/slurm-local.sh stop   WORKDIR   # stops what `start` started (pid files in WORKDIR)
#
# Runs as root (or through sudo) with Debian's slurm-wlm and munge, installed by
# scripts/install-deps.sh when missing. Nothing is exported globally: `start` prints
#   export SLURM_CONF=WORKDIR/slurm.conf
# and the Slurm commands (sbatch, scontrol, sinfo, scancel) need that variable.
# No cgroups are needed: proctrack/linuxproc and task/none. Config, state, spool, logs
# and pid files all live in WORKDIR. docs/slurm.md explains its use.
set -euo pipefail

usage() { echo "usage: $0 {start|stop|status} WORKDIR" >&2; exit 2; }
[[ $# -eq 2 ]] || usage
action=$1
mkdir -p "$2"
work=$(cd "$2" && pwd)
conf=$work/slurm.conf
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

sudo=""
[[ $(id -u) -eq 0 ]] || sudo="sudo"

# alive PIDFILE: the pid in PIDFILE names a running process
alive() { [[ -s $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

munge_works() { munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; }

write_conf() {
  local host cpus mem_kb mem_mb
  host=$(hostname -s)
  cpus=$(nproc)
  mem_kb=$(awk '/^MemTotal:/ {print $2}' /proc/meminfo)
  mem_mb=$(( mem_kb / 1024 * 9 / 10 ))   # below the real size, or the node is drained as "Low RealMemory"
  mkdir -p "$work/state" "$work/spool" "$work/log"
  cat > "$conf" <<EOF
# Written by scripts/slurm-local.sh — a one-node Slurm cluster for testing.
ClusterName=piper-local
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
ReturnToService=2
JobRequeue=1
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/log/slurmctld.log
SlurmdLogFile=$work/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=30
MinJobAge=300
NodeName=$host CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
}

start_munge() {
  if munge_works; then
    echo "slurm-local: munged already running, using it"
    rm -f "$work/munged.pid"
    return
  fi
  $sudo mkdir -p /run/munge /var/lib/munge "$work/log"
  $sudo chown munge:munge /run/munge /var/lib/munge
  $sudo chmod 0755 /run/munge
  [[ -s /etc/munge/munge.key ]] || $sudo mungekey --create --force
  $sudo munged --force --pid-file="$work/munged.pid" --log-file="$work/log/munged.log"
  for _ in $(seq 50); do munge_works && return; sleep 0.1; done
  echo "slurm-local: munged did not start (see $work/log/munged.log)" >&2
  exit 1
}

node_state() { SLURM_CONF=$conf sinfo -h -N -o '%T' 2>/dev/null | head -1; }

start() {
  command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null \
    && command -v sinfo >/dev/null || "$here/install-deps.sh"
  if alive "$work/slurmctld.pid" || alive "$work/slurmd.pid"; then
    echo "slurm-local: already running in $work (stop it first)" >&2
    exit 1
  fi
  write_conf
  start_munge
  $sudo env SLURM_CONF="$conf" slurmctld -f "$conf"
  $sudo env SLURM_CONF="$conf" slurmd -f "$conf"
  local state=""
  for _ in $(seq 120); do
    state=$(node_state || true)
    [[ $state == idle ]] && break
    sleep 0.5
  done
  if [[ $state != idle ]]; then
    echo "slurm-local: node not idle after 60 s (state '${state:-none}'); logs in $work/log" >&2
    tail -n 20 "$work/log/slurmctld.log" "$work/log/slurmd.log" >&2 || true
    exit 1
  fi
  echo "slurm-local: node $(hostname -s) idle, $(nproc) CPU(s); logs in $work/log"
  echo "export SLURM_CONF=$conf"
}

stop_pid() {  # stop_pid NAME PIDFILE: SIGTERM, then SIGKILL after 10 s
  local name=$1 file=$2 pid
  alive "$file" || { rm -f "$file"; return 0; }
  pid=$(cat "$file")
  $sudo kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then
    echo "slurm-local: $name ($pid) ignored SIGTERM, killing" >&2
    $sudo kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$file"
  echo "slurm-local: stopped $name ($pid)"
}

stop() {
  # slurmd first: its job steps (slurmstepd) end with it when it is killed.
  stop_pid slurmd "$work/slurmd.pid"
  stop_pid slurmctld "$work/slurmctld.pid"
  stop_pid munged "$work/munged.pid"
}

status() {
  local rc=0 d
  for d in munged slurmctld slurmd; do
    if alive "$work/$d.pid"; then echo "$d: running ($(cat "$work/$d.pid"))"
    else echo "$d: not running"; [[ $d == munged ]] || rc=1; fi
  done
  [[ -f $conf ]] && SLURM_CONF=$conf sinfo -N 2>/dev/null || true
  return $rc
}

case $action in
  start) start ;;
  stop) stop ;;
  status) status ;;
  *) usage ;;
esac
