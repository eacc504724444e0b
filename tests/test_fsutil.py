"""Atomic writes: whole files only, the user's umask, never through a planted link."""

import os
import stat
from pathlib import Path

import pytest

from numarun.errors import UsageError
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


@pytest.mark.parametrize("name, fragment", [("missing/x.svg", "does not exist"), (".", "is a directory")])
def test_write_output_refuses_with_one_line(tmp_path: Path, name: str, fragment: str) -> None:
    with pytest.raises(UsageError) as e:
        write_output(str(tmp_path / name), "x", flag="--svg")
    assert "--svg" in str(e.value) and fragment in str(e.value) and "\n" not in str(e.value)
