"""No training lost to a fault that could be seen before it, and no code from a planted checkpoint.

Before any rank starts, the launcher checks the checkpoint dir (a real write probe: root
passes access(2) on a read-only mount), the checkpoints a resume would load (owner, mode,
symlinks, the model they were saved for) and the token file (type, whole tokens, ids below
the vocabulary). Each mistake is one line, exit 2, and no run dir. During training a full
disk is one line, the previous checkpoint stays loadable and no ``.step_*.tmp`` is left; a
damaged newest checkpoint is skipped for the newest intact one, saying so.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from helpers import clean_env, numarun_cmd
from refusals import TRAIN, case, check_refusal, run_in_process

pytestmark = pytest.mark.slow  # every test starts numarun or a trainer

TIMEOUT = 180


def _train(args: list[str], cwd: Path, *, nproc: int = 1) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*numarun_cmd(), "--nproc-per-node", str(nproc), TRAIN, "trainer.progress=false", *args],
        cwd=cwd,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint dir with steps 1 and 2 of the default model (one real trainer run)."""
    d = tmp_path_factory.mktemp("saved")
    r = _train(
        [
            "trainer.steps=2",
            "trainer.checkpoint_interval=1",
            f"trainer.checkpoint_dir={d / 'ck'}",
            f"hydra.run.dir={d / 'run'}",
        ],
        d,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert sorted(p.name for p in (d / "ck").iterdir()) == ["step_00000001", "step_00000002"]
    return d / "ck"


@pytest.fixture(scope="module")
def saved2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Steps 1 to 3 of a two-rank run (a shard per rank), with the run dir's per-step losses beside."""
    d = tmp_path_factory.mktemp("saved2")
    r = _train(
        [
            "trainer.steps=3",
            "trainer.checkpoint_interval=1",
            f"trainer.checkpoint_dir={d / 'ck'}",
            f"hydra.run.dir={d / 'run'}",
        ],
        d,
        nproc=2,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert sorted(p.name for p in (d / "ck" / "step_00000003").iterdir()) == [
        ".metadata",
        "__0_0.distcp",
        "__1_0.distcp",
        "meta.json",
    ]
    return d / "ck"


def _losses(run_dir: Path) -> dict[int, float]:
    return {row["step"]: row["loss"] for row in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())}


def _copy(saved: Path, tmp_path: Path) -> Path:
    ck = tmp_path.parent / f"{tmp_path.name}-ck"
    shutil.copytree(saved, ck)
    return ck


# ------------------------------------------------------------------ checked before launch


@pytest.fixture
def readonly(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A read-only bind mount (root ignores mode bits, not a read-only mount)."""
    if os.geteuid() != 0:
        pytest.skip("bind mounts need root")
    src, mnt = tmp_path.parent / f"{tmp_path.name}-src", tmp_path.parent / f"{tmp_path.name}-ro"
    src.mkdir()
    mnt.mkdir()
    if subprocess.run(["mount", "--bind", str(src), str(mnt)], capture_output=True, timeout=30).returncode != 0:
        pytest.skip("mount --bind is not allowed here")
    try:
        r = subprocess.run(["mount", "-o", "remount,bind,ro", str(mnt)], capture_output=True, timeout=30)
        if r.returncode != 0:
            pytest.skip("a read-only remount is not allowed here")
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True, timeout=30)


def test_read_only_checkpoint_dir_is_refused_before_training(
    readonly: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for target in (readonly, readonly / "sub"):  # the dir itself, or one to be created in it
        c = case(
            "ro",
            [TRAIN, f"trainer.checkpoint_dir={target}"],
            str(target),
            "Read-only file system",
            "writable directory",
        )
        code, err = run_in_process(c.argv, tmp_path, capsys, monkeypatch)
        check_refusal(code, err, c, tmp_path)  # exit 2, one line, no run dir


def _tokens(path: Path, ids: list[int] | np.ndarray, dtype: type = np.uint16) -> str:
    np.asarray(ids, dtype=dtype).tofile(path)
    return str(path)


def test_bad_data_files_fail_before_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    files = tmp_path.parent / f"{tmp_path.name}-data"
    files.mkdir()
    odd = files / "odd.bin"
    odd.write_bytes(b"\x01" * 201)
    high = _tokens(files / "high.bin", [1] * 100 + [300] + [2] * 99)  # vocab_size 256
    gpt = [TRAIN, "data=tokens", "model=gpt"]
    cases = [
        case("odd-length", [*gpt, f"data.path={odd}"], str(odd), "201 bytes", "multiple of 2"),
        case("a-directory", [*gpt, f"data.path={files}"], str(files), "not a regular file"),
        case("id-past-vocab", [*gpt, f"data.path={high}"], "300", "position 100", "model.vocab_size-1 = 255"),
    ]
    for c in cases:
        code, err = run_in_process(c.argv, tmp_path, capsys, monkeypatch)
        check_refusal(code, err, c, tmp_path)


def test_a_changed_model_is_refused_naming_the_keys(
    saved: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    c = case(
        "model",
        [TRAIN, f"trainer.checkpoint_dir={saved}", "trainer.resume=true", "model.hidden_dim=128"],
        "model.hidden_dim=64 in the checkpoint but 128 now",
        "step_00000002",
    )
    code, err = run_in_process(c.argv, tmp_path, capsys, monkeypatch)
    check_refusal(code, err, c, tmp_path)


@pytest.mark.parametrize(
    "plant",
    [
        "world-writable-dir",
        "world-writable-step",
        "foreign-owner",
        "symlinked-step",
        "symlinked-dir",
        "foreign-metadata",
    ],
)
def test_a_planted_checkpoint_is_not_loaded(
    plant: str, saved: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    ck = _copy(saved, tmp_path)
    step = ck / "step_00000002"
    if plant == "world-writable-dir":
        ck.chmod(0o777)
        bad, why = ck, "writable by others"
    elif plant == "world-writable-step":
        step.chmod(0o757)
        bad, why = step, "writable by others"
    elif plant == "foreign-owner":
        if os.geteuid() != 0:
            pytest.skip("chown to another user needs root")
        os.chown(step, 12345, 12345)
        bad, why = step, "owned by uid 12345"
    elif plant == "foreign-metadata":
        if os.geteuid() != 0:
            pytest.skip("chown to another user needs root")
        os.chown(step / ".metadata", 12345, 12345)
        bad, why = step / ".metadata", "owned by uid 12345"
    elif plant == "symlinked-step":
        elsewhere = tmp_path.parent / f"{tmp_path.name}-elsewhere"
        step.rename(elsewhere)
        step.symlink_to(elsewhere)
        bad, why = step, "symbolic link"
    else:
        link = tmp_path.parent / f"{tmp_path.name}-link"
        link.symlink_to(ck)
        ck, bad, why = link, link, "symbolic link"
    c = case(plant, [TRAIN, f"trainer.checkpoint_dir={ck}", "trainer.resume=true"], f"'{bad}'", why, "loaded as code")
    code, err = run_in_process(c.argv, tmp_path, capsys, monkeypatch)
    check_refusal(code, err, c, tmp_path)


def test_the_workers_check_trust_too(saved: Path, tmp_path: Path) -> None:
    """Under plain torchrun (no numarun launcher) the trainer itself refuses before loading."""
    import torch  # noqa: F401  (the checkpoint module needs it)

    from numarun.errors import CheckpointError
    from numarun.train import checkpoint

    ck = _copy(saved, tmp_path)
    (ck / "step_00000001").chmod(0o777)
    with pytest.raises(CheckpointError, match="writable by others"):
        checkpoint.check_trusted(ck)
    (ck / "step_00000001").chmod(0o755)
    checkpoint.check_trusted(ck)


# ------------------------------------------------------------------ faults during the run


@pytest.mark.slow
def test_a_damaged_newest_checkpoint_falls_back_to_the_newest_intact(saved: Path, tmp_path: Path) -> None:
    ck = _copy(saved, tmp_path)
    shard = next((ck / "step_00000002").glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])  # truncated
    r = _train(
        [f"trainer.checkpoint_dir={ck}", "trainer.resume=true", "trainer.steps=3", f"hydra.run.dir={tmp_path / 'run'}"],
        tmp_path,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout + r.stderr
    assert (
        "step_00000002" in out
        and "is damaged" in out
        and "has " in out
        and "resuming from the newest intact one" in out
    )
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["start_step"] == 1 and summary["steps_done"] == 3
    assert summary["resumed_from"].endswith("step_00000001")


@pytest.mark.slow
def test_a_flipped_byte_in_the_newest_checkpoint_falls_back_to_the_newest_intact(saved2: Path, tmp_path: Path) -> None:
    """Same size, one byte changed in rank 1's shard: found by rank 1's share of the verification."""
    ck = _copy(saved2, tmp_path)
    shard = ck / "step_00000003" / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    r = _train(
        [f"trainer.checkpoint_dir={ck}", "trainer.resume=true", "trainer.steps=4", f"hydra.run.dir={tmp_path / 'run'}"],
        tmp_path,
        nproc=2,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout + r.stderr
    named = [line for line in out.splitlines() if "is damaged" in line]
    assert len(named) == 1, out[-3000:]  # said once, by rank 0
    assert "step_00000003" in named[0] and "__1_0.distcp does not match its checksum" in named[0]
    assert "resuming from the newest intact one" in named[0] and named[0].endswith("step_00000002")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["start_step"] == 2 and summary["steps_done"] == 4
    assert summary["resumed_from"].endswith("step_00000002")
    # the redone step 3 is the uninterrupted run's step 3, to the bit
    assert _losses(tmp_path / "run")[3] == _losses(saved2.parent / "run")[3]


@pytest.mark.slow
def test_a_checkpoint_without_checksums_loads_with_one_note(saved2: Path, tmp_path: Path) -> None:
    """A checkpoint saved before checksums were recorded: size-checked, loaded, said once."""
    ck = _copy(saved2, tmp_path)
    for meta_file in ck.glob("step_*/meta.json"):
        meta = json.loads(meta_file.read_text())
        meta.pop("hash", None), meta.pop("checksums", None)
        meta_file.write_text(json.dumps(meta, indent=1) + "\n")
    r = _train(
        [f"trainer.checkpoint_dir={ck}", "trainer.resume=true", "trainer.steps=4", f"hydra.run.dir={tmp_path / 'run'}"],
        tmp_path,
        nproc=2,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout + r.stderr
    notes = [line for line in out.splitlines() if "no checksums" in line]
    assert len(notes) == 1 and "step_00000003" in notes[0] and "content is not" in notes[0], out[-3000:]
    assert "is damaged" not in out
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["start_step"] == 3 and summary["resumed_from"].endswith("step_00000003")


@pytest.mark.slow
def test_only_damaged_checkpoints_is_one_line(saved: Path, tmp_path: Path) -> None:
    ck = _copy(saved, tmp_path)
    for shard in ck.glob("step_*/*.distcp"):
        shard.write_bytes(b"")
    r = _train([f"trainer.checkpoint_dir={ck}", "trainer.resume=true", "trainer.steps=3"], tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    lines = [line for line in r.stderr.splitlines() if line.startswith("numarun: error:")]
    assert len(lines) == 1 and "damaged" in lines[0] and "no older intact one" in lines[0], r.stderr[-3000:]
    assert not (tmp_path / "outputs").exists()  # refused in the launcher: no run dir


@pytest.fixture
def small_disk(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A 4 MB tmpfs, to be filled to the byte (tmpfs counts whole pages)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True, timeout=30
    ).returncode:
        pytest.skip("mount -t tmpfs is not allowed here")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True, timeout=30)


def _free(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


# Where the save of step 2 runs out of room: the bytes left free before it, in pages of the
# files it writes in order (the shard, then DCP's .metadata, then meta.json).
FULL_AT = {
    "before": lambda shard, metadata: 0,  # a disk already full
    "torch-writer": lambda shard, metadata: shard // 2,  # torch's own zip writer: "unexpected pos ..."
    "metadata": lambda shard, metadata: shard,  # DCP's .metadata, on rank 0 after every shard
    "meta-json": lambda shard, metadata: shard + metadata,  # numarun's meta.json with the checksums
}


@pytest.mark.slow
@pytest.mark.parametrize("point", list(FULL_AT))
def test_disk_full_at_any_point_of_a_save_is_named_and_keeps_the_previous(
    point: str, small_disk: Path, saved: Path, tmp_path: Path
) -> None:
    from numarun.train import checkpoint

    page = os.statvfs(small_disk).f_frsize
    sizes = json.loads((saved / "step_00000002" / "meta.json").read_text())["files"]
    pages = {name: -(-size // page) * page for name, size in sizes.items()}
    ck = small_disk / "ck"
    ck.mkdir()
    shutil.copytree(saved / "step_00000001", ck / "step_00000001")
    left = FULL_AT[point](pages["__0_0.distcp"], pages[".metadata"]) // page * page
    filler = small_disk / "filler"
    filler.write_bytes(b"\0" * (_free(small_disk) - left))
    assert _free(small_disk) == left
    r = _train(
        [
            f"trainer.checkpoint_dir={ck}",
            "trainer.resume=true",
            "trainer.steps=2",
            "trainer.checkpoint_interval=1",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        tmp_path,
    )
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert "Error executing job" not in r.stderr and "unexpected pos" not in r.stderr, r.stderr[-3000:]
    errors = [line for line in r.stderr.splitlines() if line.startswith("numarun: error:")]
    # the cause once (rank 0), from the filesystem itself; then numarun's line naming the failed rank
    assert len(errors) == 2 and "exited with code 1" in errors[1], r.stderr[-3000:]
    assert "No space left on device: " in errors[0] and f"bytes free of {4 << 20} on {small_disk} (statvfs" in errors[0]
    assert f"the previous checkpoint {ck / 'step_00000001'} is kept" in errors[0], errors[0]
    assert sorted(p.name for p in ck.iterdir()) == ["step_00000001"]  # no .tmp, nothing half-renamed
    kept = ck / "step_00000001"
    assert checkpoint.damage(kept) == "" and checkpoint.verify_share(kept, rank=0, world_size=1) == ""
    if point == "torch-writer":  # room again: the resume redoes step 2 to the uninterrupted run's loss, to the bit
        filler.unlink()
        r = _train(
            [
                f"trainer.checkpoint_dir={ck}",
                "trainer.resume=true",
                "trainer.steps=2",
                f"hydra.run.dir={tmp_path / 'run2'}",
            ],
            tmp_path,
        )
        assert r.returncode == 0, r.stderr[-3000:]
        assert _losses(tmp_path / "run2")[2] == _losses(saved.parent / "run")[2]


def test_a_stale_tmp_is_removed(saved: Path, tmp_path: Path) -> None:
    from numarun.train import checkpoint

    ck = _copy(saved, tmp_path)
    (ck / ".step_00000003.tmp").mkdir()
    (ck / ".step_00000003.tmp" / "__0_0.distcp").write_bytes(b"half")
    checkpoint.remove_stale(ck)
    assert sorted(p.name for p in ck.iterdir()) == ["step_00000001", "step_00000002"]
