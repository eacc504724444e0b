#!/usr/bin/env bash
# A real two-node Slurm cluster on one Linux machine, for numarun's cluster tests (root only).
#
#   bash scripts/test-cluster.sh up     # install Slurm+munge if needed, start it, wait for 2 idle nodes
#   bash scripts/test-cluster.sh down   # stop everything, delete the namespaces (idempotent, never fails)
#   bash scripts/test-cluster.sh status
#
# The two "nodes" are network namespaces (nrc1, nrc2) joined by a veth pair named nrc0 in both,
# 10.231.0.1 and 10.231.0.2. slurmctld and slurmd node1 run in nrc1, slurmd node2 in nrc2;
# they share the filesystem, so jobs see the same paths (and the repository's .venv).
# 'up' writes /tmp/numarun-cluster/env, a sourceable file with SLURM_CONF, the command prefix
# for Slurm clients (NUMARUN_CLUSTER_EXEC) and the interface name for GLOO_SOCKET_IFNAME.
#
# Daemons start under 'nsenter --net=/run/netns/X', not 'ip netns exec': the latter remounts
# /sys, which hides /sys/fs/cgroup and makes slurmd fail at start.
set -uo pipefail

W=${NUMARUN_CLUSTER_DIR:-/tmp/numarun-cluster}
NS1=nrc1
NS2=nrc2
IFNAME=nrc0
ADDR1=10.231.0.1
ADDR2=10.231.0.2
CPUS=2
WAIT_IDLE_S=${NUMARUN_CLUSTER_WAIT_S:-90}

say() { echo "test-cluster: $*" >&2; }

install_packages() {
  local need=()
  command -v slurmctld >/dev/null || need+=(slurmctld)
  command -v slurmd >/dev/null || need+=(slurmd)
  command -v sbatch >/dev/null || need+=(slurm-client)
  command -v munged >/dev/null || need+=(munge)
  command -v ip >/dev/null || need+=(iproute2)
  command -v nsenter >/dev/null || need+=(util-linux)
  [ ${#need[@]} -eq 0 ] && return 0
  say "installing ${need[*]}"
  apt-get update -qq >/dev/null 2>&1 || true
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >"$W/log/apt.log" 2>&1 || {
    say "apt-get install failed (see $W/log/apt.log)"; return 1; }
}

start_munge() {
  if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    say "munged already running: using it"
    return 0
  fi
  if [ ! -s /etc/munge/munge.key ]; then
    mkdir -p /etc/munge
    mungekey -c -f -k /etc/munge/munge.key >/dev/null 2>&1 || dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 2>/dev/null
    chown munge:munge /etc/munge/munge.key
    chmod 400 /etc/munge/munge.key
  fi
  mkdir -p /run/munge /var/log/munge /var/lib/munge
  chown munge:munge /run/munge /var/log/munge /var/lib/munge
  chmod 755 /run/munge
  runuser -u munge -- /usr/sbin/munged || { say "munged did not start"; return 1; }
  # remember that we started it, so 'down' stops it and only it
  cp /run/munge/munged.pid "$W/run/munged.pid" 2>/dev/null
  for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && return 0; sleep 0.1; done
  say "munge does not answer"; return 1
}

make_namespaces() {
  ip netns add "$NS1" && ip netns add "$NS2" || return 1
  ip link add "$IFNAME" netns "$NS1" type veth peer name "$IFNAME" netns "$NS2" || return 1
  ip -n "$NS1" addr add "$ADDR1/24" dev "$IFNAME"
  ip -n "$NS2" addr add "$ADDR2/24" dev "$IFNAME"
  for ns in "$NS1" "$NS2"; do
    ip -n "$ns" link set lo up
    ip -n "$ns" link set "$IFNAME" up
  done
}

write_conf() {
  local host; host=$(hostname)
  cat >"$W/etc/slurm.conf" <<CONF
ClusterName=numaruntest
SlurmctldHost=$host($ADDR1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
ReturnToService=2
JobRequeue=1
KillWait=15
MinJobAge=600
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=$W/state
SlurmdSpoolDir=$W/spool/%n
SlurmctldPidFile=$W/run/slurmctld.pid
SlurmdPidFile=$W/run/slurmd-%n.pid
SlurmctldLogFile=$W/log/slurmctld.log
SlurmdLogFile=$W/log/slurmd-%n.log
NodeName=node1 NodeHostname=$host NodeAddr=$ADDR1 CPUs=$CPUS RealMemory=1000 State=UNKNOWN
NodeName=node2 NodeHostname=$host NodeAddr=$ADDR2 CPUs=$CPUS RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
}

start_daemon() {  # ns name logfile argv...
  local ns=$1 name=$2; shift 2
  setsid nsenter --net=/run/netns/"$ns" "$@" >"$W/log/$name.out" 2>&1 </dev/null &
  echo $! >"$W/run/$name.pid"
}

idle_nodes() {
  SLURM_CONF=$W/etc/slurm.conf nsenter --net=/run/netns/"$NS1" sinfo -h -N -o %T 2>/dev/null | grep -c '^idle'
}

up() {
  down_quiet
  rm -rf "$W"
  mkdir -p "$W"/{etc,state,spool,log,run}
  chmod 755 "$W"
  local t0=$SECONDS
  install_packages || return 1
  start_munge || return 1
  make_namespaces || { say "could not create network namespaces"; return 1; }
  write_conf
  start_daemon "$NS1" slurmctld slurmctld -D -f "$W/etc/slurm.conf"
  start_daemon "$NS1" slurmd-node1 slurmd -D -N node1 -f "$W/etc/slurm.conf"
  start_daemon "$NS2" slurmd-node2 slurmd -D -N node2 -f "$W/etc/slurm.conf"
  local deadline=$((SECONDS + WAIT_IDLE_S))
  until [ "$(idle_nodes)" = 2 ]; do
    if [ $SECONDS -ge $deadline ]; then
      say "nodes not idle after ${WAIT_IDLE_S}s"
      tail -n 20 "$W"/log/*.log "$W"/log/*.out >&2 2>/dev/null
      return 1
    fi
    sleep 0.5
  done
  cat >"$W/env" <<ENV
# Written by scripts/test-cluster.sh up; source it to use the test cluster.
export SLURM_CONF=$W/etc/slurm.conf
# Slurm clients (sbatch, squeue, scontrol, and numarun submit) run inside node1's namespace:
export NUMARUN_CLUSTER_EXEC='nsenter --net=/run/netns/$NS1'
export NUMARUN_CLUSTER_NODES='node1 node2'
export NUMARUN_CLUSTER_ADDRS='$ADDR1 $ADDR2'
export NUMARUN_CLUSTER_IFNAME=$IFNAME
export NUMARUN_CLUSTER_PARTITION=debug
export NUMARUN_CLUSTER_CPUS_PER_NODE=$CPUS
export NUMARUN_CLUSTER_LOGS=$W/log
ENV
  say "up in $((SECONDS - t0))s: 2 idle nodes; source $W/env"
}

kill_ns_processes() {  # every process in our namespaces: daemons, slurmstepd, job tasks
  local ns=$1 sig=$2 pids
  [ -e /run/netns/"$ns" ] || return 0
  pids=$(ip netns pids "$ns" 2>/dev/null)
  [ -n "$pids" ] && kill -"$sig" $pids 2>/dev/null
  return 0
}

down_quiet() {
  if [ -f "$W/etc/slurm.conf" ] && [ -e /run/netns/"$NS1" ]; then
    SLURM_CONF=$W/etc/slurm.conf timeout 10 nsenter --net=/run/netns/"$NS1" scancel --full --partition=debug >/dev/null 2>&1
    SLURM_CONF=$W/etc/slurm.conf timeout 10 nsenter --net=/run/netns/"$NS1" scontrol shutdown >/dev/null 2>&1
  fi
  local pidfile pid
  for pidfile in "$W"/run/slurmd-node2.pid "$W"/run/slurmd-node1.pid "$W"/run/slurmctld.pid; do
    [ -f "$pidfile" ] && pid=$(cat "$pidfile") && [ -n "$pid" ] && kill "$pid" 2>/dev/null
  done
  for ns in "$NS1" "$NS2"; do kill_ns_processes "$ns" TERM; done
  for _ in $(seq 20); do
    [ -z "$(ip netns pids "$NS1" 2>/dev/null)$(ip netns pids "$NS2" 2>/dev/null)" ] && break
    sleep 0.25
  done
  for ns in "$NS1" "$NS2"; do kill_ns_processes "$ns" KILL; done
  if [ -f "$W/run/munged.pid" ]; then
    pid=$(cat "$W/run/munged.pid")
    [ -n "$pid" ] && kill "$pid" 2>/dev/null
    rm -f "$W/run/munged.pid"
  fi
  ip netns del "$NS1" 2>/dev/null
  ip netns del "$NS2" 2>/dev/null
  rm -f "$W/env"
  return 0
}

status() {
  [ -f "$W/env" ] || { echo "down"; return 1; }
  SLURM_CONF=$W/etc/slurm.conf nsenter --net=/run/netns/"$NS1" sinfo -N
}

case "${1:-}" in
  up) up ;;
  down) down_quiet; say "down"; exit 0 ;;
  status) status ;;
  *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
