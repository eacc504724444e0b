"""What a job's tasks need from slurmctld: the leaf switches and the nodes' addresses.

``numarun submit``'s batch script asks once for the whole job (``scontrol show topology`` and
``scontrol -o show node <nodelist>``) and hands the answers to every node's task in a directory
named by ``NUMARUN_SLURM_INFO`` (files ``topology`` and ``nodes``): a job of any size makes two
controller calls at its start. A task started by the user's own sbatch script has no such
directory: it asks only for what it cannot learn otherwise, the switch map (one call, and only
for per-node mode without ``--node-rank``) and the head's ``NodeAddr`` (one call, and only when
the head's name does not resolve on this node).
"""

from __future__ import annotations

import logging
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..envvars import SLURM_INFO
from ..errors import ControllerError
from ..jobenv.slurm import parse_leaf_switches, parse_node_addrs
from .net import resolve

log = logging.getLogger(__name__)

SCONTROL_TIMEOUT_S = 30.0
"""Bound on every ``scontrol`` call from a node (a wedged slurmctld must not hang the job)."""
INFO_LIMIT = 64 << 20


def scontrol(*args: str, timeout: float = SCONTROL_TIMEOUT_S) -> str | None:
    """Output of ``scontrol ARGS``; None when scontrol is missing, fails or does not answer in time."""
    try:
        proc = subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        log.warning("'scontrol %s' did not answer within %.0f s", " ".join(args), timeout)
        return None
    except OSError:
        return None
    return proc.stdout if proc.returncode == 0 else None


@dataclass(frozen=True)
class SlurmFacts:
    """The controller's answers a task uses."""

    leaf_switch: dict[str, str] | None = None
    """Node -> its leaf switch; None when not asked for."""
    addrs: dict[str, str] = field(default_factory=dict)
    """Node -> NodeAddr (what was learned: every node from the handed-over file, else the head only)."""


def _read(path: Path) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read(INFO_LIMIT).decode("utf-8", "replace")
    except OSError:
        return None


def handed_over(environ: Mapping[str, str]) -> SlurmFacts | None:
    """The batch script's answers (``NUMARUN_SLURM_INFO``), or None when there are none to read."""
    directory = environ.get(SLURM_INFO)
    if not directory:
        return None
    topology, nodes = _read(Path(directory) / "topology"), _read(Path(directory) / "nodes")
    if nodes is None:
        log.warning("%s=%s holds no readable 'nodes' file: asking Slurm instead", SLURM_INFO, directory)
        return None
    return SlurmFacts(leaf_switch=parse_leaf_switches(topology or ""), addrs=parse_node_addrs(nodes))


def gather(environ: Mapping[str, str], *, need_switches: bool, head: str | None) -> SlurmFacts:
    """The facts this task needs: the handed-over ones, else at most two ``scontrol`` calls.

    The switch map must be the same on every node (it decides node ranks), so a controller that
    does not answer is an error, not a silent fallback to Slurm's order on some nodes only.
    """
    given = handed_over(environ)
    if given is not None:
        return given
    leaf: dict[str, str] | None = None
    if need_switches:
        text = scontrol("show", "topology")
        if text is None and shutil.which("scontrol") is not None:
            raise ControllerError(
                "'scontrol show topology' did not answer: the node order (by leaf switch) cannot be known the same "
                'on every node; expected slurmctld to answer, or --node-rank "$SLURM_NODEID" (quoted) to use Slurm\'s '
                "order"
            )
        leaf = parse_leaf_switches(text or "")
    addrs: dict[str, str] = {}
    if head and not resolve(head, flag=None, timeout=2.0):
        found = parse_node_addrs(scontrol("show", "node", head) or "")
        if head in found:
            addrs[head] = found[head]
    return SlurmFacts(leaf_switch=leaf, addrs=addrs)


def head_address(facts: SlurmFacts, head: str) -> str:
    """The head's NodeAddr when known, else its name (it resolves, or nothing better is known)."""
    return facts.addrs.get(head) or head


def head_addr(environ: Mapping[str, str], head: str) -> str:
    """The head's address alone: handed over, else its name when it resolves, else one ``scontrol`` call."""
    return head_address(gather(environ, need_switches=False, head=head), head)
