"""Source selection (live, tree, JSON, hwloc XML, nvidia-smi text) and the NVML merge."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
from helpers import REPO
from trees import FIXTURES, HWLOC_XML_DIR

from numarun.envvars import TOPOLOGY as ENV_VAR
from numarun.errors import TopologyError
from numarun.topology.discover import load_topology, merge_nvml
from numarun.topology.model import Topology
from numarun.topology.nvml import NvmlReading, reading_from_record
from numarun.topology.sysfs import read_sysfs

SMI = FIXTURES / "nvidia-smi" / "aws-p4d.24xlarge.txt"
NVML_H200 = FIXTURES / "nvml" / "h200-vm.json"


@pytest.fixture(autouse=True)
def _no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)


def test_directory_is_a_machine_root(h200_tree: Path) -> None:
    t = load_topology(str(h200_tree))
    assert t.source == f"sysfs:{h200_tree}"
    assert len(t.cpus) == 16 and t.gpu_source == "sysfs"


def test_json_snapshot_round_trip(h200_tree: Path, tmp_path: Path) -> None:
    t = load_topology(str(h200_tree))
    snap = tmp_path / "snap.json"
    snap.write_text(t.to_json())
    back = load_topology(str(snap))
    assert back == t


def test_hwloc_xml_file() -> None:
    path = HWLOC_XML_DIR / "nvidiaDGX2.xml"
    t = load_topology(str(path))
    assert t.source == f"hwloc:{path}" and len(t.gpus) == 16


def test_nvidia_smi_text() -> None:
    t = load_topology(str(SMI))
    assert t.source == f"nvidia-smi:{SMI}"
    assert len(t.gpus) == 8


def test_env_var_names_the_source_through_the_options(h200_tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """NUMARUN_TOPOLOGY is the --topology option's variable, read where the options are (once); the reader
    itself reads only what it is given."""
    from numarun.options.launch import from_environ

    source = from_environ(("topology",), {ENV_VAR: str(h200_tree)}).setting("topology")
    assert (source.value, source.where) == (str(h200_tree), ENV_VAR)
    assert load_topology(source.value).source == f"sysfs:{h200_tree}"
    monkeypatch.setenv(ENV_VAR, str(h200_tree))
    assert load_topology().source == "live"  # None: this machine, whatever the environment says


def test_missing_path_names_it_and_the_forms(tmp_path: Path) -> None:
    missing = tmp_path / "nope.json"
    with pytest.raises(TopologyError) as ei:
        load_topology(str(missing))
    msg = str(ei.value)
    assert str(missing) in msg and "numarun topo --json" in msg and "sys/" in msg


@pytest.mark.parametrize(
    ("name", "data", "words"),
    [
        ("bad.json", b"{not json", ["not JSON"]),
        ("bin.json", b"\xff\xfe\x00", ["not text"]),
        ("old.json", json.dumps({"schema_version": 0}).encode(), ["schema_version"]),
        ("bad.xml", b"<topology", ["not XML"]),
    ],
)
def test_bad_files_are_clear_errors(tmp_path: Path, name: str, data: bytes, words: list[str]) -> None:
    p = tmp_path / name
    p.write_bytes(data)
    with pytest.raises(TopologyError) as ei:
        load_topology(str(p))
    for w in words:
        assert w in str(ei.value)
    assert str(p) in str(ei.value)


def test_directory_without_sys_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(TopologyError, match="sys/devices/system/cpu"):
        load_topology(str(tmp_path))


def test_live_machine() -> None:
    t = load_topology()
    assert t.source == "live"
    assert t.usable_cpus
    # This CI machine has no GPU: discovery says so rather than guessing.
    if not t.gpus:
        assert t.gpu_source == "none"
    assert Topology.from_json(t.to_json()) == t
    # A tree rooted at "/" is the live machine too.
    assert load_topology("/").source == "live"


def test_nvml_replaces_sysfs_gpu_by_bus_id(h200_tree: Path) -> None:
    sysfs = read_sysfs(h200_tree)
    reading = reading_from_record(json.loads(NVML_H200.read_text()))
    t = merge_nvml(sysfs, reading)
    assert t.gpu_source == "nvml"
    assert len(t.gpus) == 1
    g = t.gpus[0]
    assert g.pci_bus_id == sysfs.gpus[0].pci_bus_id == "0000:00:06.0"
    assert g.name == "NVIDIA H200" and g.uuid.startswith("GPU-")
    # sysfs says -1 on this VM; NVML's memory affinity names node 0 and wins.
    assert sysfs.gpus[0].numa_node == -1 and g.numa_node == reading.gpus[0].numa_node == 0
    assert g.pci_path == sysfs.gpus[0].pci_path
    assert Topology.from_json(t.to_json()) == t


def test_sysfs_numa_node_kept_when_nvml_has_none(h200_tree: Path, tmp_path: Path) -> None:
    root = tmp_path / "root"
    shutil.copytree(h200_tree, root, symlinks=True)
    (root / "sys/bus/pci/devices/0000:00:06.0/numa_node").write_text("0\n")
    sysfs = read_sysfs(root)
    reading = reading_from_record(json.loads(NVML_H200.read_text()))
    unknown = NvmlReading(
        driver_version=reading.driver_version,
        nvml_version=reading.nvml_version,
        gpus=tuple(dataclasses.replace(g, numa_node=-1, pci_bus_id="00000000:00:06.0") for g in reading.gpus),
        gpu_links=reading.gpu_links,
    )
    t = merge_nvml(sysfs, unknown)
    assert t.gpus[0].numa_node == 0 and t.gpus[0].pci_bus_id == "0000:00:06.0"


def test_no_nvml_keeps_sysfs(h200_tree: Path) -> None:
    sysfs = read_sysfs(h200_tree)
    assert merge_nvml(sysfs, None).gpus == sysfs.gpus
    assert merge_nvml(sysfs, None).gpu_source == "sysfs"
    empty = dataclasses.replace(sysfs, gpus=())
    assert merge_nvml(empty, None).gpu_source == "none"


@pytest.mark.slow
def test_bench_script_runs() -> None:
    import subprocess
    import sys

    repo = REPO
    out = subprocess.run(
        [sys.executable, str(repo / "scripts" / "bench_discovery.py"), "--runs", "1"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout
    lines = out.splitlines()
    assert lines[0].split()[:2] == ["source", "nodes"]
    assert any(line.startswith("live machine") for line in lines)
    assert sum(line.startswith("tree ") for line in lines) == 2
    bad = subprocess.run(
        [sys.executable, str(repo / "scripts" / "bench_discovery.py"), "--runs", "0"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode == 2 and "--runs" in bad.stderr


def test_tarball_source_reads_like_its_extracted_tree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, h200_tree: Path
) -> None:
    from trees import H200_TARBALL

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    t = load_topology(str(H200_TARBALL))
    assert t.source == f"sysfs:{H200_TARBALL}"
    assert dataclasses.replace(t, source="x") == dataclasses.replace(load_topology(str(h200_tree)), source="x")
    cached = list((tmp_path / "cache" / "numarun" / "trees").iterdir())
    assert len(cached) == 1  # extracted once, keyed on content
    load_topology(str(H200_TARBALL))
    assert list((tmp_path / "cache" / "numarun" / "trees").iterdir()) == cached


def test_bad_tarballs_are_clear_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tarfile

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    broken = tmp_path / "broken.tar.bz2"
    broken.write_bytes(b"BZh91AY&SY not really")
    empty_dir = tmp_path / "nothing"
    (empty_dir / "etc").mkdir(parents=True)
    nosys = tmp_path / "nosys.tar.gz"
    with tarfile.open(nosys, "w:gz") as tf:
        tf.add(empty_dir, arcname="nothing")
    for path, fragment in ((broken, "bad topology archive"), (nosys, "no sys/ directory")):
        with pytest.raises(TopologyError) as e:
            load_topology(str(path))
        assert fragment in str(e.value) and str(path) in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("has_filter", [True, False])
def test_archive_extraction_refuses_escapes_with_or_without_tarfile_filters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, has_filter: bool
) -> None:
    """Older Python patch releases lack tarfile's data filter: the same refusals hold."""
    import io
    import tarfile

    from numarun.topology.archive import safe_extract

    if not has_filter:
        monkeypatch.delattr(tarfile, "data_filter", raising=False)
    evil = tmp_path / "evil.tar"
    with tarfile.open(evil, "w") as tf:
        info = tarfile.TarInfo("../escaped")
        info.size = 1
        tf.addfile(info, io.BytesIO(b"x"))
    with tarfile.open(evil) as tf, pytest.raises(tarfile.TarError):
        safe_extract(tf, tmp_path / "out")
    assert not (tmp_path / "escaped").exists()
    from trees import H200_TARBALL

    with tarfile.open(H200_TARBALL) as tf:
        safe_extract(tf, tmp_path / "good")
    assert (tmp_path / "good" / "sys" / "devices" / "system" / "node").is_dir()
