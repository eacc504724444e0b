"""A topology tarball is extracted within bounds: total size and member count are capped.

A tar bomb (a few KB of gzip that expand to hundreds of MB, or a huge number of members)
is refused from its headers alone, before anything is written to the cache; the caps can
be raised for real large trees. The archive is hashed in chunks, not read whole.
"""

from __future__ import annotations

import io
import tarfile
import tracemalloc
from pathlib import Path

import pytest

from numarun.errors import TopologyError
from numarun.topology import archive


def _bomb(path: Path, *, size: int = 0, members: int = 0) -> Path:
    with tarfile.open(path, "w:gz") as tf:
        for d in ("sys", "proc"):
            info = tarfile.TarInfo(d)
            info.type = tarfile.DIRTYPE
            tf.addfile(info)
        if size:
            info = tarfile.TarInfo("sys/zeros")
            info.size = size
            tf.addfile(info, io.BytesIO(bytes(size)))
        for i in range(members):
            tf.addfile(tarfile.TarInfo(f"sys/f{i}"), io.BytesIO(b""))
    return path


def test_a_tar_bomb_is_refused_before_anything_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tarball = _bomb(tmp_path / "bomb.tar.gz", size=64 << 20)
    assert tarball.stat().st_size < 200_000  # 64 MiB of zeros in a small file
    cache = tmp_path / "cache"
    monkeypatch.setenv("NUMARUN_TAR_MAX_BYTES", str(16 << 20))
    with pytest.raises(TopologyError) as e:
        archive.extract_tree(tarball, cache)
    msg = str(e.value)
    assert "\n" not in msg and "bomb.tar.gz" in msg and "NUMARUN_TAR_MAX_BYTES" in msg and str(16 << 20) in msg
    assert not cache.exists() or list(cache.iterdir()) == []  # nothing left in the cache
    # the override lets a real large tree through
    monkeypatch.setenv("NUMARUN_TAR_MAX_BYTES", str(128 << 20))
    root = archive.extract_tree(tarball, cache)
    assert (root / "sys" / "zeros").stat().st_size == 64 << 20


def test_too_many_members_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tarball = _bomb(tmp_path / "many.tar.gz", members=300)
    monkeypatch.setenv("NUMARUN_TAR_MAX_MEMBERS", "100")
    with pytest.raises(TopologyError, match="more than 100 members.*NUMARUN_TAR_MAX_MEMBERS"):
        archive.extract_tree(tarball, tmp_path / "cache")
    monkeypatch.delenv("NUMARUN_TAR_MAX_MEMBERS")
    assert len(list((archive.extract_tree(tarball, tmp_path / "cache") / "sys").iterdir())) == 300


def test_the_default_caps_hold_a_tar_bomb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NUMARUN_TAR_MAX_BYTES", raising=False)
    tarball = tmp_path / "big.tar"
    with tarfile.open(tarball, "w") as tf:  # headers only: declared sizes past the default cap
        info = tarfile.TarInfo("sys/huge")
        info.size = archive.MAX_BYTES + 1
        tf.addfile(info)  # no data: the header alone must be enough to refuse it
    with pytest.raises(TopologyError, match="exceed"):
        archive.extract_tree(tarball, tmp_path / "cache")


@pytest.mark.parametrize("value", ["0", "-1", "lots"])
def test_a_bad_cap_is_one_line(value: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NUMARUN_TAR_MAX_MEMBERS", value)
    with pytest.raises(TopologyError, match=f"bad NUMARUN_TAR_MAX_MEMBERS '{value}': expected a positive whole number"):
        archive.extract_tree(_bomb(tmp_path / "t.tar.gz"), tmp_path / "cache")


def test_the_hash_streams(tmp_path: Path) -> None:
    import hashlib

    big = tmp_path / "blob"
    big.write_bytes(bytes(range(256)) * (64 << 12))  # 16 MiB
    tracemalloc.start()
    digest = archive.file_digest(big)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert digest == hashlib.sha256(big.read_bytes()).hexdigest()
    assert peak < 4 << 20  # chunks, not the whole file
