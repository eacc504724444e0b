"""torchrun's launch options as data, so ``numarun run --help`` need not import torch.

Importing ``torch.distributed.run`` for its parser costs about 2 s; a help screen should not.
``OPTIONS`` is a record of ``torch.distributed.run.get_args_parser()`` for
``TORCH_VERSION``; :func:`help_parser` rebuilds a parser with the same options, help and
defaults, used for ``--help`` only, and only while the installed torch is that version
(read from torch's ``version.py`` without importing torch). Parsing a real command line
always uses torchrun's own parser. ``tests/test_cli_startup.py`` checks the record against
the installed torch; ``NUMARUN_REGEN_GOLDEN=1`` rewrites it (:func:`render_module`).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
from pathlib import Path
from typing import Any

TORCH_VERSION = "2.13.0+cpu"
OPTIONS: tuple[dict[str, Any], ...] = tuple(
    json.loads(r"""
[
 {
  "option_strings": [
   "--nnodes"
  ],
  "dest": "nnodes",
  "nargs": null,
  "default": "1:1",
  "help": "Number of nodes, or the range of nodes in form <minimum_nodes>:<maximum_nodes>.",
  "metavar": null,
  "choices": null,
  "required": false
 },
 {
  "option_strings": [
   "--nproc-per-node",
   "--nproc_per_node"
  ],
  "dest": "nproc_per_node",
  "nargs": null,
  "default": "1",
  "help": "Number of workers per node; supported values: [auto, cpu, gpu, xpu, int].",
  "metavar": null,
  "choices": null,
  "required": false
 },
 {
  "option_strings": [
   "--rdzv-backend",
   "--rdzv_backend"
  ],
  "dest": "rdzv_backend",
  "nargs": null,
  "default": "static",
  "help": "Rendezvous backend.",
  "metavar": null,
  "choices": null,
  "required": false
 },
 {
  "option_strings": [
   "--rdzv-endpoint",
   "--rdzv_endpoint"
  ],
  "dest": "rdzv_endpoint",
  "nargs": null,
  "default": "",
  "help": "Rendezvous backend endpoint; usually in form <host>:<port>.",
  "metavar": null,
  "choices": null,
  "required": false
 },
 {
  "option_strings": [
   "--rdzv-id",
   "--rdzv_id"
  ],
  "dest": "rdzv_id",
  "nargs": null,
  "default": "none",
  "help": "User-defined group id.",
  "metavar": null,
  "choices": null,
  "required": false
 },
 {
  "option_strings": [
   "--rdzv-conf",
   "--rdzv_conf"
  ],
  "dest": "rdzv_conf",
  "nargs": null,
  "default": "",
  "help": "Additional rendezvous configuration (<key1>=<value1>,<key2>=<value2>,...).",
  "metavar": null,
  "choices": null,
  "required": false
 },
 {
  "option_strings": [
   "--standalone"
  ],
  "dest": "standalone",
  "nargs": 0,
  "default": false,
  "help": "Start a local standalone rendezvous backend that is represented by a C10d TCP store on a free port. Useful when launching single-node, multi-worker job. If specified --rdzv-backend, --rdzv-endpoint, --rdzv-id are auto-assigned and any explicitly set values are ignored.",
  "metavar": null,
  "choices": null,
  "required": false
 },
 {
  "option_strings": [
   "--max-restarts",
   "--max_restarts"
  ],
  "dest": "max_restarts",
  "nargs": null,
  "default": 0,
  "help": "Maximum number of worker group restarts before failing.",
  "metavar": null,
  "choices": null,
  "required": false
 },
 {
  "option_strings": [
   "--monitor-interval",
   "--monitor_interval"
  ],
  "dest": "monitor_interval",
  "nargs": null,
  "default": 0.1,
  "help": "Interval, in seconds, to monitor the state of workers.",
  "metavar": null,
  "choices": null,
  "required": false
 },
 {
  "option_strings": [
   "--start-method",
   "--start_method"
  ],
  "dest": "start_method",
  "nargs": null,
  "default": "spawn",
  "help": "Multiprocessing start method to use when creating workers.",
  "metavar": null,
  "choices": [
   "spawn",
   "fork",
   "forkserver"
  ],
  "required": false
 },
 {
  "option_strings": [
   "--event-log-handler",
   "--event_log_handler"
  ],
  "dest": "event_log_handler",
  "nargs": null,
  "default": "null",
  "help": "name of a registered event logging handler (see: https://docs.pytorch.org/docs/stable/elastic/events.html)",
  "metavar": null,
  "choices": null,
  "required": false
 },
 {
  "option_strings": [
   "--role"
  ],
  "dest": "role",
  "nargs": null,
  "default": "default",
  "help": "User-defined role for the workers.",
  "metavar": null,
  "choices": null,
  "required": false
 },
 {
  "option_strings": [
   "-m",
   "--module"
  ],
  "dest": "module",
  "nargs": 0,
  "default": false,
  "help": "Change each process to interpret the launch script as a Python module, executing with the same behavior as 'python -m'.",
  "metavar": null,
  "choices": null,
  "required": false
 },
 {
  "option_strings": [
   "--no-python",
   "--no_python"
  ],
  "dest": "no_python",
  "nargs": 0,
  "default": false,
  "help": "Skip prepending the training script with 'python' - just execute it directly. Useful when the script is not a Python script.",
  "metavar": null,
  "choices": null,
  "required": false
 },
 {
  "option_strings": [
   "--run-path",
   "--run_path"
  ],
  "dest": "run_path",
  "nargs": 0,
  "default": false,
  "help": "Run the training script with runpy.run_path in the same interpreter. Script must be provided as an abs path (e.g. /abs/path/script.py). Takes precedence over --no-python.",
  "metavar": null,
  "choices": null,
  "required": false
 },
 {
  "option_strings": [
   "--log-dir",
   "--log_dir"
  ],
  "dest": "log_dir",
  "nargs": null,
  "default": null,
  "help": "Base directory to use for log files (e.g. /var/log/torch/elastic). The same directory is reused for multiple runs (a unique job-level sub-directory is created with rdzv_id as the prefix).",
  "metavar": null,
  "choices": null,
  "required": false
 },
 {
  "option_strings": [
   "-r",
   "--redirects"
  ],
  "dest": "redirects",
  "nargs": null,
  "default": "0",
  "help": "Redirect std streams into a log file in the log directory (e.g. [-r 3] redirects both stdout+stderr for all workers, [-r 0:1,1:2] redirects stdout for local rank 0 and stderr for local rank 1).",
  "metavar": null,
  "choices": null,
  "required": false
 },
 {
  "option_strings": [
   "-t",
   "--tee"
  ],
  "dest": "tee",
  "nargs": null,
  "default": "0",
  "help": "Tee std streams into a log file and also to console (see --redirects for format).",
  "metavar": null,
  "choices": null,
  "required": false
 },
 {
  "option_strings": [
   "--local-ranks-filter",
   "--local_ranks_filter"
  ],
  "dest": "local_ranks_filter",
  "nargs": null,
  "default": "",
  "help": "Only show logs from specified ranks in console (e.g. [--local_ranks_filter=0,1,2] will only show logs from rank 0, 1 and 2). This will only apply to stdout and stderr, not tolog files saved via --redirect or --tee",
  "metavar": null,
  "choices": null,
  "required": false
 },
 {
  "option_strings": [
   "--duplicate-stdout-filters",
   "--duplicate_stdout_filters"
  ],
  "dest": "duplicate_stdout_filters",
  "nargs": null,
  "default": [],
  "help": "Duplicates logs streamed to stdout to another specified file with a list of filters (e.g. [--duplicate_stdout_filters 'apple,orange'] will duplicate log lines matching 'apple' OR 'orange'. An empty filters list won't duplicate any lines. Use double comma to escape a comma) ",
  "metavar": null,
  "choices": null,
  "required": false
 },
 {
  "option_strings": [
   "--duplicate-stderr-filters",
   "--duplicate_stderr_filters"
  ],
  "dest": "duplicate_stderr_filters",
  "nargs": null,
  "default": [],
  "help": "Duplicates logs streamed to stderr to another specified file with a list of filters (e.g. [--duplicate_stdout_filters 'apple,orange'] will duplicate log lines matching 'apple' OR 'orange'. An empty filters list won't duplicate any lines. Use double comma to escape a comma) ",
  "metavar": null,
  "choices": null,
  "required": false
 },
 {
  "option_strings": [
   "--node-rank",
   "--node_rank"
  ],
  "dest": "node_rank",
  "nargs": null,
  "default": 0,
  "help": "Rank of the node for multi-node distributed training. It is only used for static rendezvous (i.e., when ``--rdzv-backend=static``).",
  "metavar": null,
  "choices": null,
  "required": false
 },
 {
  "option_strings": [
   "--master-addr",
   "--master_addr"
  ],
  "dest": "master_addr",
  "nargs": null,
  "default": "127.0.0.1",
  "help": "Address of the master node (rank 0) that only used for static rendezvous. It should be either the IP address or the hostname of rank 0. For single node multi-proc training the --master-addr can simply be 127.0.0.1; IPv6 should have the pattern `[0:0:0:0:0:0:0:1]`.",
  "metavar": null,
  "choices": null,
  "required": false
 },
 {
  "option_strings": [
   "--master-port",
   "--master_port"
  ],
  "dest": "master_port",
  "nargs": null,
  "default": null,
  "help": "Port on the master node (rank 0) to be used for communication during distributed training. It is only used for static rendezvous. Defaults to 29500.",
  "metavar": null,
  "choices": null,
  "required": false
 },
 {
  "option_strings": [
   "--local-addr",
   "--local_addr"
  ],
  "dest": "local_addr",
  "nargs": null,
  "default": null,
  "help": "Address of the local node. If specified, will use the given address for connection. Else, will look up the local node address instead. Else, it will be default to local machine's FQDN.",
  "metavar": null,
  "choices": null,
  "required": false
 },
 {
  "option_strings": [
   "--logs-specs",
   "--logs_specs"
  ],
  "dest": "logs_specs",
  "nargs": null,
  "default": null,
  "help": "torchrun.logs_specs group entrypoint name, value must be type of LogsSpecs. Can be used to override custom logging behavior.",
  "metavar": null,
  "choices": null,
  "required": false
 },
 {
  "option_strings": [
   "--numa-binding",
   "--numa_binding"
  ],
  "dest": "numa_binding",
  "nargs": null,
  "default": null,
  "help": "Bind worker processes to CPUs near their assigned GPUs for better performance. See torch/numa/binding.py for available modes and details.",
  "metavar": null,
  "choices": [
   "node",
   "socket",
   "exclusive",
   "core-complex"
  ],
  "required": false
 },
 {
  "option_strings": [
   "--signals-to-handle",
   "--signals_to_handle"
  ],
  "dest": "signals_to_handle",
  "nargs": null,
  "default": "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
  "help": "Comma-separated list of signals to handle and forward to subprocesses. Default: SIGTERM,SIGINT,SIGHUP,SIGQUIT. Common additional signals: SIGUSR1,SIGUSR2 (used in SLURM environments).",
  "metavar": null,
  "choices": null,
  "required": false
 },
 {
  "option_strings": [
   "--shutdown-timeout",
   "--shutdown_timeout"
  ],
  "dest": "shutdown_timeout",
  "nargs": null,
  "default": null,
  "help": "Time in seconds to wait for graceful shutdown of worker processes before sending SIGKILL. If not specified, uses TORCH_ELASTIC_SHUTDOWN_TIMEOUT environment variable or defaults to 30 seconds.",
  "metavar": null,
  "choices": null,
  "required": false
 },
 {
  "option_strings": [
   "--virtual-local-rank",
   "--virtual_local_rank"
  ],
  "dest": "virtual_local_rank",
  "nargs": 0,
  "default": false,
  "help": "Enable virtual local rank mode for workers. When enabled, LOCAL_RANK is set to 0 for all workers and CUDA_VISIBLE_DEVICES is adjusted so each worker accesses its assigned GPU at device index 0.",
  "metavar": null,
  "choices": null,
  "required": false
 },
 {
  "option_strings": [],
  "dest": "training_script",
  "nargs": null,
  "default": null,
  "help": "Full path to the (single GPU) training program/script to be launched in parallel, followed by all the arguments for the training script.",
  "metavar": null,
  "choices": null,
  "required": true
 },
 {
  "option_strings": [],
  "dest": "training_script_args",
  "nargs": "...",
  "default": null,
  "help": null,
  "metavar": null,
  "choices": null,
  "required": true
 }
]
""")
)


def installed_torch_version() -> str | None:
    """torch's ``__version__`` from its ``version.py``, without importing torch; None if absent."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    try:
        text = (Path(spec.origin).parent / "version.py").read_text()
    except OSError:
        return None
    m = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", text, re.M)
    return m.group(1) if m else None


def record(parser: argparse.ArgumentParser) -> list[dict[str, Any]]:
    """The options of ``parser`` (torchrun's) as JSON-able dicts, help action left out."""
    out = []
    for a in parser._actions:  # noqa: SLF001
        if isinstance(a, argparse._HelpAction):  # noqa: SLF001
            continue
        default = a.default if isinstance(a.default, (str, int, float, bool, list, type(None))) else None
        out.append({
            "option_strings": list(a.option_strings), "dest": a.dest, "nargs": a.nargs,
            "default": default, "help": a.help, "metavar": a.metavar,
            "choices": list(a.choices) if a.choices is not None else None, "required": a.required,
        })
    return out


def render_module(parser: argparse.ArgumentParser, torch_version: str) -> str:
    """This module's source with ``OPTIONS``/``TORCH_VERSION`` recorded from ``parser``."""
    source = Path(__file__).read_text()
    table = json.dumps(record(parser), indent=1)
    source = re.sub(r"^TORCH_VERSION = .*$", f"TORCH_VERSION = {torch_version!r}".replace("'", '"'), source, count=1, flags=re.M)
    start = source.index("json.loads(r'''\n") + len("json.loads(r'''\n")
    end = source.index("\n'''))", start)
    return source[:start] + table + source[end:]


def help_parser(*, any_version: bool = False) -> argparse.ArgumentParser | None:
    """A parser with torchrun's options, rebuilt from the record; None when the record does not fit the
    installed torch, unless ``any_version`` (per-rank mode: the options that matter there are numarun's
    and a few rendezvous ones that torchrun has kept for years; any agent option is refused anyway)."""
    if not OPTIONS or (not any_version and installed_torch_version() != TORCH_VERSION):
        return None
    parser = argparse.ArgumentParser(description="Torch Distributed Elastic Training Launcher", add_help=True)
    for o in OPTIONS:
        kw: dict[str, Any] = {"help": o["help"], "default": o["default"]}
        if o["nargs"] == 0:
            kw["action"] = "store_true" if o["default"] is not True else "store_false"
        else:
            kw.update(nargs=o["nargs"], metavar=o["metavar"], choices=o["choices"])
            if isinstance(o["default"], int) and not isinstance(o["default"], bool):
                kw["type"] = int  # as torchrun declares them (--node-rank, --master-port, --max-restarts...)
        if o["option_strings"]:
            parser.add_argument(*o["option_strings"], dest=o["dest"], required=o["required"], **kw)
        else:
            parser.add_argument(o["dest"], **kw)
    return parser
