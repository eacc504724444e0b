"""numarun's one /proc reader (numarun.topology.procfs) on recorded trees: a rank sharing its core with a spinner
(tests/fixtures/steps/shared-core, made by its capture.py), and hand-made entries."""

from __future__ import annotations

import json
from pathlib import Path

from helpers import FIXTURES

from numarun.launch.steps import evidence
from numarun.topology import procfs
from numarun.worker.binding_watch import parse_numa_maps

SHARED = FIXTURES / "steps" / "shared-core"
PIDS: dict[str, int] = json.loads((SHARED / "about.json").read_text())["pids"]


def test_a_stat_line_is_read_whatever_the_command_holds() -> None:
    line = (
        "4242 (a (b) c) R 7 4242 4242 0 -1 4194304 1 0 0 0 150 25 0 0 20 0 1 0 5 1 1 1 1 1 1 0 0 0 0 0 0 0 0 0 17 3 0 0"
    )
    stat = procfs.parse_stat(line + " 0 0 0 0 0 0 0 0 0 0 0\n")
    assert stat is not None and (stat.pid, stat.comm, stat.state, stat.ppid) == (4242, "a (b) c", "R", 7)
    assert (stat.ticks, stat.cpu, stat.start) == (175, 3, 5)
    assert procfs.parse_stat("not a stat line") is None
    short = procfs.parse_stat("1 (x) R 0")  # a line cut short: what it holds
    assert short is not None and (short.ppid, short.ticks, short.cpu) == (0, 0, -1)


def test_the_readers_on_a_recorded_proc_tree() -> None:
    root = SHARED / "t0"
    procs = procfs.read_all(root)
    assert set(procs) == set(PIDS.values())
    assert procs[PIDS["worker"]].ppid == PIDS["rank"] and procs[PIDS["spinner"]].cpu == 1
    assert procfs.tree_of(procs, [PIDS["rank"]]) == {PIDS["worker"]}
    threads = procfs.read_schedstat(PIDS["rank"], root)
    assert list(threads) == [PIDS["rank"]] and all(v > 0 for v in threads[PIDS["rank"]])
    ticks = evidence.read_cpu_ticks(root)
    assert set(ticks) == {0, 1} and all(total > steal >= 0 for total, steal in ticks.values())
    assert procfs.read_cmdline(PIDS["spinner"], root) == "python3 -c while True: pass"
    assert procfs.read_status(PIDS["spinner"], "Cpus_allowed_list", root) == "1"
    assert sum(parse_numa_maps(procfs.read_numa_maps_or_why(PIDS["rank"], root)[0]).values()) > 0
    assert evidence.read_mhz(root, 0) == (None, None) and evidence.read_throttle(root, 0) is None  # a VM
    assert procfs.read_schedstat(1, root) == {} and procfs.read_cmdline(1, root, fallback="gone") == "gone"
    assert procfs.alive(PIDS["rank"], root) and not procfs.alive(1, root)


def test_the_environment_a_process_started_with(tmp_path: Path) -> None:
    (tmp_path / "proc" / "7").mkdir(parents=True)
    (tmp_path / "proc" / "7" / "environ").write_bytes(b"A=1\0NCCL_IB_HCA==mlx5_3\0EMPTY=\0")
    assert procfs.read_environ(7, tmp_path) == {"A": "1", "NCCL_IB_HCA": "=mlx5_3", "EMPTY": ""}
    assert procfs.read_environ(8, tmp_path) == {}


def test_what_a_restricted_proc_hides_and_what_it_still_says(tmp_path: Path) -> None:
    """The recorded hidepid tree (tests/fixtures/steps/capture_restricted.py) hides the spinner, another user's, and
    says why; thread times come from stat where schedstat is missing; an unreadable file says why."""
    restricted = FIXTURES / "steps" / "restricted"
    hidden = json.loads((restricted / "hidepid" / "about.json").read_text())
    assert hidden["hidden"] == ["spinner"] and hidden["pids"]["spinner"] not in procfs.read_all(
        restricted / "hidepid/t0"
    )
    assert procfs.hidden_processes(restricted / "hidepid" / "t0") == "/proc is mounted with hidepid=invisible"
    assert procfs.hidden_processes(restricted / "open" / "t0") == ""
    for options, said in (
        ("rw,hidepid=2", "hidepid=2"),
        ("rw,hidepid=0", ""),
        ("rw,hidepid=noaccess", "hidepid=noaccess"),
    ):
        (tmp_path / "proc" / "self").mkdir(parents=True, exist_ok=True)
        (tmp_path / "proc" / "self" / "mounts").write_text(f"proc /proc proc {options} 0 0\n")
        assert procfs.hidden_processes(tmp_path) == (f"/proc is mounted with {said}" if said else "")
    rank = json.loads((restricted / "open" / "about.json").read_text())["pids"]["rank"]
    ticks = procfs.read_thread_ticks(rank, restricted / "open" / "t1")
    assert list(ticks) == [rank] and ticks[rank] > 0
    assert procfs.read_or_why(tmp_path / "nope") == (None, "No such file or directory")
    assert procfs.read_numa_maps_or_why(rank, restricted / "open" / "t0")[1] == ""
