#!/bin/bash
# Tokens/s of the reference trainer (DDP, GPT) over an emulated slow cluster: flat vs
# hierarchical all-reduce, with and without bf16 compression (root, Linux).
#
# N network namespaces are the "nodes" (tune-n0, tune-n1, ...), each joined to a bridge in
# a "switch" namespace (tune-sw) by a veth whose both ends are rate-limited with tc tbf:
# every node has a full-duplex link of $RATE. Ranks of one node talk over its loopback
# (unlimited), ranks of different nodes over the link. Each mode is run once per round,
# rotated every round, so drift on a shared host falls on every mode alike.
#
# Usage:  sudo scripts/netns-train.sh
# Knobs (env): SHAPES="2x2 3x2" (nodes x ranks per node), MODES="flat hier-bf16 hier"
#              (also hier-bf16-sync: the hook without overlap), ROUNDS=3, STEPS=8,
#              BATCH_PER_RANK=4 (global batch = ranks x this), RATE=200mbit, MODEL="model=gpt model.d_model=256 model.n_layers=4",
#              EXTRA="" (more trainer overrides, e.g. comm.bucket_mb=4), OUT=/tmp/netns-train
#              (OUT/<shape> is replaced by each run)
#              PHASES=1: run scripts/ddp_phases.py instead of the trainer and print where each
#              step's time goes (forward, backward, optimizer, link busy); PHASES_ARGS="" passes
#              more of its options (e.g. --bucket-mb 4 --chunk-mb 1)
#              NODE_CPUS=split: each node's ranks run on CPUs of their own (host CPUs // N each, as
#              separate machines would; all share when there are fewer CPUs than nodes);
#              NODE_CPUS=shared: every node on all of the host's CPUs
# Ranks run unbound inside their node's CPUs (--binding none).
# Output: per run, the median tokens/s after the first step (metrics.jsonl); then, per
# shape, each mode's median over the rounds and its ratio to flat.
set -euo pipefail

HERE=$(cd "$(dirname "$0")/.." && pwd)
SHAPES=${SHAPES:-"2x2 3x2"}
MODES=${MODES:-"flat hier-bf16 hier"}
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-8}
BATCH_PER_RANK=${BATCH_PER_RANK:-4}
RATE=${RATE:-200mbit}
MODEL=${MODEL:-"model=gpt model.d_model=256 model.n_layers=4"}
EXTRA=${EXTRA:-}
PHASES=${PHASES:-}
PHASES_ARGS=${PHASES_ARGS:-}
OUT=${OUT:-/tmp/netns-train}
NUMARUN=${NUMARUN:-$HERE/.venv/bin/numarun}
PYTHON=${PYTHON:-$HERE/.venv/bin/python}
TIMEOUT=${TIMEOUT:-600}
NODE_CPUS=${NODE_CPUS:-split}
SW=tune-sw
MAXN=3

[ "$(id -u)" = 0 ] || { echo "netns-train: needs root (network namespaces, tc)" >&2; exit 2; }
command -v ip >/dev/null && command -v tc >/dev/null || { echo "netns-train: needs iproute2 (ip, tc)" >&2; exit 2; }
for s in $SHAPES; do
  [[ $s =~ ^[23]x[1-9]$ ]] || { echo "netns-train: bad shape '$s' in SHAPES: expected NxG with N 2 or 3, e.g. 2x2" >&2; exit 2; }
done
case $NODE_CPUS in split|shared) ;;
  *) echo "netns-train: bad NODE_CPUS '$NODE_CPUS': expected split or shared" >&2; exit 2;;
esac
for m in $MODES; do
  case $m in flat|hier|hier-bf16|hier-bf16-sync|flat-bf16) ;;
    *) echo "netns-train: bad mode '$m' in MODES: expected flat, flat-bf16, hier, hier-bf16 or hier-bf16-sync" >&2; exit 2;;
  esac
  if [ -n "$PHASES" ] && [ "$m" = hier-bf16-sync ]; then
    echo "netns-train: bad mode 'hier-bf16-sync' with PHASES=1: expected flat, flat-bf16, hier or hier-bf16" >&2; exit 2
  fi
done

PIDS=()
delete_all() {
  for i in $(seq 0 $((MAXN - 1))); do ip netns del "tune-n$i" 2>/dev/null; done
  ip netns del "$SW" 2>/dev/null
}
cleanup() {
  set +e
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  sleep 0.5
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
  delete_all
}
trap cleanup EXIT INT TERM

delete_all || true  # a previous run killed hard may have left them behind
ip netns add "$SW"
ip -n "$SW" link add br0 type bridge
ip -n "$SW" link set br0 up
for i in $(seq 0 $((MAXN - 1))); do
  ns=tune-n$i
  ip netns add "$ns"
  ip link add eth0 netns "$ns" type veth peer name "p$i" netns "$SW"
  ip -n "$SW" link set "p$i" master br0
  ip -n "$SW" link set "p$i" up
  ip -n "$ns" addr add "10.231.9.$((i + 1))/24" dev eth0
  ip -n "$ns" link set lo up
  ip -n "$ns" link set eth0 up
  # both directions of the node's link: its egress, and the switch port's egress toward it
  ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "$RATE" burst 256kb latency 50ms
  ip netns exec "$SW" tc qdisc add dev "p$i" root tbf rate "$RATE" burst 256kb latency 50ms
done
echo "link per node: $(ip netns exec tune-n0 tc qdisc show dev eth0)"
mkdir -p "$OUT"
# nsenter keeps the host's /sys (ip netns exec remounts it); only the network is switched.
in_ns() { local ns=$1; shift; nsenter --net="/run/netns/$ns" "$@"; }

mode_args() {
  case $1 in
    flat) echo "comm=flat" ;;
    flat-bf16) echo "comm=flat comm.compression=bf16" ;;
    hier) echo "comm=hierarchical" ;;
    hier-bf16) echo "comm=hierarchical comm.compression=bf16" ;;
    hier-bf16-sync) echo "comm=hierarchical comm.compression=bf16 comm.overlap=false" ;;
  esac
}
# the same mode as ddp_phases.py options, read off the trainer overrides above
phase_args() {
  local w
  for w in $(mode_args "$1"); do
    case $w in
      comm=*) echo -n " --comm ${w#comm=}" ;;
      comm.compression=*) echo -n " --compression ${w#comm.compression=}" ;;
    esac
  done
}

# the CPUs this script may use, and those node $1 of $2 runs on (a taskset list)
read -r -a CPUS <<<"$("$PYTHON" -c 'import os; print(*sorted(os.sched_getaffinity(0)))')"
node_cpus() {
  local k=$((${#CPUS[@]} / $2))
  local IFS=,
  if [ "$NODE_CPUS" = shared ] || [ "$k" -lt 1 ]; then echo "${CPUS[*]}"; else echo "${CPUS[*]:$(($1 * k)):$k}"; fi
}

port=29700
for shape in $SHAPES; do
  N=${shape%x*}; G=${shape#*x}
  rm -rf "${OUT:?}/$shape"  # this run's rounds only in the summary below
  echo "$shape: node CPUs $(for i in $(seq 0 $((N - 1))); do echo -n "n$i=$(node_cpus "$i" "$N") "; done)"
  read -r -a modes <<<"$MODES"
  k=${#modes[@]}
  for r in $(seq 0 $((ROUNDS - 1))); do
    for j in $(seq 0 $((k - 1))); do
      mode=${modes[$(((j + r) % k))]}
      port=$((port + 1))
      dir="$OUT/$shape/$mode.r$r"
      rm -rf "$dir"
      common=(--nnodes "$N" --nproc-per-node "$G" --master-addr 10.231.9.1 --master-port "$port" --binding none)
      if [ -n "$PHASES" ]; then
        # shellcheck disable=SC2046
        common+=("$HERE/scripts/ddp_phases.py" $(phase_args "$mode") --steps "$STEPS" --batch-per-rank "$BATCH_PER_RANK" $PHASES_ARGS)
      else
        # shellcheck disable=SC2046
        common+=("$HERE/scripts/train.py" parallel=ddp $MODEL $(mode_args "$mode") trainer.steps="$STEPS"
                 trainer.batch_size="$((N * G * BATCH_PER_RANK))" trainer.log_interval=1 trainer.progress=false "hydra.run.dir=$dir" $EXTRA)
      fi
      node_pids=()
      for i in $(seq 1 $((N - 1))); do
        in_ns "tune-n$i" env GLOO_SOCKET_IFNAME=eth0 OMP_NUM_THREADS=1 taskset -c "$(node_cpus "$i" "$N")" timeout "$TIMEOUT" \
          "$NUMARUN" --node-rank "$i" "${common[@]}" >"$OUT/$shape.$mode.r$r.node$i.log" 2>&1 &
        PIDS+=($!); node_pids+=($!)
      done
      rc=0
      in_ns tune-n0 env GLOO_SOCKET_IFNAME=eth0 OMP_NUM_THREADS=1 taskset -c "$(node_cpus 0 "$N")" timeout "$TIMEOUT" \
        "$NUMARUN" --node-rank 0 "${common[@]}" >"$OUT/$shape.$mode.r$r.node0.log" 2>&1 || rc=$?
      for p in "${node_pids[@]}"; do wait "$p" || rc=$?; done
      [ "$rc" = 0 ] || { echo "netns-train: $shape $mode failed (rc $rc); logs in $OUT" >&2; tail -n 20 "$OUT/$shape.$mode.r$r".node*.log >&2; exit 1; }
      if [ -n "$PHASES" ]; then
        echo "$shape round $r $(grep -h '^PHASES' "$OUT/$shape.$mode.r$r".node*.log)"
        echo "$shape round $r $(grep -h '^CPUS' "$OUT/$shape.$mode.r$r".node*.log)"
        continue
      fi
      "$PYTHON" -c 'import sys; from numarun.tune.measure import from_metrics; m = from_metrics(open(sys.argv[1]).read()); print(f"{sys.argv[2]} round {sys.argv[3]} {sys.argv[4]:15s} {m.throughput:8.0f} {m.unit}")' \
        "$dir/metrics.jsonl" "$shape" "$r" "$mode"
    done
  done
done

[ -z "$PHASES" ] || exit 0
"$PYTHON" - "$OUT" "$MODES" $SHAPES <<'EOF2'
import statistics, sys
from pathlib import Path
from numarun.tune.measure import from_metrics
out, modes, shapes = Path(sys.argv[1]), sys.argv[2].split(), sys.argv[3:]
print()
print("| shape | mode | tokens/s per round | median | vs flat |")
print("|---|---|---|---|---|")
for shape in shapes:
    med = {}
    for mode in modes:
        runs = sorted((out / shape).glob(f"{mode}.r*/metrics.jsonl"))
        tps = [from_metrics(p.read_text()).throughput for p in runs]
        med[mode] = (statistics.median(tps), tps)
    base = med.get("flat", (None,))[0]
    for mode in modes:
        m, tps = med[mode]
        ratio = f"{m / base:.2f}x" if base else "-"
        print(f"| {shape} | {mode} | {', '.join(f'{t:.0f}' for t in tps)} | {m:.0f} | {ratio} |")
EOF2
