"""The hang watchdog's parts in one process: the counters, the sampler, the verdict, the roll-call.

The real sampler watches a real thread: a healthy loop that spends nearly all its time at one line (the
case a stack snapshot mistakes for a hang) keeps its counters moving and is never judged hung; the same
loop without its counted events is. The roll-call is read from a real faulthandler dump. The jobs
themselves (gloo ranks, two nodes, a container without ptrace) are in test_hangs_jobs.py.
"""

from __future__ import annotations

import faulthandler
import threading
import time
import types
from pathlib import Path

import pytest

from numarun.launch import hangs
from numarun.launch.hangs import HangPolicy, HangSummary, OnHang, judge, rollcall, summarize
from numarun.launch.hangs.rollcall import Frame, Stand
from numarun.worker import progress


def _stand(
    rank: int, where: str, call: str = "", package: str = "", inside: str = "", function: str = "main", **kw: object
) -> Stand:
    return Stand(
        rank, rank, 1000 + rank, where=where, function=function, call=call, package=package, inside=inside, **kw
    )  # type: ignore[arg-type]


WAIT = dict(call="all_reduce", package="torch.distributed", inside="all_reduce")


def test_the_roll_call_of_the_issue() -> None:
    stands = [_stand(r, "train.py:20", **WAIT) for r in (0, 1, 3)]
    stands.insert(2, _stand(2, "train.py:9", function="load_batch"))
    assert rollcall.lines(stands) == [
        "ranks 0,1,3 wait at train.py:20 in all_reduce (torch.distributed)",
        "rank 2 is at train.py:9 in load_batch",
        "=> rank 2 is not where the others are",
    ]


def test_two_ranks_the_one_waiting_in_a_collective_is_where_the_others_are() -> None:
    stands = [_stand(0, "train.py:9", function="load_batch"), _stand(1, "train.py:20", **WAIT)]
    assert rollcall.lines(stands)[-1] == "=> rank 0 is not where the others are"
    even = [_stand(0, "a.py:1"), _stand(1, "b.py:2")]  # two places, neither waits: no guess
    assert rollcall.lines(even)[-1] == "=> the ranks stand in 2 places, none where most are"
    same = [_stand(r, "train.py:20", **WAIT) for r in range(3)]
    assert rollcall.lines(same) == [
        "ranks 0-2 wait at train.py:20 in all_reduce (torch.distributed)",
        "=> every rank stands in the same place",
    ]


def test_exited_and_silent_ranks_and_other_nodes_are_named() -> None:
    stands = [_stand(r, "t.py:5", **WAIT, node=r // 2, host=f"h{r // 2}") for r in range(6)]
    stands[4] = Stand(4, 0, 1004, node=2, host="h2", state="exited", exit_code=0)
    stands[5] = Stand(5, 1, 1005, node=2, host="h2", state="silent", note="no dump and no sample")
    out = rollcall.lines(stands, multi_node=True)
    assert out == [
        "ranks 0-3 wait at t.py:5 in all_reduce (torch.distributed)",
        "rank 4 on node 2 (h2) has exited (code 0)",
        "rank 5 on node 2 (h2) gave no stack (no dump and no sample)",
        "=> ranks 4,5 are not where the others are",
    ]
    assert rollcall.format_ranks([7, 0, 1, 2, 3, 5, 9, 10]) == "0-3,5,7,9,10"


def test_where_a_rank_stands_skips_libraries_wrappers_and_numarun() -> None:
    roots = rollcall.library_roots()
    site = next(r for r in roots if r.endswith("site-packages"))
    frames = [
        Frame(f"{site}/torch/distributed/distributed_c10d.py", 3252, "all_reduce"),
        Frame(f"{site}/torch/distributed/c10d_logger.py", 83, "wrapper"),
        Frame(progress.__file__, 93, "collective"),
        Frame("/home/u/job/train.py", 20, "main"),
        Frame("/home/u/job/train.py", 30, "<module>"),
        Frame(str(Path(progress.__file__).with_name("bootstrap.py")), 191, "_run_file"),
    ]
    assert rollcall.locate(frames, roots, "/home/u/job") == ("train.py:20", "main", "all_reduce", "torch.distributed")
    assert rollcall.locate(frames[3:], roots, "/elsewhere") == ("/home/u/job/train.py:20", "main", "", "")
    assert rollcall.locate([Frame(threading.__file__, 331, "wait"), *frames[3:]], roots, "/home/u/job")[2:] == (
        "wait",
        "threading",
    )
    # numarun's own trainer: no user frame, numarun's frames outside its plumbing stand in
    trainer = [
        Frame(f"{site}/torch/distributed/distributed_c10d.py", 3252, "all_reduce"),
        Frame(str(Path(rollcall.NUMARUN_DIR) / "train" / "loop.py"), 120, "train_step"),
        frames[-1],
    ]
    assert rollcall.locate(trainer, roots)[:3] == (
        f"{rollcall.NUMARUN_DIR}/train/loop.py:120",
        "train_step",
        "all_reduce",
    )


def _blocked_in_load_batch(started: threading.Event, release: threading.Event) -> None:
    started.set()
    release.wait()


def test_a_real_faulthandler_dump_gives_each_thread_and_where_it_stands(tmp_path: Path) -> None:
    started, release = threading.Event(), threading.Event()
    t = threading.Thread(target=_blocked_in_load_batch, args=(started, release), name="loader")
    t.start()
    started.wait()
    try:
        path = tmp_path / "dump"
        with open(path, "w") as f:
            faulthandler.dump_traceback(file=f, all_threads=True)
    finally:
        release.set()
        t.join()
    text = path.read_text()
    threads = rollcall.parse_faulthandler(text)
    assert t.ident in threads and threading.main_thread().ident in threads
    where, function, call, package = rollcall.locate(
        threads[t.ident], rollcall.library_roots(), str(Path(__file__).parent)
    )
    assert where.startswith("test_hangs.py:") and function == "_blocked_in_load_batch"
    assert (call, package) == ("wait", "threading")
    named = rollcall.name_threads(text, {t.ident: "loader"})
    assert f'Thread 0x{t.ident:016x} "loader" (most recent call first):' in named


# ----------------------------------------------------------------------------- the counters


def test_collectives_are_counted_entered_and_left_with_the_one_the_thread_is_in() -> None:
    seen = []

    def all_reduce(tensor: object, op: object = None) -> str:
        seen.append(dict(counters.inside))
        return f"reduced {tensor}"

    def all_gather_object(out: object, obj: object) -> None:
        module.all_reduce(obj)  # nested, as torch's *_object collectives call the tensor ones

    module = types.ModuleType("fake_c10d")
    module.all_reduce, module.all_gather_object, module.get_rank = all_reduce, all_gather_object, lambda: 0
    counters = progress.Counters()
    assert set(progress.patch_c10d(module, counters)) == {"all_reduce", "all_gather_object"}
    assert progress.patch_c10d(module, counters) == []  # once only
    assert module.all_reduce("t") == "reduced t" and module.all_reduce.__name__ == "all_reduce"
    assert counters.events == 2 and counters.collectives == 1 and counters.inside == {}
    module.all_gather_object([], "o")
    me = threading.get_ident()
    assert seen[0][me] == "all_reduce" and seen[1][me] == "all_gather_object"  # the outermost is named
    assert counters.collectives == 3 and counters.events == 6
    counters.step()
    assert counters.steps == 1 and counters.events == 7


def _loop_at_one_line(stop: threading.Event, counted: progress.Counters | None, looping: threading.Event) -> None:
    looping.set()
    while not stop.is_set():
        time.sleep(0.05)  # nearly all the time here: every snapshot sees this line
        if counted is not None:
            counted.step()


@pytest.mark.parametrize("counted", [True, False], ids=["counted", "uncounted"])
def test_a_healthy_loop_at_one_line_is_told_from_a_hang_by_its_counters(counted: bool, tmp_path: Path) -> None:
    """The real sampler on a real thread that sits at time.sleep: its stack never changes between samples.
    With its events counted, it moves; without, the same loop is what a hang looks like."""
    counters = progress.Counters()
    stop, looping = threading.Event(), threading.Event()
    t = threading.Thread(target=_loop_at_one_line, args=(stop, counters if counted else None, looping))
    t.start()
    try:
        looping.wait()
        sampler = progress.HeartbeatWriter(
            tmp_path / "progress.0", {"pid": 1, "local_rank": 0}, interval=1, counters=counters, main=t.ident
        )
        first = sampler.sample()
        changes = []
        deadline = time.monotonic() + 30
        while len(changes) < 12 and time.monotonic() < deadline:
            time.sleep(0.1)
            beat = sampler.sample()
            changes.append(beat["changed"])
    finally:
        stop.set()
        t.join()
    assert beat["frames"][0][2] == "_loop_at_one_line" and first["frames"]
    assert len(set(changes)) <= 2  # the stack stood still (a sample may have caught the loop between lines)
    summary = summarize({0: {**beat, "world": 1, "local_world": 1}}, time.monotonic(), live=lambda pid: True)
    assert summary is not None
    verdict = judge([summary], 0.5)  # a fraction of the sampled second: nothing but the counters can have moved
    assert verdict.hung is (not counted), (verdict, beat["moved"], beat["changed"])


def test_the_heartbeat_file_holds_what_the_agent_reads(tmp_path: Path) -> None:
    s = progress.HeartbeatWriter(
        tmp_path / "progress.3", {"pid": 42, "local_rank": 3, "rank": 7, "group": 0}, interval=1
    )
    s.sample()
    beats = hangs.read_beats(tmp_path)
    assert list(beats) == [3] and beats[3]["rank"] == 7 and beats[3]["frames"]
    assert beats[3]["frames"][0][2] == "sample" and "MainThread" in beats[3]["threads"].values()


# ----------------------------------------------------------------------------- the verdict


def _summary(
    node: int = 0, *, quiet: float, still: float, nodes: int = 1, ranks: int = 2, live: int = 2
) -> HangSummary:
    return HangSummary(
        node=node, nodes=nodes, world=2 * nodes, ranks=ranks, local_world=2, live=live, quiet_s=quiet, still_s=still
    )


def test_the_verdict() -> None:
    assert judge([_summary(quiet=20, still=20)], 15).hung
    assert not judge([_summary(quiet=3, still=20)], 15).hung  # counters move: a healthy loop at one line
    assert not judge([_summary(quiet=20, still=2)], 15).hung  # stacks move: a long step of computation
    assert not judge([_summary(quiet=20, still=20, ranks=1)], 15).hung  # a rank has not reported yet
    assert not judge([_summary(quiet=-1, still=-1, live=0)], 15).hung  # every rank exited
    assert not judge([_summary(quiet=20, still=20)], 0).hung  # off
    two = [_summary(0, quiet=20, still=20, nodes=2), _summary(1, quiet=20, still=1, nodes=2)]
    assert judge(two, 15).hung  # the stuck node's stacks stand still; the other's move
    assert not judge(two[:1], 15).hung  # a node not heard from yet
    assert not judge([two[0], _summary(1, quiet=4, still=20, nodes=2)], 15).hung  # a rank on node 1 moves


def test_a_rank_that_exited_is_left_out_of_the_verdict() -> None:
    beats = {
        0: {"pid": 1, "moved": 0.0, "changed": 0.0, "local_world": 2, "world": 2},
        1: {"pid": 2, "moved": 95.0, "changed": 99.0, "local_world": 2, "world": 2},
    }
    s = summarize(beats, 100.0, live=lambda pid: pid == 2)
    assert s is not None and (s.live, s.quiet_s, s.still_s) == (1, 5.0, 1.0)


def test_the_policy() -> None:
    assert hangs.DEFAULT_TIMEOUT_S == 300 and HangPolicy().action is OnHang.REPORT
    assert HangPolicy(300).sample_s == 5 and HangPolicy(15).sample_s == 1.5 and HangPolicy(2).sample_s == 0.5
    assert HangPolicy(0).worker_env() == {"NUMARUN_HANG_SAMPLE": "0"} and not HangPolicy(0).on
    assert hangs.EXIT_HANG not in (0, 1, 2) and hangs.EXIT_HANG < 128


def test_node_answers_cross_the_store_as_json() -> None:
    call = hangs.NodeCall(
        1, "h1", (_stand(3, "t.py:9", function="load_batch", node=1, host="h1"),), "/k/stacks.1.txt", "in-process"
    )
    assert hangs.NodeCall.from_json(call.to_json()) == call
    text = hangs.render([call, hangs.NodeCall(0, "h0", (_stand(0, "t.py:5", **WAIT),), "/k0", "in-process")])
    assert "roll-call of 2 ranks on 2 nodes (stacks: in-process):" in text[0]
    assert "  rank 3 on node 1 (h1) is at t.py:9 in load_batch" in text  # the waiting one is where the others are
    assert text[-1].startswith("every thread of every rank: node 1 (h1) /k/stacks.1.txt")


def test_a_roll_call_whose_files_cannot_be_written_is_said_whole_and_the_failure_once(tmp_path: Path) -> None:
    """The log dir is a file (its directory cannot be made): each hang's roll-call is still printed, its stacks file
    said not kept with the error, no 'this roll-call:' line, and one line, once, names the file that could not be
    written; the watchdog goes on."""
    from numarun.launch.hangs.verdict import HangVerdict as Verdict
    from numarun.launch.hangs.watch import HangWatch

    (tmp_path / "logs").write_text("a file, not a directory")
    keep = tmp_path / "logs" / "numarun_hangs"
    said: list[str] = []
    watch = HangWatch(
        HangPolicy(timeout_s=30.0),
        tmp_path,
        keep=keep,
        keys=lambda restart: None,
        request_stop=lambda code, message: None,
        hold=lambda: None,
        say=said.extend,
    )
    summary = HangSummary(node=0, nodes=1, world=0, ranks=0, local_world=0, live=0, quiet_s=60.0, still_s=60.0)
    for _ in range(2):
        watch._report(Verdict(True, 60.0, 60.0), {}, summary, None)
    assert (
        said.count(f"WARNING: cannot write {keep}/rollcall.1.txt: Not a directory (the roll-call is on stderr only)")
        == 1
    )
    assert sum("cannot write" in line and "WARNING" in line for line in said) == 1
    assert sum(line.startswith("hang: for 60 s") for line in said) == 2
    stacks = [line for line in said if line.startswith("every thread of every rank: ")]
    assert stacks == [
        f"every thread of every rank: not kept (cannot write {keep}/stacks.{n}.txt: Not a directory)" for n in (1, 2)
    ]
    assert not any(line.startswith("this roll-call: ") for line in said)
