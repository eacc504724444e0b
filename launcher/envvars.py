"""The environment contract between the launcher, the worker bootstrap, the trainer and the sbatch script:
every ``NUMARUN_*`` variable one side sets and another reads (pure constants, no imports)."""

from __future__ import annotations

PLAN = "NUMARUN_PLAN"  # path of the LaunchPlan JSON every worker reads
STRICT_BINDING = "NUMARUN_STRICT_BINDING"  # 1: a binding failure is fatal for the worker
# plan variables the user set, comma-separated, which the bootstrap keeps; unset (started by hand): all set ones are
# kept
USER_ENV = "NUMARUN_USER_ENV"
LOG_LEVEL = "NUMARUN_LOG_LEVEL"  # of the bootstrap's own lines (default INFO)
FULL_EXIT = "NUMARUN_FULL_EXIT"  # 1: workers leave through the interpreter's full teardown, not os._exit
CONFIG = "NUMARUN_CONFIG"  # path of the composed job config the trainer's ranks read
CONFIG_DIR = "NUMARUN_CONFIG_DIR"  # a config directory to compose from instead of the packaged one
RUN_DIR = "NUMARUN_RUN_DIR"  # the job's run directory, shared by every rank and node
HYDRA_NOW = "NUMARUN_HYDRA_NOW"  # ISO time behind Hydra's ${now:} in every rank (set once): one run dir for all
TOPOLOGY = "NUMARUN_TOPOLOGY"  # a topology source instead of the live machine
REPORT = "NUMARUN_REPORT"  # the file numarun.report(samples=N) appends a JSON line to (set by numarun tune)

HANG_SAMPLE = "NUMARUN_HANG_SAMPLE"  # seconds between a rank's progress samples, set by numarun for its ranks (0: none)
STEPS = "NUMARUN_STEPS"  # 1: a rank records where each of its steps' time goes (set by numarun: --step-report)
# seconds between the step report's looks at the ranks (the agent reads it from its own environment; default 5)
STEP_INTERVAL = "NUMARUN_STEP_INTERVAL"
WATCH_INTERVAL = "NUMARUN_WATCH_INTERVAL"  # seconds between the binding watcher's checks (0: off; unset: 30)
TAR_MAX_BYTES = "NUMARUN_TAR_MAX_BYTES"  # cap on a topology tarball's extracted bytes (default 1 GiB)
TAR_MAX_MEMBERS = "NUMARUN_TAR_MAX_MEMBERS"  # cap on its members (default 200,000)
LAUNCHER_PID = "NUMARUN_LAUNCHER_PID"  # the numarun that started the worker; a worker whose parent is not it ends
STATE_DIR = "NUMARUN_STATE_DIR"  # numarun's private directory for this run (0700, removed on exit): workers' exits
SLURM_TIMEOUT = "NUMARUN_SLURM_TIMEOUT"  # seconds each Slurm client call of numarun submit may take (default 60)
# a directory of the job's `scontrol show topology` (topology) and `scontrol -o show node` (nodes), written once by the
# batch script for every node's task
SLURM_INFO = "NUMARUN_SLURM_INFO"
RDZV_MARGIN = (
    "NUMARUN_RDZV_MARGIN"  # seconds past torch's rendezvous timeout before a hung rendezvous ends (default 15)
)
READY_FD = "NUMARUN_READY_FD"  # a pipe numarun writes a byte to once its signal handlers are in place
INIT = "NUMARUN_INIT"  # 1: this numarun's parent is numarun as PID 1, which reaps orphans (so this one is no subreaper)
DETECT = "NUMARUN_DETECT"  # 0: do not read the job's shape from a scheduler's environment (--no-detect)
PLAN_JSON = "NUMARUN_PLAN_JSON"  # the plan itself when there is no plan file (per-rank mode)
# per-rank mode: the port node 0's node agent (the sidecar) serves the agents' store on (default MASTER_PORT + 1)
AGENT_PORT = "NUMARUN_AGENT_PORT"
SIDECAR = "NUMARUN_SIDECAR"  # per-rank mode, the node's first task: its sidecar's pid, which it waits for at its exit
SWEEP_OPTIONS = "NUMARUN_SWEEP_OPTIONS"  # JSON list of the numarun run options given to numarun SCRIPT -m, for each job
# the parallel layout (--mesh): the option's variable, and in every rank the layout with each size known (pp=2,tp=4)
MESH = "NUMARUN_MESH"
MESH_NAMES = "NUMARUN_MESH_NAMES"  # in every rank of a job with a layout: its names, outermost first (pp,dp_shard,tp)
MESH_SHAPE = "NUMARUN_MESH_SHAPE"  # in every rank of a job with a layout: its sizes in that order (2,2,4)
MESH_PP = "NUMARUN_MESH_PP"  # in every rank of a job with a layout: the pp degree (1 when the layout does not name it)
MESH_DP_REPLICATE = "NUMARUN_MESH_DP_REPLICATE"  # the same for dp_replicate
MESH_DP_SHARD = "NUMARUN_MESH_DP_SHARD"  # the same for dp_shard
MESH_CP = "NUMARUN_MESH_CP"  # the same for cp
MESH_TP = "NUMARUN_MESH_TP"  # the same for tp
# a key the user gives each node (its rack, its leaf switch): under c10d with a layout, nodes take node ranks in key
# order (after their multi-node NVLink domain, before their place in Slurm's order)
NODE_KEY = "NUMARUN_NODE_KEY"

ALL: tuple[str, ...] = tuple(  # every variable above
    v for k, v in sorted(globals().items()) if k.isupper() and isinstance(v, str) and v.startswith("NUMARUN_")
)
