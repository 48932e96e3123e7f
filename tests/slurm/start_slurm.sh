#!/usr/bin/env bash
# A one-node SLURM cluster on this machine, for tests/test_slurm.py and for trying `cmd=slurm`:
# Debian's slurmctld + slurmd and munge, a partition `debug` (the default) holding this host.
# Idempotent: installs what is missing (apt-get, as root), (re)writes /etc/slurm/slurm.conf,
# starts only the daemons that are not running, and waits until `sinfo` shows the node idle.
#   bash tests/slurm/start_slurm.sh          (STOP=1 to stop the daemons it started)
# No cgroups (they are not there in every container): proctrack/linuxproc, task/none.
set -euo pipefail

WAIT_S=${WAIT_S:-90}
HOST=$(hostname -s)
CONF=/etc/slurm/slurm.conf
LOGDIR=/var/log/slurm

die() { echo "start_slurm.sh: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "must run as root (it installs packages and starts daemons)"

stop() {   # the daemon of pid file $1: SIGTERM, then SIGKILL after 10 s, until it is gone
  local pid
  [ -s "$1" ] || return 0
  pid=$(cat "$1")
  kill "$pid" 2>/dev/null || return 0
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.2; done
  echo "start_slurm.sh: pid $pid ($1) still running after 10 s: SIGKILL" >&2
  kill -9 "$pid" 2>/dev/null || return 0
  for _ in $(seq 25); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.2; done
}
if [ "${STOP:-0}" = 1 ]; then
  for pidfile in /run/slurmd.pid /run/slurmctld.pid /run/munge/munged.pid; do stop "$pidfile"; done
  exit 0
fi

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null \
    || ! command -v sbatch >/dev/null || ! command -v munged >/dev/null; then
  command -v apt-get >/dev/null || die "apt-get is not here: install SLURM (slurmctld, slurmd, slurm-client) and munge yourself"
  export DEBIAN_FRONTEND=noninteractive
  (apt-get update -qq && apt-get install -y -qq --no-install-recommends \
     slurmctld slurmd slurm-client munge) >/tmp/start_slurm.apt.log 2>&1 \
    || { tail -20 /tmp/start_slurm.apt.log >&2; die "apt-get install failed (log above)"; }
fi

# munge: the key the daemons authenticate with (the package makes one; a bare image may not).
mkdir -p /etc/munge /run/munge /var/lib/munge /var/log/munge
if [ ! -s /etc/munge/munge.key ]; then
  dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
fi
chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge
chmod 700 /etc/munge && chmod 400 /etc/munge/munge.key && chmod 755 /run/munge
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  rm -f /run/munge/munged.pid /run/munge/munge.socket.2*
  runuser -u munge -- /usr/sbin/munged || die "munged did not start"
  for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.2; done
  munge -n | unmunge >/dev/null || die "munge does not work (munged started, unmunge fails)"
fi

# slurm.conf for this host: its CPUs, 90% of its memory, one partition.
# The CPUs are slurmd's own count (`slurmd -C`, what it registers with): never `nproc`, which
# obeys OMP_NUM_THREADS / OMP_THREAD_LIMIT - and a test process that ran a stage has set
# OMP_NUM_THREADS=1 (asrtrain.jobs.set_threads), which wrote CPUs=1 and left every
# --cpus-per-task=2 job PENDING (PartitionConfig) for ever.
CPUS=$(slurmd -C 2>/dev/null | sed -n 's/.*[[:space:]]CPUs=\([0-9][0-9]*\).*/\1/p' | head -1)
[ -n "$CPUS" ] || CPUS=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
MEM_MB=$(( $(free -m | awk '/^Mem:/ {print $2}') * 9 / 10 ))
mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd "$LOGDIR"
NEW=$(mktemp)
cat >"$NEW" <<EOF
# Written by asrtrain's tests/slurm/start_slurm.sh: a one-node cluster on $HOST.
ClusterName=asrtrain
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=$LOGDIR/slurmctld.log
SlurmdLogFile=$LOGDIR/slurmd.log
SlurmctldTimeout=30
SlurmdTimeout=60
InactiveLimit=0
KillWait=5
MinJobAge=300
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$MEM_MB State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
EOF
changed=0
if ! cmp -s "$NEW" "$CONF"; then
  install -m 644 "$NEW" "$CONF"
  changed=1
fi
rm -f "$NEW"

running() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
if [ "$changed" = 1 ]; then   # a new config: start both daemons afresh
  for pidfile in /run/slurmd.pid /run/slurmctld.pid; do
    if running "$pidfile"; then stop "$pidfile"; fi
  done
fi
if ! running /run/slurmctld.pid; then
  /usr/sbin/slurmctld || { tail -20 "$LOGDIR/slurmctld.log" >&2; die "slurmctld did not start"; }
fi
if ! running /run/slurmd.pid; then
  /usr/sbin/slurmd || { tail -20 "$LOGDIR/slurmd.log" >&2; die "slurmd did not start"; }
fi

# Up means: the node registered with the configured CPUs (a config rewritten under running
# daemons, or a slurmd that has not re-registered, shows other counts or states) and is in a
# state that runs jobs.
state=""
for _ in $(seq "$WAIT_S"); do
  read -r state cpus < <(sinfo -h -N -n "$HOST" -o '%T %c' 2>/dev/null | head -1 || true) || true
  case "$state" in
    idle|mixed|allocated|completing)
      if [ "${cpus:-}" = "$CPUS" ]; then
        echo "SLURM up: node $HOST $state, $CPUS CPUs, partition debug"; exit 0
      fi ;;
    down*|drain*|drained*) scontrol update NodeName="$HOST" State=RESUME 2>/dev/null || true ;;
  esac
  sleep 1
done
echo "--- sinfo (want $CPUS CPUs):" >&2; sinfo -N -l >&2 || true
echo "--- $LOGDIR/slurmctld.log:" >&2; tail -20 "$LOGDIR/slurmctld.log" >&2 || true
echo "--- $LOGDIR/slurmd.log:" >&2; tail -20 "$LOGDIR/slurmd.log" >&2 || true
die "node $HOST not idle after ${WAIT_S}s (state: '${state:-none}')"
