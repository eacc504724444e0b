#!/bin/bash
# Rendered by 'numarun submit' from launcher/slurm/templates/sbatch.sh.in.
# One srun task per node owns that node's CPUs and GPUs; 'numarun slurm-node task' runs numarun
# there, which finds the step it is part of (node rank in Slurm's node order, the head's NodeAddr,
# the port), discovers the node's own topology inside the job's cgroup and binds its ranks.
# Every user value is shell-quoted.
# Requested: 1 whole node (--exclusive): every CPU, 2 GPUs
#SBATCH --job-name=numarun
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=2
#SBATCH --partition=gpu
#SBATCH --exclusive
#SBATCH --time=01:00:00
#SBATCH --output=<cwd>/sweep/.numarun/slurm/slurm-%A_%a.out
#SBATCH --open-mode=append
#SBATCH --signal=B:USR1@120
#SBATCH --requeue
#SBATCH --array=0-2

set -uo pipefail

# --- values from 'numarun submit' (quoted) ---
numarun=(<bin>/numarun)
script=numarun.sweep.job
case "${SLURM_ARRAY_TASK_ID:-}" in
  0) args=(index=0 <cwd>/sweep/.numarun) ;;
  1) args=(index=1 <cwd>/sweep/.numarun) ;;
  2) args=(index=2 <cwd>/sweep/.numarun) ;;
  *) echo "numarun: error: array index '${SLURM_ARRAY_TASK_ID:-}' not in 0-2" >&2; exit 2 ;;
esac
launch_opts=(--nproc-per-node 1 --shutdown-timeout 105 --module)
requeue_limit=3
output_root=<cwd>/sweep/.numarun/slurm
hydra_run_dir=0
export NUMARUN_HYDRA_NOW=2020-01-02T03:04:05
# --- from here on, only Slurm's own variables are expanded ---

job_key=${SLURM_ARRAY_JOB_ID:+${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}}
job_key=${job_key:-$SLURM_JOB_ID}
# Keyed on the job id, which a requeued job keeps: the restarted run finds its checkpoint.
run_dir="$output_root/$job_key"
mkdir -p -- "$run_dir" || { echo "numarun: error: cannot create run dir '$run_dir'" >&2; exit 2; }
export NUMARUN_RUN_DIR="$run_dir"
[ "$hydra_run_dir" = 1 ] && args+=("hydra.run.dir=$run_dir")
rm -f -- "$run_dir"/.numarun-node*.exit

# Ask Slurm once for the whole job (the leaf switches, every node's NodeAddr) and hand the answers
# to every node's task: two controller calls per job start, whatever the node count.
info="$run_dir/.numarun-slurm"
if mkdir -p -- "$info" && timeout 60 scontrol -o show node "$SLURM_JOB_NODELIST" >"$info/nodes.tmp" 2>/dev/null; then
  timeout 60 scontrol show topology >"$info/topology" 2>/dev/null || : >"$info/topology"
  mv -f -- "$info/nodes.tmp" "$info/nodes" && export NUMARUN_SLURM_INFO="$info"
fi

# Slurm 22.05-23.02 srun does not inherit --cpus-per-task from sbatch: restate it (a whole-node
# job: the smallest node's CPU count, from SLURM_JOB_CPUS_PER_NODE such as '64(x2),32').
cpus=${SLURM_CPUS_PER_TASK:-$(tr ',' '\n' <<<"${SLURM_JOB_CPUS_PER_NODE:-1}" | sed 's/(.*//' | sort -n | head -n1)}

# Slurm sends USR1 to this shell only (--signal=B:USR1) '--signal-before' seconds before the
# time limit: pass TERM to every process of the job's steps (numarun and its ranks; the trainer
# checkpoints within the grace numarun was given), wait, then requeue. Not 'kill srun': srun
# answers TERM by killing its tasks at once. A requeue or scancel sends TERM to the steps
# itself, so the shell only keeps waiting for them.
preempted=0
step_pid=
on_usr1() {
  preempted=1
  timeout 30 scancel --signal=TERM "$SLURM_JOB_ID" || { [ -n "$step_pid" ] && kill -TERM "$step_pid"; }
}
trap on_usr1 USR1
trap : TERM

srun --ntasks-per-node=1 --nodes="$SLURM_NNODES" --cpus-per-task="$cpus" --kill-on-bad-exit=1 \
  "${numarun[@]}" slurm-node task --run-dir "$run_dir" --job-key "$job_key" \
  run "${launch_opts[@]}" "$script" "${args[@]}" &
step_pid=$!
# wait returns early (>128) when a trapped signal arrives; keep waiting for the step.
while wait "$step_pid"; rc=$?; kill -0 "$step_pid" 2>/dev/null; do :; done
wait "$step_pid" 2>/dev/null; last=$?; [ "$last" -ne 127 ] && rc=$last
exec "${numarun[@]}" slurm-node finish --run-dir "$run_dir" --rc "$rc" --preempted "$preempted" \
  --restart-count "${SLURM_RESTART_COUNT:-0}" --requeue-limit "$requeue_limit"
