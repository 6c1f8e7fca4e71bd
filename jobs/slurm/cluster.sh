#!/usr/bin/env bash
# A one-node Slurm cluster on this machine: munged, slurmctld and slurmd started without systemd,
# everything (configuration, munge key and socket, spool, state, logs, pid files) under one state
# directory, $KVGRID_SLURM_DIR (default /tmp/kvgrid-slurm).
#   jobs/slurm/cluster.sh start    install the packages if missing, write the configuration, start
#                                  the daemons, wait until sinfo shows the node idle
#   jobs/slurm/cluster.sh stop     stop them by their pid files (nothing is left running)
#   jobs/slurm/cluster.sh status   the daemons' pids and sinfo
#   jobs/slurm/cluster.sh env      the line to eval for sbatch/srun/squeue to find this cluster
# Idempotent: start on a running cluster and stop on a stopped one do nothing. The node declares
# $KVGRID_SLURM_CPUS CPUs (default 8, more than a laptop has: SlurmdParameters=config_overrides)
# so that an 8-rank job fits; the partition oversubscribes. No accounting (no sacct): job states
# come from `scontrol show job` and the run directories. Ports: $KVGRID_SLURM_PORT (default
# 6817) for slurmctld and the next one for slurmd.
set -euo pipefail
state=${KVGRID_SLURM_DIR:-/tmp/kvgrid-slurm}
cpus=${KVGRID_SLURM_CPUS:-8}
port=${KVGRID_SLURM_PORT:-6817}
timeout_s=${KVGRID_SLURM_TIMEOUT:-60}
conf=$state/slurm.conf
node=$(hostname -s)
export SLURM_CONF=$conf

die() { echo "jobs/slurm/cluster.sh: $*" >&2; exit 1; }

# A pid file names a live daemon of that name (a reused pid after a restart does not count).
pid_alive() {
  local f=$1 pid
  [ -f "$f" ] || return 1
  pid=$(cat "$f")
  kill -0 "$pid" 2>/dev/null || return 1
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$(basename "$f" .pid)" ]
}

install_packages() {
  local missing=()
  for b in slurmctld slurmd sbatch munged; do command -v "$b" >/dev/null 2>&1 || missing+=("$b"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "# slurm: installing slurmctld slurmd slurm-client munge slurm-wlm-basic-plugins"
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  $sudo apt-get update -qq >"$state/log/apt.log" 2>&1 || true
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
    slurmctld slurmd slurm-client munge slurm-wlm-basic-plugins >>"$state/log/apt.log" 2>&1 ||
    die "installing the Slurm packages failed (log: $state/log/apt.log)"
}

write_config() {
  mkdir -p "$state"/{munge,ctld,slurmd,run,log}
  chmod 700 "$state/munge"
  if [ ! -f "$state/munge/munge.key" ]; then
    dd if=/dev/urandom of="$state/munge/munge.key" bs=1024 count=1 status=none
    chmod 400 "$state/munge/munge.key"
  fi
  local mem
  mem=$(awk '/MemTotal/ {printf "%d", $2 / 1024 * 0.8}' /proc/meminfo)
  cat >"$conf" <<CONF
# written by jobs/slurm/cluster.sh: a one-node cluster whose state lives in $state
ClusterName=kvgrid
SlurmctldHost=$node
SlurmUser=$(id -un)
SlurmdUser=$(id -un)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$state/munge/munge.socket
StateSaveLocation=$state/ctld
SlurmdSpoolDir=$state/slurmd
SlurmctldPidFile=$state/run/slurmctld.pid
SlurmdPidFile=$state/run/slurmd.pid
SlurmctldLogFile=$state/log/slurmctld.log
SlurmdLogFile=$state/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
InactiveLimit=0
KillWait=5
OverTimeLimit=0
MinJobAge=600
SlurmdTimeout=60
NodeName=$node CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=kvgrid Nodes=$node Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
CONF
}

start() {
  mkdir -p "$state/log"
  install_packages
  write_config
  if ! pid_alive "$state/run/munged.pid"; then
    munged --force --key-file="$state/munge/munge.key" --socket="$state/munge/munge.socket" \
      --pid-file="$state/run/munged.pid" --log-file="$state/log/munged.log" --seed-file="$state/munge/munge.seed" ||
      die "munged did not start (log: $state/log/munged.log)"
  fi
  pid_alive "$state/run/slurmctld.pid" || slurmctld -f "$conf" || die "slurmctld did not start (log: $state/log/slurmctld.log)"
  pid_alive "$state/run/slurmd.pid" || slurmd -f "$conf" || die "slurmd did not start (log: $state/log/slurmd.log)"
  local t0=$SECONDS
  until sinfo -h -N -o "%t" 2>/dev/null | grep -qx "idle"; do
    if [ $((SECONDS - t0)) -ge "$timeout_s" ]; then
      sinfo -N 2>&1 | sed 's/^/#   /' >&2 || true
      die "the node is not idle after ${timeout_s} s (logs: $state/log/slurmctld.log, $state/log/slurmd.log)"
    fi
    scontrol update nodename="$node" state=resume >/dev/null 2>&1 || true
    sleep 1
  done
  echo "# slurm: node $node idle ($cpus CPUs) — export SLURM_CONF=$conf"
}

stop_one() {
  local name=$1 pidfile=$state/run/$1.pid
  pid_alive "$pidfile" || { rm -f "$pidfile"; return 0; }
  local pid
  pid=$(cat "$pidfile")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
  if kill -0 "$pid" 2>/dev/null; then
    kill -9 "$pid" 2>/dev/null || true
    echo "# slurm: $name did not stop in 10 s; killed" >&2
  fi
  rm -f "$pidfile"
}

stop() {
  if pid_alive "$state/run/slurmctld.pid"; then
    # Jobs first, while slurmd can still kill their steps (proctrack/linuxproc: a task would
    # outlive a slurmd stopped under it): cancel, then wait until the queue is empty.
    scancel --quiet --full -u "$(id -un)" 2>/dev/null || true
    for _ in $(seq 1 60); do
      [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break
      sleep 0.5
    done
  fi
  stop_one slurmd
  stop_one slurmctld
  stop_one munged
  echo "# slurm: stopped ($state)"
}

status() {
  local up=0
  for d in munged slurmctld slurmd; do
    if pid_alive "$state/run/$d.pid"; then echo "# $d: running (pid $(cat "$state/run/$d.pid"))"; up=$((up + 1))
    else echo "# $d: not running"; fi
  done
  [ "$up" -eq 3 ] && sinfo -N
  [ "$up" -eq 3 ]
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  env) echo "export SLURM_CONF=$conf" ;;
  *) echo "usage: jobs/slurm/cluster.sh start|stop|status|env" >&2; exit 2 ;;
esac
