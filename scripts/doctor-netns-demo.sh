#!/bin/bash
# Three "nodes" in network namespaces (doctor-n0..2) on one bridge, node 2's link throttled
# both ways with tc tbf; runs 'numarun doctor' on all three and prints node 0's report.
#   sudo bash scripts/doctor-netns-demo.sh [RATE] [--json]
# Removes the namespaces when it ends, however it ends.
set -euo pipefail
RATE=${1:-100mbit}
shift || true
NUMARUN=${NUMARUN:-$(dirname "$0")/../.venv/bin/numarun}
cleanup() { for ns in doctor-n0 doctor-n1 doctor-n2 doctor-br; do ip netns del "$ns" 2>/dev/null || true; done; }
trap cleanup EXIT
cleanup
ip netns add doctor-br
ip -n doctor-br link add br0 type bridge
ip -n doctor-br link set br0 up
for i in 0 1 2; do
  ip netns add doctor-n$i
  ip link add dv$i netns doctor-n$i type veth peer name dp$i netns doctor-br
  ip -n doctor-n$i addr add 10.77.13.$((i + 1))/24 dev dv$i
  ip -n doctor-n$i link set lo up
  ip -n doctor-n$i link set dv$i up
  ip -n doctor-br link set dp$i master br0
  ip -n doctor-br link set dp$i up
done
nsenter --net=/run/netns/doctor-n2 tc qdisc add dev dv2 root tbf rate "$RATE" burst 64kb latency 50ms
nsenter --net=/run/netns/doctor-br tc qdisc add dev dp2 root tbf rate "$RATE" burst 64kb latency 50ms
start=$(date +%s.%N)
for i in 1 2; do
  nsenter --net=/run/netns/doctor-n$i "$NUMARUN" doctor --nnodes 3 --node-rank $i \
    --master-addr 10.77.13.1 --master-port 29613 "$@" > /dev/null 2>&1 &
done
rc=0
nsenter --net=/run/netns/doctor-n0 "$NUMARUN" doctor --nnodes 3 --node-rank 0 \
  --master-addr 10.77.13.1 --master-port 29613 "$@" 2>/dev/null || rc=$?
wait
echo "wall: $(echo "$(date +%s.%N) - $start" | bc) s (exit $rc)"
