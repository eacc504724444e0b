"""The variables schedulers set in a task's environment, as recorded from them: for tests that read a job's shape."""

from __future__ import annotations


def slurm_env(
    node: int = 0,
    *,
    nodes: str = "node[1,3]",
    names=("node1", "node3"),
    per_node: int = 1,
    local: int = 0,
    job: str = "1234",
    step: str = "0",
    **extra,
) -> dict[str, str]:
    """A task's Slurm variables as srun sets them (recorded from `srun ... env` on the test cluster)."""
    n = len(names)
    env = {
        "SLURM_JOB_ID": job,
        "SLURM_JOBID": job,
        "SLURM_STEP_ID": step,
        "SLURM_STEPID": step,
        "SLURM_JOB_NODELIST": nodes,
        "SLURM_STEP_NODELIST": nodes,
        "SLURM_NODELIST": nodes,
        "SLURM_JOB_NUM_NODES": str(n),
        "SLURM_NNODES": str(n),
        "SLURM_STEP_NUM_NODES": str(n),
        "SLURM_STEP_NUM_TASKS": str(n * per_node),
        "SLURM_NTASKS": str(n * per_node),
        "SLURM_STEP_TASKS_PER_NODE": f"{per_node}(x{n})",
        "SLURM_TASKS_PER_NODE": f"{per_node}(x{n})",
        "SLURM_NODEID": str(node),
        "SLURMD_NODENAME": names[node],
        "SLURM_LOCALID": str(local),
        "SLURM_PROCID": str(node * per_node + local),
        "SLURM_TOPOLOGY_ADDR": f"s0.s1.{names[node]}",
    }
    env.update(extra)
    return env
