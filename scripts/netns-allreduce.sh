#!/bin/bash
# Flat vs hierarchical all-reduce on an emulated two-node cluster (root, Linux).
#
# Two network namespaces are the two "nodes", joined by a veth pair whose both ends are
# rate-limited with tc tbf (netem is not always available; tbf is). Ranks of one node talk
# over the namespace's loopback (unlimited), ranks of different nodes over the veth link,
# as on a real cluster with a slow interconnect. `numarun bench allreduce` runs in each
# namespace as node 0 / node 1 with GLOO_SOCKET_IFNAME set to the veth.
#
# Usage:  sudo scripts/netns-allreduce.sh
# Knobs (env): SHAPES="2 4" (ranks per node, one run each), SIZES=16M,32M,64M, ITERS=5,
#              WARMUP=1, RATE=200mbit, CHUNK=auto (hierarchical pipelining chunk, 0 = one shot),
#              OUT=/tmp/netns-allreduce, NUMARUN=.venv/bin/numarun
# Both "nodes" share this host's CPUs, so the ranks run unbound (--binding none): binding two
# nodes' worth of ranks to the same cores would measure the binding, not the link.
# Output: one JSON report per shape in $OUT and a summary table (hier/flat time ratio, the
# byte-count bound of that ratio, and each mode's time against its link bound).
set -euo pipefail

HERE=$(cd "$(dirname "$0")/.." && pwd)
SHAPES=${SHAPES:-"2 4"}
SIZES=${SIZES:-16M,32M,64M}
ITERS=${ITERS:-5}
WARMUP=${WARMUP:-1}
CHUNK=${CHUNK:-auto}
RATE=${RATE:-200mbit}
OUT=${OUT:-/tmp/netns-allreduce}
NUMARUN=${NUMARUN:-$HERE/.venv/bin/numarun}
PYTHON=${PYTHON:-$HERE/.venv/bin/python}
NS0=numarun-ar0
NS1=numarun-ar1
IF=nrar0
ADDR0=10.231.7.1
ADDR1=10.231.7.2
TIMEOUT=${TIMEOUT:-1800}

[ "$(id -u)" = 0 ] || { echo "netns-allreduce: needs root (network namespaces, tc)" >&2; exit 2; }
command -v ip >/dev/null && command -v tc >/dev/null || { echo "netns-allreduce: needs iproute2 (ip, tc)" >&2; exit 2; }

PIDS=()
cleanup() {
  set +e
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  sleep 0.5
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
  ip netns del "$NS0" 2>/dev/null
  ip netns del "$NS1" 2>/dev/null
}
trap cleanup EXIT INT TERM

# A previous run killed hard may have left them behind.
ip netns del "$NS0" 2>/dev/null || true
ip netns del "$NS1" 2>/dev/null || true
ip netns add "$NS0"
ip netns add "$NS1"
ip link add "$IF" netns "$NS0" type veth peer name "$IF" netns "$NS1"
ip -n "$NS0" addr add "$ADDR0/24" dev "$IF"
ip -n "$NS1" addr add "$ADDR1/24" dev "$IF"
for ns in "$NS0" "$NS1"; do
  ip -n "$ns" link set lo up
  ip -n "$ns" link set "$IF" up
  # Rate-limit each node's egress: both directions of the link.
  ip netns exec "$ns" tc qdisc add dev "$IF" root tbf rate "$RATE" burst 256kb latency 50ms
done
echo "link: $(ip netns exec "$NS0" tc qdisc show dev "$IF")"

mkdir -p "$OUT"
# nsenter keeps the host's /sys (ip netns exec remounts it); only the network is switched.
in_ns() { local ns=$1; shift; nsenter --net="/run/netns/$ns" "$@"; }

port=29640
for G in $SHAPES; do
  port=$((port + 1))
  common=(bench allreduce --nnodes 2 --nproc-per-node "$G" --master-addr "$ADDR0" --master-port "$port"
          --binding none --sizes "$SIZES" --iters "$ITERS" --warmup "$WARMUP" --link-rate "$RATE" --chunk "$CHUNK")
  echo "== 2 nodes x $G ranks, sizes $SIZES, $ITERS iterations (+$WARMUP warmup), link $RATE, chunk $CHUNK"
  in_ns "$NS1" env GLOO_SOCKET_IFNAME="$IF" OMP_NUM_THREADS=1 timeout "$TIMEOUT" \
    "$NUMARUN" "${common[@]}" --node-rank 1 >"$OUT/2x$G.node1.log" 2>&1 &
  PIDS+=($!)
  node1=$!
  rc=0
  in_ns "$NS0" env GLOO_SOCKET_IFNAME="$IF" OMP_NUM_THREADS=1 timeout "$TIMEOUT" \
    "$NUMARUN" "${common[@]}" --node-rank 0 --json-file "$OUT/2x$G.json" 2>"$OUT/2x$G.node0.log" || rc=$?
  wait "$node1" || rc=$?
  [ "$rc" = 0 ] || { echo "netns-allreduce: 2x$G failed (rc $rc); logs in $OUT" >&2; tail -n 20 "$OUT/2x$G".node*.log >&2; exit 1; }
done

"$PYTHON" - "$OUT" $SHAPES <<'EOF'
import json, sys
out, shapes = sys.argv[1], sys.argv[2:]
print()
print("| shape | size | flat (s) | hierarchical (s) | hier/flat | byte-count bound | flat vs its link bound | hierarchical vs its link bound |")
print("|---|---|---|---|---|---|---|---|")
for g in shapes:
    rep = json.load(open(f"{out}/2x{g}.json"))
    med = {(r["size_bytes"], r["mode"]): r["median_s"] for r in rep["results"]}
    for c in rep["comparisons"]:
        s = c["size_bytes"]
        print(f"| 2x{g} | {s >> 20} MiB | {med[(s, 'flat')]:.3f} | {med[(s, 'hierarchical')]:.3f} | "
              f"{c['ratio']:.3f} | {rep['bound_ratio']:.3f} | {c['flat_over_bound'] * 100:+.1f}% | "
              f"{c['hierarchical_over_bound'] * 100:+.1f}% |")
    bad = [k for k, v in rep["correct"].items() if not v]
    if bad:
        print(f"2x{g}: flat and hierarchical results DIFFER for sizes {bad}")
        sys.exit(1)
EOF
