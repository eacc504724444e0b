"""The binding system calls on this machine: affinity on every thread, set/get_mempolicy."""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from numarun.cpuset import parse_list, parse_mask
from numarun.worker import affinity
from numarun.worker.affinity import Mpol


def _thread_masks() -> dict[int, set[int]]:
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            out[int(tid)] = os.sched_getaffinity(int(tid))
        except ProcessLookupError:
            pass
    return out


@pytest.fixture
def restore_binding() -> Iterator[set[int]]:
    original = os.sched_getaffinity(0)
    yield original
    affinity.set_cpu_affinity(original)
    affinity.set_mempolicy(Mpol.DEFAULT)


@pytest.fixture
def sleeping_thread() -> Iterator[threading.Thread]:
    """A thread started before the binding, as a library imported early would start one."""
    stop = threading.Event()
    t = threading.Thread(target=stop.wait, daemon=True)
    t.start()
    yield t
    stop.set()
    t.join(timeout=30)


def test_set_cpu_affinity_binds_every_existing_thread(
    restore_binding: set[int], sleeping_thread: threading.Thread
) -> None:
    target = {max(restore_binding)}
    assert sleeping_thread.native_id in _thread_masks()
    assert _thread_masks()[sleeping_thread.native_id] == restore_binding
    affinity.set_cpu_affinity(target)
    masks = _thread_masks()
    assert len(masks) >= 2
    assert all(m == target for m in masks.values()), masks
    assert affinity.get_cpu_affinity() == tuple(sorted(target))
    assert affinity.cpus_allowed() == tuple(sorted(target))


def test_read_back_reports_what_the_kernel_holds(restore_binding: set[int], sleeping_thread: threading.Thread) -> None:
    target = {max(restore_binding)}
    node = min(affinity.mems_allowed())
    affinity.set_cpu_affinity(target)
    affinity.set_mempolicy(Mpol.BIND, [node])
    got = affinity.read_back(threads=True)
    assert got.cpus == tuple(target)
    assert (got.mem_policy, got.mems) == ("bind", (node,))
    assert got.thread_cpus[sleeping_thread.native_id] == tuple(target)
    assert set(got.thread_cpus) == set(_thread_masks())
    affinity.set_mempolicy(Mpol.DEFAULT)
    plain = affinity.read_back()
    assert (plain.mem_policy, plain.mems, plain.thread_cpus) == ("default", (), {})


def test_new_threads_inherit_the_binding(restore_binding: set[int]) -> None:
    target = {min(restore_binding)}
    affinity.set_cpu_affinity(target)
    seen = []
    t = threading.Thread(target=lambda: seen.append(os.sched_getaffinity(0)))
    t.start()
    t.join(timeout=30)
    assert seen == [target]


def test_unusable_cpu_is_an_oserror_with_errno(restore_binding: set[int]) -> None:
    before = _thread_masks()
    bad = max(restore_binding) + 1
    while bad in restore_binding:
        bad += 1
    with pytest.raises(OSError) as e:
        affinity.set_cpu_affinity({bad})
    assert e.value.errno == errno.EINVAL
    with pytest.raises(OSError) as e:
        affinity.set_cpu_affinity(set())
    assert e.value.errno == errno.EINVAL
    # nothing changed on failure
    assert _thread_masks() == {t: m for t, m in before.items() if t in _thread_masks()}


@pytest.mark.parametrize("mode", [Mpol.BIND, Mpol.PREFERRED])
def test_set_mempolicy_reads_back(restore_binding: set[int], mode: Mpol) -> None:
    node = min(affinity.mems_allowed())
    affinity.set_mempolicy(mode, [node])
    assert affinity.get_mempolicy() == (mode, (node,))
    affinity.set_mempolicy(Mpol.DEFAULT)
    assert affinity.get_mempolicy() == (Mpol.DEFAULT, ())


def test_set_mempolicy_on_a_missing_node_is_einval(restore_binding: set[int]) -> None:
    online = parse_list(Path("/sys/devices/system/node/online").read_text())
    missing = max(online) + 1
    for mode in (Mpol.BIND, Mpol.PREFERRED):
        with pytest.raises(OSError) as e:
            affinity.set_mempolicy(mode, [missing])
        assert e.value.errno == errno.EINVAL
    with pytest.raises(OSError) as e:
        affinity.set_mempolicy(Mpol.BIND, [])
    assert e.value.errno == errno.EINVAL
    assert affinity.get_mempolicy()[0] == Mpol.DEFAULT


@pytest.mark.parametrize(
    ("nodes", "words", "maxnode"),
    [([0], 1, 65), ([63], 1, 65), ([64], 2, 129), ([1, 130], 3, 193)],
)
def test_nodemask_passes_one_more_bit_than_it_holds(nodes: list[int], words: int, maxnode: int) -> None:
    mask, got_maxnode = affinity._nodemask(nodes)
    assert len(mask) == words and got_maxnode == maxnode
    decoded = [w * 64 + b for w in range(len(mask)) for b in range(64) if mask[w] >> b & 1]
    assert decoded == sorted(nodes)


def test_status_lists_agree_with_the_kernel_masks() -> None:
    status = Path("/proc/self/status").read_text().splitlines()
    fields = dict(line.split(":", 1) for line in status if ":" in line)
    assert affinity.mems_allowed() == parse_mask(fields["Mems_allowed"])
    assert affinity.cpus_allowed() == parse_mask(fields["Cpus_allowed"])
    assert affinity.cpus_allowed() == tuple(sorted(os.sched_getaffinity(0)))
