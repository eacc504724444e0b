#!/bin/bash
# Rendered by 'numarun submit' from launcher/slurm/templates/sbatch.sh.in.
# One srun task per node owns all of that node's CPUs and GPUs; numarun runs there,
# discovers the node's own topology and binds its ranks. Every user value is shell-quoted.
#SBATCH --job-name=numarun
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --time=00:10:00
#SBATCH --output=/scratch/ada/runs/slurm-%A_%a.out
#SBATCH --open-mode=append
#SBATCH --signal=B:USR1@120
#SBATCH --requeue
#SBATCH --array=0-3

set -uo pipefail

# --- values from 'numarun submit' (quoted) ---
numarun=(/opt/numarun/.venv/bin/numarun)
script=/home/ada/proj/scripts/train.py
case "${SLURM_ARRAY_TASK_ID:-}" in
  0) args=(optim=sgd lr=0.1) ;;
  1) args=(optim=sgd lr=0.01) ;;
  2) args=(optim=adamw lr=0.1) ;;
  3) args=(optim=adamw lr=0.01) ;;
  *) echo "numarun: error: array index '${SLURM_ARRAY_TASK_ID:-}' not in 0-3" >&2; exit 2 ;;
esac
launch_opts=()
requeue_limit=3
output_root=/scratch/ada/runs
hydra_run_dir=1

# --- from here on, only Slurm's own variables are expanded ---

if [ -n "${SLURM_ARRAY_JOB_ID:-}" ]; then
  job_key="${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"
else
  job_key="$SLURM_JOB_ID"
fi
# Keyed on the job id, which a requeued job keeps: the restarted run finds its checkpoint.
run_dir="$output_root/$job_key"
mkdir -p -- "$run_dir" || { echo "numarun: error: cannot create run dir '$run_dir'" >&2; exit 2; }
export NUMARUN_RUN_DIR="$run_dir"
if [ "$hydra_run_dir" = 1 ]; then
  args+=("hydra.run.dir=$run_dir")
fi

head_node=$(scontrol show hostnames "${SLURM_JOB_NODELIST:-}" | head -n1)
if [ -z "$head_node" ]; then
  echo "numarun: error: no head node in SLURM_JOB_NODELIST='${SLURM_JOB_NODELIST:-}' (scontrol show hostnames printed nothing)" >&2
  exit 2
fi
# The rendezvous address is the head's NodeAddr: several slurmd may share one hostname, and a
# hostname can resolve to a management interface the other nodes cannot reach.
head_addr=$(scontrol show node "$head_node" | tr ' ' '\n' | sed -n 's/^NodeAddr=//p' | head -n1)
if [ -z "$head_addr" ]; then
  echo "numarun: error: no NodeAddr for head node '$head_node' (scontrol show node)" >&2
  exit 2
fi
# A port derived from the job id, so concurrent jobs sharing a head node do not collide;
# kept below Linux's ephemeral range (32768+).
port=$(( 15000 + SLURM_JOB_ID % 15000 ))
restart_count=${SLURM_RESTART_COUNT:-0}
echo "numarun: job $job_key (restart $restart_count) on ${SLURM_JOB_NODELIST}: rendezvous $head_addr:$port, run dir $run_dir"

# Slurm sends USR1 to this shell only (--signal=B:USR1) '--signal-before' seconds before the
# time limit: pass TERM to every process of the job's steps (numarun and its ranks; the
# trainer checkpoints and exits), wait, then requeue. Not 'kill srun': srun answers TERM by
# killing its tasks at once. A requeue or scancel sends TERM to the steps itself, so the
# shell only keeps waiting for them.
preempted=0
step_pid=
on_usr1() {
  preempted=1
  scancel --signal=TERM "$SLURM_JOB_ID" || { [ -n "$step_pid" ] && kill -TERM "$step_pid"; }
}
trap on_usr1 USR1
trap : TERM

cmd=("${numarun[@]}" run "${launch_opts[@]}" --nnodes "$SLURM_NNODES" --rdzv-backend c10d
     --rdzv-endpoint "$head_addr:$port" --rdzv-id "$job_key")
# Each node's task: the node rank differs per node, so it is read inside the task (single
# quotes: the batch shell passes '$SLURM_NODEID' through unexpanded); $1 = how many words of
# the command precede it. Node 0 (the head) hosts the c10d store: is_host is explicit because
# torchrun guesses it from the hostname, which the NodeAddr need not match; --local-addr is
# the node's NodeAddr for the same reason (the workers' store address comes from it). The task shell waits for numarun through any signal (Slurm signals
# every process of the step; numarun and the ranks must outlive the shell to checkpoint),
# then records a failure with its time: srun reports the largest exit code, which is often
# the TERM of a peer it killed, not the rank that failed first.
node_task='n=$1; shift
trap : TERM INT USR1 USR2 HUP
if [ "$SLURM_NODEID" = 0 ]; then is_host=true; else is_host=false; fi
node_addr=$(scontrol show node "${SLURMD_NODENAME:-}" 2>/dev/null | tr " " "\n" | sed -n "s/^NodeAddr=//p" | head -n1)
"${@:1:n}" --node-rank "$SLURM_NODEID" --rdzv-conf "is_host=$is_host" ${node_addr:+--local-addr "$node_addr"} "${@:n+1}"
rc=$?
if [ "$rc" -ne 0 ]; then echo "$(date +%s%N) $rc" > "$NUMARUN_RUN_DIR/.numarun-node$SLURM_NODEID.exit"; fi
exit "$rc"'
rm -f -- "$run_dir"/.numarun-node*.exit
srun --ntasks-per-node=1 --nodes="$SLURM_NNODES" --kill-on-bad-exit=1 \
  bash -c "$node_task" numarun-node "${#cmd[@]}" "${cmd[@]}" "$script" "${args[@]}" &
step_pid=$!
while :; do
  wait "$step_pid"
  rc=$?
  # wait returns early (>128) when a trapped signal arrives; keep waiting for the step.
  kill -0 "$step_pid" 2>/dev/null || break
done
wait "$step_pid" 2>/dev/null
rc_final=$?
[ "$rc_final" -ne 127 ] && rc=$rc_final
step_pid=
if [ "$rc" -ne 0 ]; then
  first_failure=$(cat -- "$run_dir"/.numarun-node*.exit 2>/dev/null | sort -n | head -n1)
  if [ -n "$first_failure" ]; then
    rc=${first_failure#* }
  fi
fi

if [ "$preempted" = 1 ]; then
  if [ "$restart_count" -lt "$requeue_limit" ]; then
    echo "numarun: time limit near: requeueing job $SLURM_JOB_ID (restart $((restart_count + 1)) of $requeue_limit)"
    scontrol requeue "$SLURM_JOB_ID"
    exit 0
  fi
  echo "numarun: time limit near and requeue limit $requeue_limit reached: not requeueing" >&2
fi
echo "numarun: step finished with exit code $rc"
exit "$rc"
