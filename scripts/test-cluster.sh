#!/usr/bin/env bash
# A real Slurm cluster of 2 (or 4) nodes on one Linux machine, confining job steps by cgroup
# as production sites do, for numarun's cluster tests (root only).
#
#   bash scripts/test-cluster.sh up [--nodes N]   # install Slurm+munge if needed, start it, wait for N idle nodes (2..4)
#   bash scripts/test-cluster.sh down             # stop everything, delete the namespaces (idempotent, never fails)
#   bash scripts/test-cluster.sh status
#   bash scripts/test-cluster.sh install          # only install Slurm+munge if needed (the test command runs it early)
#
# Each "node" is a network namespace (nrc1..nrcN) with an interface nrc0, all joined by a
# bridge in a namespace of its own (nrcsw). slurmctld and slurmd node1 run in nrc1, slurmd
# nodeK in nrcK; they share the filesystem, so jobs see the same paths (and the .venv).
#
# Like production: TaskPlugin=task/cgroup,task/affinity, ProctrackType=proctrack/cgroup,
# ConstrainCores and ConstrainDevices, and two GPUs per node as a gres on device files
# (character devices 195:N, NVIDIA's major, made with mknod), so Slurm allocates them, confines
# the devices cgroup and sets CUDA_VISIBLE_DEVICES. The device files sit in a machine tree
# ($W/gputree, from tests/fixtures/constructed/2gpu-minors-reversed.tar.gz: two GPUs whose
# minor numbers run against the PCI order), so 'numarun --topology $W/gputree' sees the GPUs
# Slurm hands out, by minor number, and finds a task's own GPU by opening them. Only the second
# half of the nodes has them (partition 'gpu'); the default partition 'debug' holds all nodes,
# so a whole-node job there asks for no GPUs (the fewest of its nodes: none), and CPU-only
# jobs plan on this machine's live topology.
# topology/tree puts the odd nodes under switch s1 and the even ones under s2 (names interleave).
# Node addresses sort, as strings, opposite to the node order (node1=10.231.0.9,
# node2=10.231.0.10, node3=10.230.0.9, node4=10.230.0.10): anything ordering nodes by
# address instead of by Slurm's node index shows up.
# 'up' writes /tmp/numarun-cluster/env, a sourceable file with SLURM_CONF, the command prefix
# for Slurm clients (NUMARUN_CLUSTER_EXEC) and the interface name for GLOO_SOCKET_IFNAME.
#
# Daemons start under 'nsenter --net=/run/netns/X', not 'ip netns exec': the latter remounts
# /sys, which hides /sys/fs/cgroup and makes slurmd fail at start.
set -uo pipefail

W=${NUMARUN_CLUSTER_DIR:-/tmp/numarun-cluster}
REPO=$(cd "$(dirname "$0")/.." && pwd)
NSPREFIX=nrc
SWNS=nrcsw
IFNAME=nrc0
MAX_NODES=4
CPUS=$(nproc)
GPUS=2
WAIT_IDLE_S=${NUMARUN_CLUSTER_WAIT_S:-90}

node_addr() {  # 1-based node index -> address (pairs per /24, the pairs counting down)
  local i=$1
  echo "10.$((231 - (i - 1) / 2)).0.$((9 + (i - 1) % 2))"
}

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

make_namespaces() {  # N
  local n=$1 i ns
  ip netns add "$SWNS" || return 1
  ip -n "$SWNS" link add br0 type bridge || return 1
  ip -n "$SWNS" link set br0 up
  ip -n "$SWNS" link set lo up
  for i in $(seq "$n"); do
    ns=$NSPREFIX$i
    ip netns add "$ns" || return 1
    ip link add "$IFNAME" netns "$ns" type veth peer name "p$i" netns "$SWNS" || return 1
    ip -n "$SWNS" link set "p$i" master br0
    ip -n "$SWNS" link set "p$i" up
    ip -n "$ns" addr add "$(node_addr "$i")/8" dev "$IFNAME"
    ip -n "$ns" link set lo up
    ip -n "$ns" link set "$IFNAME" up
    # No name server is reachable from a node. One whose address falls in the nodes' 10/8 would
    # be asked across the bridge and never answer: every lookup (c10d's reverse lookup of each
    # peer it connects, for one) would wait out the resolver's 5 s timeouts. Unreachable, it
    # fails at once, as on a host where the name server is down.
    for dns in $(awk '$1 == "nameserver" && $2 ~ /^[0-9.]+$/ {print $2}' /etc/resolv.conf 2>/dev/null); do
      ip -n "$ns" route add unreachable "$dns/32" 2>/dev/null || true
    done
  done
}

cgroup_plugin() {  # prints cgroup/v1 or cgroup/v2; fails with the reason when neither can work
  local c
  if [ "$(stat -fc %T /sys/fs/cgroup/cpuset 2>/dev/null)" = cgroupfs ]; then
    for c in cpuset memory devices freezer; do
      [ "$(stat -fc %T /sys/fs/cgroup/$c 2>/dev/null)" = cgroupfs ] || {
        echo "cgroup v1 controller '$c' is not mounted at /sys/fs/cgroup/$c"; return 1; }
    done
    echo cgroup/v1
  elif [ -f /sys/fs/cgroup/cgroup.controllers ]; then
    for c in cpuset memory; do
      grep -qw "$c" /sys/fs/cgroup/cgroup.controllers || {
        echo "cgroup v2 controller '$c' is not enabled in /sys/fs/cgroup/cgroup.controllers"; return 1; }
    done
    echo cgroup/v2
  else
    echo "neither cgroup v1 controllers (/sys/fs/cgroup/cpuset) nor a cgroup v2 root (/sys/fs/cgroup/cgroup.controllers) is mounted"
    return 1
  fi
}

make_gpus() {  # fake GPU device files in a machine tree: Slurm stats them (major:minor) for the devices cgroup
  local g tree=$W/gputree
  mkdir -p "$tree/dev" || return 1
  tar -xzf "$REPO/tests/fixtures/constructed/2gpu-minors-reversed.tar.gz" -C "$tree" || return 1
  for g in $(seq 0 $((GPUS - 1))); do mknod "$tree/dev/nvidia$g" c 195 "$g" || return 1; done
}

write_conf() {  # N cgroup-plugin
  local n=$1 plugin=$2 host i odd=() even=()
  host=$(hostname)
  cat >"$W/etc/slurm.conf" <<CONF
ClusterName=numaruntest
SlurmctldHost=$host($(node_addr 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/cgroup
TaskPlugin=task/cgroup,task/affinity
TopologyPlugin=topology/tree
GresTypes=gpu
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
CONF
  local gpu_nodes=()
  for i in $(seq "$n"); do
    local gres=""
    if [ "$i" -gt $((n / 2)) ]; then gres=" Gres=gpu:$GPUS"; gpu_nodes+=("node$i"); fi
    echo "NodeName=node$i NodeHostname=$host NodeAddr=$(node_addr "$i") CPUs=$CPUS RealMemory=1000$gres State=UNKNOWN" >>"$W/etc/slurm.conf"
    if [ $((i % 2)) = 1 ]; then odd+=("node$i"); else even+=("node$i"); fi
  done
  local IFS=,
  cat >>"$W/etc/slurm.conf" <<CONF
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
PartitionName=gpu Nodes=${gpu_nodes[*]} MaxTime=INFINITE State=UP
CONF
  cat >"$W/etc/cgroup.conf" <<CONF
CgroupPlugin=$plugin
CgroupMountpoint=/sys/fs/cgroup
ConstrainCores=yes
ConstrainDevices=yes
ConstrainRAMSpace=no
CONF
  cat >"$W/etc/gres.conf" <<CONF
AutoDetect=off
NodeName=${gpu_nodes[*]} Name=gpu File=$W/gputree/dev/nvidia[0-$((GPUS - 1))]
CONF
  cat >"$W/etc/topology.conf" <<CONF
SwitchName=s1 Nodes=${odd[*]}
SwitchName=s2 Nodes=${even[*]}
SwitchName=s0 Switches=s1,s2
CONF
}

start_daemon() {  # ns name argv...
  local ns=$1 name=$2; shift 2
  setsid nsenter --net=/run/netns/"$ns" "$@" >"$W/log/$name.out" 2>&1 </dev/null &
  echo $! >"$W/run/$name.pid"
}

idle_nodes() {
  SLURM_CONF=$W/etc/slurm.conf nsenter --net=/run/netns/"${NSPREFIX}1" sinfo -h -N -p debug -o %T 2>/dev/null | grep -c '^idle'
}

up() {  # N
  local n=$1 plugin i names addrs
  case "$n" in 2|3|4) ;; *) say "bad --nodes '$n': expected 2, 3 or 4"; return 2 ;; esac
  if ! plugin=$(cgroup_plugin); then
    say "cannot come up: $plugin (Slurm's task/cgroup and proctrack/cgroup need it)"
    return 1
  fi
  down_quiet
  rm -rf "$W"
  mkdir -p "$W"/{etc,state,spool,log,run}
  chmod 755 "$W"
  local t0=$SECONDS
  install_packages || return 1
  start_munge || return 1
  make_namespaces "$n" || { say "could not create network namespaces"; return 1; }
  make_gpus || { say "cannot come up: the GPU tree or the mknod of its device files under $W/gputree failed"; return 1; }
  write_conf "$n" "$plugin"
  echo "$n" >"$W/run/nodes"
  start_daemon "${NSPREFIX}1" slurmctld slurmctld -D -f "$W/etc/slurm.conf"
  for i in $(seq "$n"); do
    start_daemon "$NSPREFIX$i" "slurmd-node$i" slurmd -D -N "node$i" -f "$W/etc/slurm.conf"
  done
  local deadline=$((SECONDS + WAIT_IDLE_S))
  until [ "$(idle_nodes)" = "$n" ]; do
    if [ $SECONDS -ge $deadline ]; then
      say "nodes not idle after ${WAIT_IDLE_S}s"
      tail -n 5 "$W"/log/*.log >&2 2>/dev/null
      return 1
    fi
    sleep 0.5
  done
  names=$(for i in $(seq "$n"); do printf 'node%s ' "$i"; done)
  addrs=$(for i in $(seq "$n"); do printf '%s ' "$(node_addr "$i")"; done)
  cat >"$W/env" <<ENV
# Written by scripts/test-cluster.sh up; source it to use the test cluster.
export SLURM_CONF=$W/etc/slurm.conf
# Slurm clients (sbatch, squeue, scontrol, and numarun submit) run inside node1's namespace:
export NUMARUN_CLUSTER_EXEC='nsenter --net=/run/netns/${NSPREFIX}1'
export NUMARUN_CLUSTER_NODES='${names% }'
export NUMARUN_CLUSTER_ADDRS='${addrs% }'
export NUMARUN_CLUSTER_IFNAME=$IFNAME
export NUMARUN_CLUSTER_PARTITION=debug
export NUMARUN_CLUSTER_CPUS_PER_NODE=$CPUS
export NUMARUN_CLUSTER_GPUS_PER_NODE=$GPUS
export NUMARUN_CLUSTER_GPU_PARTITION=gpu
export NUMARUN_CLUSTER_GPU_TREE=$W/gputree
export NUMARUN_CLUSTER_CGROUP=$plugin
export NUMARUN_CLUSTER_LOGS=$W/log
ENV
  say "up in $((SECONDS - t0))s: $n idle nodes ($plugin, task/cgroup, $GPUS gres GPUs each); source $W/env"
}

kill_ns_processes() {  # every process in our namespaces: daemons, slurmstepd, job tasks
  local ns=$1 sig=$2 pids
  [ -e /run/netns/"$ns" ] || return 0
  pids=$(ip netns pids "$ns" 2>/dev/null)
  [ -n "$pids" ] && kill -"$sig" $pids 2>/dev/null
  return 0
}

down_quiet() {
  local ns1=${NSPREFIX}1 pidfile pid ns i
  if [ -f "$W/etc/slurm.conf" ] && [ -e /run/netns/"$ns1" ]; then
    SLURM_CONF=$W/etc/slurm.conf timeout 10 nsenter --net=/run/netns/"$ns1" scancel --full --partition=debug >/dev/null 2>&1
    SLURM_CONF=$W/etc/slurm.conf timeout 10 nsenter --net=/run/netns/"$ns1" scontrol shutdown >/dev/null 2>&1
  fi
  for pidfile in "$W"/run/slurmd-node*.pid "$W"/run/slurmctld.pid; do
    [ -f "$pidfile" ] && pid=$(cat "$pidfile") && [ -n "$pid" ] && kill "$pid" 2>/dev/null
  done
  local all=()
  for i in $(seq "$MAX_NODES"); do all+=("$NSPREFIX$i"); done
  for ns in "${all[@]}"; do kill_ns_processes "$ns" TERM; done
  for _ in $(seq 20); do
    local left=""
    for ns in "${all[@]}"; do left+=$(ip netns pids "$ns" 2>/dev/null); done
    [ -z "$left" ] && break
    sleep 0.25
  done
  for ns in "${all[@]}"; do kill_ns_processes "$ns" KILL; done
  if [ -f "$W/run/munged.pid" ]; then
    pid=$(cat "$W/run/munged.pid")
    [ -n "$pid" ] && kill "$pid" 2>/dev/null
    rm -f "$W/run/munged.pid"
  fi
  for ns in "${all[@]}" "$SWNS"; do ip netns del "$ns" 2>/dev/null; done
  rm -f "$W/env"
  return 0
}

status() {
  [ -f "$W/env" ] || { echo "down"; return 1; }
  SLURM_CONF=$W/etc/slurm.conf nsenter --net=/run/netns/"${NSPREFIX}1" sinfo -N
}

case "${1:-}" in
  up)
    nodes=2
    case "${2:-}" in
      "") ;;
      --nodes) nodes=${3:-} ;;
      --nodes=*) nodes=${2#--nodes=} ;;
      *) echo "usage: $0 up [--nodes 2|3|4]" >&2; exit 2 ;;
    esac
    up "$nodes" ;;
  down) down_quiet; say "down"; exit 0 ;;
  status) status ;;
  install) mkdir -p "$W/log" && install_packages ;;
  *) echo "usage: $0 up [--nodes N]|down|status|install" >&2; exit 2 ;;
esac
