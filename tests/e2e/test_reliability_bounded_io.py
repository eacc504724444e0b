"""Nothing hangs: every read of machine data, every external command and every network wait
is bounded, and the bound is named in the one-line error.

Topology sources and tree entries that are devices, FIFOs or huge are refused (not read
forever, not blocked on); a rendezvous endpoint where another program listens ends at a
deadline derived from torch's own timeout; a Slurm command that never answers times out.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
from helpers import clean_env, error_lines, numarun_cmd
from refusals import EXIT, case, check_refusal, run_in_process

NODE0 = "sys/devices/system/node/node0/cpulist"


@pytest.fixture
def odd_files(tmp_path_factory: pytest.TempPathFactory, h200_tree: Path) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("odd")
    fifo = d / "fifo.txt"
    os.mkfifo(fifo)
    huge = d / "huge.json"
    with open(huge, "wb") as f:  # sparse: 65 MiB of nothing, past the 64 MiB cap
        f.truncate(65 << 20)
    tree = d / "tree"
    shutil.copytree(h200_tree, tree, symlinks=True)
    (tree / NODE0).unlink()
    (tree / NODE0).symlink_to(fifo)
    zero_tree = d / "zero-tree"
    shutil.copytree(h200_tree, zero_tree, symlinks=True)
    (zero_tree / NODE0).unlink()
    (zero_tree / NODE0).symlink_to("/dev/zero")
    return {"fifo": fifo, "huge": huge, "tree": tree, "zero-tree": zero_tree}


@pytest.mark.parametrize(
    "source,words",
    [
        ("/dev/zero", ("'/dev/zero'", "character device", "regular file")),
        ("fifo", ("fifo.txt", "a FIFO", "regular file")),
        ("huge", ("huge.json", "larger than 67108864 bytes")),
        ("tree", ("/sys/devices/system/node/node0/cpulist", "a FIFO")),
        ("zero-tree", ("/sys/devices/system/node/node0/cpulist", "character device")),
    ],
)
def test_a_topology_that_never_ends_is_refused(
    source: str,
    words: tuple[str, ...],
    odd_files: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = str(odd_files.get(source, source))
    for command in (["plan", "--topology", path], ["--topology", path, "--dry-run", EXIT, "0", "0"]):
        c = case(source, command, *words)
        code, err = run_in_process(c.argv, tmp_path, capsys, monkeypatch)
        check_refusal(code, err, c, tmp_path)


def test_the_bounded_read_reads_regular_files_whole(tmp_path: Path) -> None:
    from numarun.errors import TopologyError
    from numarun.topology.fileio import read_bounded

    f = tmp_path / "f"
    f.write_bytes(b"0-3\n")
    assert read_bounded(f) == b"0-3\n"
    assert read_bounded("/proc/self/status").startswith(b"Name:")  # procfs: size 0 in stat, read anyway
    with pytest.raises(TopologyError, match="larger than 2 bytes"):
        read_bounded(f, limit=2)
    with pytest.raises(IsADirectoryError):
        read_bounded(tmp_path)
    with pytest.raises(FileNotFoundError):
        read_bounded(tmp_path / "missing")


@pytest.mark.slow
def test_a_slurm_command_that_never_answers_times_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from numarun.errors import SlurmError
    from numarun.slurm import submit

    sbatch = tmp_path / "sbatch"
    sbatch.write_text("#!/bin/sh\nexec sleep 600\n")
    sbatch.chmod(0o755)
    monkeypatch.setattr(submit, "COMMAND_TIMEOUT_S", 2)
    with pytest.raises(SlurmError, match=r"did not answer within 2 s"):
        submit.sbatch("#!/bin/sh\n", sbatch_cmd=str(sbatch))


@pytest.mark.slow
def test_a_rendezvous_endpoint_held_by_another_program_ends_at_a_deadline(tmp_path: Path) -> None:
    """Something that accepts connections and never speaks c10d: torch's client would wait
    for ever; numarun stops at join_timeout + its margin, in one line that names both."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        port = server.getsockname()[1]
        (tmp_path / "tmp").mkdir()
        start = time.monotonic()
        r = subprocess.run(
            [
                *numarun_cmd(),
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                f"127.0.0.1:{port}",
                "--rdzv-conf",
                "join_timeout=5",
                EXIT,
                "0",
                "0",
            ],
            cwd=tmp_path,
            env=clean_env(PYTHONUNBUFFERED="1", TMPDIR=str(tmp_path / "tmp"), NUMARUN_RDZV_MARGIN="2"),
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert r.returncode == 1, r.stderr[-3000:]
    lines = error_lines(r.stderr)
    assert len(lines) == 1 and "rendezvous did not complete within 7 s (join_timeout=5 + 2 s)" in lines[0], r.stderr[
        -3000:
    ]
    assert f"127.0.0.1:{port}" in lines[0] and "Traceback" not in r.stderr
    assert time.monotonic() - start >= 7  # it waited for torch's own timeout first
    assert list((tmp_path / "tmp").glob("numarun-*")) == []
