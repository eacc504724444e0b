"""Cores are SMT sibling sets: the ``numarun topo`` summary against hwloc's own expected output.

Every recorded tree in tests/fixtures/hwloc-linux-sysfs comes with the output hwloc's test
suite expects for it (``.console`` from ``lstopo -v``, or ``.xml``). hwloc shows the usable
(online and allowed) CPUs, so those counts are compared; with nothing disallowed they are
the summary's own numbers.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from trees import SYSFS_DIR, extract_tree

from numarun.topology.model import physical_cores
from numarun.topology.sysfs import read_sysfs
from numarun.view.topo import cpu_summary, render_text

TESTS = sorted(SYSFS_DIR.glob("*.test"))


def _field(test: Path, key: str) -> str:
    m = re.search(rf"^{key}:\s*(\S+)", test.read_text(), re.MULTILINE)
    assert m, f"{test.name}: no {key}"
    return m.group(1)


def hwloc_counts(target: Path) -> dict[str, int | bool]:
    """Packages holding PUs, cores, PUs and SMT as hwloc reports them in an expected output
    file (hwloc also keeps a package whose only allowed resource is memory; not counted)."""
    if target.suffix == ".xml":
        objs = list(ET.parse(target).getroot().iter("object"))
        cores = [o for o in objs if o.get("type") == "Core"]
        return {
            "packages": sum(
                o.get("type") == "Package" and any(p.get("type") == "PU" for p in o.iter("object")) for o in objs
            ),
            "cores": len(cores),
            "pus": sum(o.get("type") == "PU" for o in objs),
            "smt": any(sum(p.get("type") == "PU" for p in c.iter("object")) > 1 for c in cores),
        }
    lines = target.read_text().splitlines()
    per_core: list[int] = []
    per_package: list[int] = []
    for line in lines:
        kind = re.match(r"\s*(\w+) L#", line)
        if kind and kind.group(1) == "Package":
            per_package.append(0)
        elif kind and kind.group(1) == "Core":
            per_core.append(0)
        elif kind and kind.group(1) == "PU":
            if per_core:
                per_core[-1] += 1
            if per_package:
                per_package[-1] += 1
    return {
        "packages": sum(1 for n in per_package if n),
        "cores": len(per_core),
        "pus": sum(1 for ln in lines if re.match(r"\s*PU L#", ln)),
        "smt": any(n > 1 for n in per_core),
    }


def test_every_recorded_tree_has_an_expected_output() -> None:
    assert len(TESTS) >= 12
    for t in TESTS:
        assert (SYSFS_DIR / _field(t, "target")).exists()


@pytest.mark.parametrize("test", TESTS, ids=lambda p: p.stem)
def test_summary_counts_match_hwloc(test: Path) -> None:
    topo = read_sysfs(extract_tree(SYSFS_DIR / _field(test, "source")))
    s = cpu_summary(topo)
    want = hwloc_counts(SYSFS_DIR / _field(test, "target"))
    got = {k: s[f"usable_{k}"] for k in want}
    assert got == want
    if not s["disallowed"]:
        assert {k: s[k] for k in want} == want


def test_the_three_trees_that_core_ids_got_wrong() -> None:
    def summary(name: str) -> dict[str, int | bool]:
        return cpu_summary(read_sysfs(extract_tree(SYSFS_DIR / f"{name}.tar.bz2")))

    # multi-die packages without die_id repeat core_id: still 48 / 32 single-thread cores
    assert {k: summary("48amd64-4pa2n6c-sparse")[k] for k in ("cores", "pus", "smt")} == {
        "cores": 48,
        "pus": 48,
        "smt": False,
    }
    cg = summary("32amd64-4s2n4c-cgroup2")
    assert (cg["cores"], cg["smt"], cg["usable_cores"]) == (32, False, 6)
    # the 7 offline CPUs are listed apart, not counted as one core
    off = summary("offline-cpu0-node0")
    assert (off["cores"], off["pus"], off["offline"], off["smt"]) == (17, 17, 7, False)
    text = render_text(read_sysfs(extract_tree(SYSFS_DIR / "offline-cpu0-node0.tar.bz2")))
    assert "packages: 2   cores: 17   PUs: 17   SMT: no   offline CPUs: 7" in text
    assert "offline: 0-3,21-23" in text


def test_physical_cores_groups_by_sibling_set() -> None:
    topo = read_sysfs(extract_tree(SYSFS_DIR / "16em64t-4s2c2t.tar.bz2"))
    cores = physical_cores(topo.cpus)
    assert len(cores) == 8 and all(len(c) == 2 for c in cores)
    assert all(tuple(x.id for x in c) == c[0].siblings for c in cores)
