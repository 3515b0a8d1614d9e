#!/usr/bin/env bash
# A real single-node SLURM cluster on this machine, for tests/test_slurm.py and for trying
# profiles/slurm without a cluster: munge, MariaDB + slurmdbd (sacct needs accounting), slurmctld
# and slurmd, no systemd. Run as root. The node offers its CPUs, most of its memory and two
# GRES "GPUs" of type `fake` (counts only: no device files), so jobs that ask for a GPU, or for
# gpu_model fake, are scheduled as on a GPU cluster.
#
#   tools/slurm_local.sh install   # apt-get: slurm-wlm slurmdbd munge mariadb-server
#   tools/slurm_local.sh start     # configure (idempotent) and start; waits until the node is idle
#   tools/slurm_local.sh stop
set -euo pipefail
CLUSTER=memopt ACCOUNT=memopt PARTITION=main
NODE=$(hostname -s)
CONF=/etc/slurm
SPOOL=/var/spool/memopt-slurm
LOGS=/var/log/memopt-slurm

install() {
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -q slurm-wlm slurmdbd munge mariadb-server >/dev/null
}

configure() {
  mkdir -p "$CONF" "$SPOOL"/{ctld,d} "$LOGS" /run/munge /run/mysqld
  chown munge:munge /run/munge
  chown mysql:mysql /run/mysqld
  [ -s /etc/munge/munge.key ] || { dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null; }
  chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
  local cpus mem
  cpus=$(nproc)
  mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 * 9 / 10 ))  # MiB, 90%
  local before
  before=$(cat "$CONF/slurm.conf" "$CONF/gres.conf" 2>/dev/null || true)
  cat > "$CONF/slurm.conf" <<CONF
ClusterName=$CLUSTER
SlurmctldHost=$NODE
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$SPOOL/ctld
SlurmdSpoolDir=$SPOOL/d
SlurmctldPidFile=$SPOOL/slurmctld.pid
SlurmdPidFile=$SPOOL/slurmd.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStorageEnforce=associations
AccountingStorageTRES=gres/gpu,gres/gpu:fake
AccountingStoreFlags=job_comment
GresTypes=gpu
ReturnToService=2
MinJobAge=600
SchedulerParameters=defer_batch
NodeName=$NODE CPUs=$cpus RealMemory=$mem Gres=gpu:fake:2 State=UNKNOWN
PartitionName=$PARTITION Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
CONF
  for i in 0 1; do  # device files for the two fake GPUs (slurmd counts GPUs by their files)
    [ -e "$SPOOL/fakegpu$i" ] || mknod "$SPOOL/fakegpu$i" c 1 3  # what /dev/null is
  done
  echo "NodeName=$NODE Name=gpu Type=fake File=$SPOOL/fakegpu[0-1]" > "$CONF/gres.conf"
  if [ "$before" != "$(cat "$CONF/slurm.conf" "$CONF/gres.conf")" ]; then  # daemons read it at start
    halt slurmd
    halt slurmctld
  fi
  cat > "$CONF/slurmdbd.conf" <<CONF
AuthType=auth/munge
DbdHost=localhost
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=root
StorageLoc=slurm_acct_db
PidFile=$SPOOL/slurmdbd.pid
LogFile=$LOGS/slurmdbd.log
CONF
  chmod 600 "$CONF/slurmdbd.conf"
}

daemon() {  # start a daemon detached from the caller: its own session, no inherited output
  setsid -f "$@" </dev/null >/dev/null 2>&1
}

halt() {  # halt NAME: stop a daemon and wait until it is gone
  pkill -x "$1" || return 0
  local end=$(( SECONDS + 30 ))
  while pgrep -x "$1" >/dev/null && [ $SECONDS -lt $end ]; do sleep 0.2; done
}

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
  local end=$(( SECONDS + $1 )) what=$2
  shift 2
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $end ] || { echo "slurm_local: $what did not come up; logs in $LOGS" >&2; exit 1; }
    sleep 0.5
  done
}

start() {
  command -v slurmctld >/dev/null || { echo "slurm_local: SLURM is not installed (run: $0 install)" >&2; exit 1; }
  configure
  pgrep -x munged >/dev/null || daemon runuser -u munge -- /usr/sbin/munged
  pgrep -x mariadbd >/dev/null || pgrep -x mysqld >/dev/null \
    || (cd / && daemon mysqld_safe --user=mysql)
  wait_for 60 MariaDB mysqladmin ping
  pgrep -x slurmdbd >/dev/null || daemon slurmdbd
  wait_for 60 slurmdbd sacctmgr -n show cluster
  sacctmgr -i add cluster "$CLUSTER" >/dev/null 2>&1 || true
  sacctmgr -i add account "$ACCOUNT" cluster="$CLUSTER" >/dev/null 2>&1 || true
  sacctmgr -i add user root account="$ACCOUNT" cluster="$CLUSTER" >/dev/null 2>&1 || true
  if [ -n "${SUDO_USER:-}" ]; then sacctmgr -i add user "$SUDO_USER" account="$ACCOUNT" >/dev/null 2>&1 || true; fi
  # A cold controller starts clean (-c): jobs saved by a run that was cut off (the machine stopped
  # mid-test) have no processes left, yet would keep the node allocated and the next run waiting.
  pgrep -x slurmctld >/dev/null || daemon slurmctld -c
  pgrep -x slurmd >/dev/null || daemon slurmd
  wait_for 60 "the node $NODE" bash -c "sinfo -h -N -o %t | grep -qx idle"
  echo "SLURM $(sinfo -V | cut -d' ' -f2) up: cluster $CLUSTER, partition $PARTITION, account $ACCOUNT, node $NODE ($(nproc) CPUs, gpu:fake:2)"
}

stop() {
  for d in slurmd slurmctld slurmdbd; do halt "$d"; done
  mysqladmin shutdown >/dev/null 2>&1 || true
  halt munged
}

case ${1:-} in
  install) install ;;
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 install|start|stop" >&2; exit 2 ;;
esac
