"""Atomic writes: whole files only, the user's umask, never through a planted link."""

import os
import stat
from pathlib import Path

import pytest

from numarun.errors import OutputError, UsageError
from numarun.fsutil import write_atomic, write_output


def test_write_atomic_follows_umask_and_leaves_no_temp(tmp_path: Path) -> None:
    old = os.umask(0o027)
    try:
        write_atomic(tmp_path / "a.svg", "<svg/>")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a.svg").stat().st_mode) == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["a.svg"]


def test_write_atomic_replaces_a_link_instead_of_writing_through_it(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / "out").symlink_to(victim)
    write_atomic(tmp_path / "out", "new")
    assert victim.read_text() == "keep"
    assert not (tmp_path / "out").is_symlink() and (tmp_path / "out").read_text() == "new"


@pytest.mark.parametrize(
    "name, fragment", [("missing/x.svg", "does not exist"), (".", "is a directory"), ("fifo", "not a regular file")]
)
def test_write_output_refuses_with_one_line(tmp_path: Path, name: str, fragment: str) -> None:
    os.mkfifo(tmp_path / "fifo")  # replaced by a rename, it would become a regular file (a device, as root)
    with pytest.raises(UsageError) as e:
        write_output(str(tmp_path / name), "x", flag="--svg")
    assert "--svg" in str(e.value) and fragment in str(e.value) and "\n" not in str(e.value)
    assert stat.S_ISFIFO(os.lstat(tmp_path / "fifo").st_mode)


def test_a_write_that_fails_is_one_line_exit_1_and_leaves_nothing(tmp_path: Path) -> None:
    """A file-size limit makes the kernel refuse the write (EFBIG), as a full disk would."""
    import resource
    import signal

    old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the error, not the signal that would end pytest
    resource.setrlimit(resource.RLIMIT_FSIZE, (1000, old_limit[1]))
    try:
        with pytest.raises(OutputError) as e:
            write_output(str(tmp_path / "big.svg"), "x" * 100_000, flag="--svg")
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
        signal.signal(signal.SIGXFSZ, old_handler)
    assert e.value.exit_code == 1 and "--svg" in str(e.value) and "File too large" in str(e.value)
    assert list(tmp_path.iterdir()) == []
