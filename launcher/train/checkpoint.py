"""Checkpoints with ``torch.distributed.checkpoint`` (sharded: any layout of pipeline stages, FSDP2 shards, replicas
and tensor parallelism).

Layout: ``<dir>/step_00000010/`` holds the DCP files and ``meta.json`` (step, world size,
parallel preset and layout, the model config, the size and xxh3-128 checksum of every file).
Every parameter is saved under its name in the whole model, and the optimizer state flattened
by parameter name (``state.<name>.<key>``, ``param_groups.<name>.<key>``), so that each rank
saves and loads what its pipeline stages hold, and DCP reshards a checkpoint onto another
layout (other degrees, other world size) at load. A save goes to
``<dir>/.step_00000010.tmp`` first and is renamed once complete; the directory must be shared
by all nodes. RNG and data position need no saving: batches and dropout seeds are functions of
the step (``numarun.train.data``). Why each piece: docs/reliability.md.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
import stat
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch.distributed as dist
import xxhash

from .. import jsonable
from ..errors import CheckpointError, ConfigError

log = logging.getLogger(__name__)

_STEP_DIR = re.compile(r"^step_(\d{8})$")
_RANK_FILE = re.compile(r"^__(\d+)_")  # DCP's FileSystemWriter names rank k's files __k_<n>.distcp

HASH = "xxh3_128"
"""The checksum recorded in meta.json: xxHash's XXH3 128-bit (tens of GB/s; not a defence
against a forger, which check_trusted is, but against a flipped bit or a torn copy)."""
_CHUNK = 4 << 20


def step_dir(root: Path, step: int) -> Path:
    return root / f"step_{step:08d}"


def check_trusted(root: Path) -> None:
    """Refuse a checkpoint dir, ``step_*`` or file in it that is a symlink, owned by someone other than
    this user or root, or writable by others: torch's loader unpickles ``.metadata``."""
    uid = os.getuid()
    paths = [root]
    if root.is_dir() and not root.is_symlink():
        for child in root.iterdir():
            if _STEP_DIR.match(child.name):
                paths.append(child)
                if child.is_dir() and not child.is_symlink():
                    paths.extend(child.iterdir())
    for path in paths:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        for broken, why in (
            (stat.S_ISLNK(st.st_mode), "it is a symbolic link"),
            (st.st_uid not in (uid, 0), f"it is owned by uid {st.st_uid}, not by this user ({uid}) or root"),
            (st.st_mode & stat.S_IWOTH, f"it is writable by others (mode {stat.S_IMODE(st.st_mode):04o})"),
        ):
            if broken:
                raise CheckpointError(
                    f"bad checkpoint {str(path)!r}: {why}; a checkpoint is loaded as code, so it must be a real "
                    "file or directory owned by you (or root) and not writable by others (chmod o-w, or a private "
                    "trainer.checkpoint_dir)"
                )


def model_config(model_cfg: Any) -> dict[str, Any]:
    """The model config as plain JSON values (what meta.json records)."""
    from omegaconf import DictConfig, OmegaConf

    if isinstance(model_cfg, DictConfig):
        return json.loads(json.dumps(OmegaConf.to_container(model_cfg, resolve=True, enum_to_str=True), default=str))
    return dict(model_cfg)


def check_model(meta: dict[str, Any], model_cfg: Any, path: Path) -> None:
    """Refuse to load a checkpoint of another model, naming the keys that differ."""
    saved = meta.get("model")
    if saved is None:
        return  # written before the model was recorded
    now = model_config(model_cfg)
    keys = sorted(k for k in set(saved) | set(now) if saved.get(k) != now.get(k))
    if keys:
        diff = ", ".join(f"model.{k}={saved.get(k)!r} in the checkpoint but {now.get(k)!r} now" for k in keys)
        raise ConfigError(
            f"bad trainer.resume for {str(path)!r}: the model differs ({diff}); expected the checkpoint's model "
            "config, or a new trainer.checkpoint_dir"
        )


def tensors(state: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """DCP key -> global shape of every tensor in a state dict as :func:`save` and :func:`load` hand it to DCP
    (``{"model": ..., "optim": ...}``, the optimizer's flattened; a nested one's is left out)."""
    import torch

    flat = {f"model.{k}": v for k, v in state["model"].items()}
    if not isinstance(state["optim"].get("state"), dict):  # nested: saved by an earlier numarun
        flat.update({f"optim.{k}": v for k, v in state["optim"].items()})
    return {k: tuple(v.shape) for k, v in flat.items() if isinstance(v, torch.Tensor)}


def check_holds(path: Path, wanted: Mapping[str, tuple[int, ...]], *, whole: bool, optimizer: str) -> None:
    """Refuse a checkpoint that does not hold every tensor of ``wanted`` (DCP key -> global shape, :func:`tensors`)
    in that shape, naming what differs, before any tensor is read (DCP's ``.metadata`` lists them).

    ``whole``: ``wanted`` is the whole model (the launcher's check), so a model tensor the checkpoint holds and
    ``wanted`` lacks (a checkpoint of a deeper model) differs too; a rank wants only its stages' part.
    ``optimizer``: the running optimizer's name (its class's, lowercased: ``optim.kind``), for the message.
    """
    from torch.distributed.checkpoint import FileSystemReader

    saved = {
        k: tuple(v.size) if hasattr(v, "size") else None
        for k, v in FileSystemReader(str(path)).read_metadata().state_dict_metadata.items()
    }

    def differs(key: str, shape: tuple[int, ...]) -> str:
        got = saved.get(key, "missing")
        if got == shape:
            return ""
        name = key.removeprefix("model.")
        return (
            f"{name} is not in the checkpoint"
            if got == "missing"
            else f"{name} is {_dims(got)} in the checkpoint but {_dims(shape)} now"
        )

    found = [why for key, shape in wanted.items() if key.startswith("model.") and (why := differs(key, shape))]
    if whole:
        found += [
            f"{k[6:]} is in the checkpoint but not in this model"
            for k in saved
            if k.startswith("model.") and k not in wanted
        ]
    bad = {key[6:] for key, shape in wanted.items() if key.startswith("model.") and differs(key, shape)}
    missing_state: set[str] = set()
    for key, shape in wanted.items():
        name, _, part = key.removeprefix("optim.state.").rpartition(".")
        if not key.startswith("optim.state.") or name in bad:
            continue  # a parameter that differs is named once, by the model's line
        if key not in saved:
            missing_state.add(part)
        elif why := differs(key, shape):
            found.append(why)
    if missing_state:
        kept = sorted(
            {k.rpartition(".")[2] for k, v in saved.items() if k.startswith("optim.state.") and v is not None}
        )
        found.insert(
            0,
            f"the optimizer state is {', '.join(kept) or 'empty'} per parameter in the checkpoint but "
            f"optim.kind={optimizer.lower()} needs {', '.join(sorted(missing_state))}",
        )
    if found:
        what = "; ".join(found[:3]) + (f"; and {len(found) - 3} more" if len(found) > 3 else "")
        raise CheckpointError(
            f"bad trainer.resume for {str(path)!r}: it does not hold what this run loads ({what}); expected a "
            "checkpoint of this model and optimizer, or a new trainer.checkpoint_dir"
        )


def _dims(shape: Any) -> str:
    return "[" + ", ".join(str(n) for n in shape) + "]"


def damage(path: Path) -> str:
    """Why the checkpoint at ``path`` cannot be loaded, from its file sizes ('' when they match).

    Cheap (a stat per file): the launcher's check before any rank starts. The content is
    verified by the ranks, in parallel (:func:`newest_verified`).
    """
    try:
        meta = jsonable.loads((path / "meta.json").read_text())
    except (OSError, ValueError) as e:
        return f"meta.json unreadable ({getattr(e, 'strerror', None) or e})"
    if not isinstance(meta, dict):
        return "meta.json is not a JSON object"
    for name, size in (meta.get("files") or {}).items():
        try:
            got = (path / name).stat().st_size
        except OSError:
            return f"{name} is missing"
        if got != size:
            return f"{name} has {got} bytes, expected {size}"
    return ""


def file_digest(path: Path) -> str:
    """The :data:`HASH` of a file's bytes, read in chunks (hex)."""
    h = xxhash.xxh3_128()
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


def owner(name: str, world_size: int) -> int:
    """The rank that hashes (at save) and verifies (at resume) the file ``name``.

    Rank k's own shards (``__k_*.distcp``) go to rank k (to k mod the world size when a run
    resumes with fewer ranks): at save, each rank reads back what it has just written, from
    its own page cache. Everything else (``.metadata``) goes to rank 0, DCP's coordinator.
    """
    m = _RANK_FILE.match(name)
    return int(m.group(1)) % world_size if m else 0


def hash_share(path: Path, *, rank: int, world_size: int) -> dict[str, str]:
    """Checksums of the files under ``path`` that :func:`owner` gives to ``rank``."""
    return {
        f.name: file_digest(f)
        for f in sorted(path.iterdir())
        if f.is_file() and f.name != "meta.json" and owner(f.name, world_size) == rank
    }


def verify_share(path: Path, *, rank: int, world_size: int) -> str:
    """Why this rank's share of the checkpoint at ``path`` is damaged ('' when intact or unrecorded)."""
    try:
        meta = jsonable.loads((path / "meta.json").read_text())
    except (OSError, ValueError) as e:
        return f"meta.json unreadable ({getattr(e, 'strerror', None) or e})"
    sums = meta.get("checksums") if isinstance(meta, dict) else None
    if not isinstance(sums, dict):
        return ""  # saved before checksums were recorded: the caller notes it
    if meta.get("hash") != HASH:
        return f"meta.json names checksum {meta.get('hash')!r}, expected {HASH!r}"
    for name in sorted(sums):
        if owner(name, world_size) != rank:
            continue
        try:
            got = file_digest(path / name)
        except OSError as e:
            return f"{name} unreadable ({e.strerror})"
        if got != sums[name]:
            return f"{name} does not match its checksum ({HASH} {got}, expected {sums[name]})"
    return ""


def _candidates(root: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints under ``root`` (a ``step_*`` with meta.json), newest first."""
    if not root.is_dir():
        return []
    return sorted(
        (
            (int(m.group(1)), child)
            for child in root.iterdir()
            if (m := _STEP_DIR.match(child.name)) and (child / "meta.json").is_file()
        ),
        reverse=True,
    )


def newest_intact(
    root: Path,
    report: Any = None,
    *,
    check: Callable[[Path], str] = damage,
    candidates: Sequence[tuple[int, Path]] | None = None,
) -> tuple[int, Path] | None:
    """The newest checkpoint under ``root`` that ``check`` finds undamaged, or None.

    ``check`` is :func:`damage` (sizes) by default. A damaged newer one (a truncated or
    altered ``.distcp``, a missing file) is skipped and named through ``report(line)``, so
    the run says which step it falls back from.
    """
    skipped: list[tuple[str, str]] = []
    for step, path in _candidates(root) if candidates is None else candidates:
        why = check(path)
        if not why:
            if skipped and report is not None:
                report(
                    f"checkpoint {skipped[0][0]} is damaged ({skipped[0][1]}); resuming from the newest intact one, "
                    f"{path}"
                )
            return step, path
        skipped.append((str(path), why))
    if skipped:
        raise CheckpointError(
            f"bad checkpoint {skipped[0][0]!r}: damaged ({skipped[0][1]}) and no older intact one; "
            "expected a complete step_* (or trainer.resume=false)"
        )
    return None


def newest_verified(
    root: Path, *, rank: int, world_size: int, report: Any = None, device: Any = "cpu"
) -> tuple[int, Path] | None:
    """Collective: :func:`newest_intact` with every file's content checked, before torch reads any.

    Each rank verifies its share of the files (:func:`owner`), in parallel, and the ranks agree
    on the verdict (one small all-reduce per checkpoint looked at), so all of them load the
    same step or all refuse. A checkpoint saved before checksums were recorded is
    size-checked only, said once through ``report``. ``device``: where the collectives'
    tensors live (the rank's GPU under NCCL).
    """
    candidates = _candidates(root)
    distributed = world_size > 1 and dist.is_available() and dist.is_initialized()

    def agree(step: int, why: str) -> bool:
        """Whether any rank found damage; every rank must be looking at the same step of the same list
        (a refusal on every rank otherwise, never a rank left waiting)."""
        import torch

        n = len(candidates)
        t = torch.tensor([1 if why else 0, n, -n, step, -step], dtype=torch.int64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        got = t.tolist()
        if got[1] != -got[2] or got[3] != -got[4]:
            raise CheckpointError(
                f"bad trainer.checkpoint_dir {str(root)!r}: the ranks see different checkpoints in it "
                f"({n} here, step {step} first); expected one directory shared by every node"
            )
        return bool(got[0])

    if distributed and not candidates:
        agree(-1, "")  # nothing to load here: every rank must find nothing too
        return None

    def check(path: Path) -> str:
        why = damage(path) or verify_share(path, rank=rank, world_size=world_size)
        if not distributed or not agree(int(path.name.removeprefix("step_")), why):
            return why
        every: list[Any] = [None] * world_size
        dist.all_gather_object(every, why)  # rare: a damaged checkpoint, named by the first rank that saw it
        return next(w for w in every if w)

    result = newest_intact(root, report, check=check, candidates=candidates)
    if result is not None and report is not None:
        meta = json.loads((result[1] / "meta.json").read_text())
        if not isinstance(meta.get("checksums"), dict):
            report(
                f"checkpoint {result[1]} has no checksums (saved by an earlier numarun): its file sizes are checked, "
                "its content is not"
            )
    return result


def remove_stale(root: Path) -> None:
    """Remove ``.step_*.tmp``/``.old`` left by a save that was killed or failed."""
    if root.is_dir():
        for child in root.iterdir():
            if child.name.startswith(".step_") and child.name.endswith((".tmp", ".old")) and not child.is_symlink():
                shutil.rmtree(child, ignore_errors=True)


def latest(root: Path) -> tuple[int, Path] | None:
    """The newest complete checkpoint under ``root`` (one with meta.json), or None."""
    return next(iter(_candidates(root)), None)


def _listed(x: Any) -> list[Any]:
    """One model (optimizer) or a sequence of them (a rank's pipeline stages)."""
    return list(x) if isinstance(x, (list, tuple)) else [x]


def _states(
    parts: Sequence[Any],
    optimizers: Sequence[Any],
    *,
    flat: bool = True,
) -> tuple[list[tuple[dict[str, Any], dict[str, Any]]], dict[str, Any]]:
    """Each part's (model, optimizer) state dicts, and all of them merged as DCP saves them."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict

    options = StateDictOptions(flatten_optimizer_state_dict=flat)
    pairs = [
        (get_model_state_dict(part), get_optimizer_state_dict(part, opt, options=options))
        for part, opt in zip(parts, optimizers, strict=True)
    ]
    if len(pairs) == 1:
        return pairs, {"model": pairs[0][0], "optim": pairs[0][1]}
    # a rank holding several pipeline stages: their names are disjoint, and so are their flattened optimizer keys
    model = {k: v for m, _ in pairs for k, v in m.items()}
    if len(model) != sum(len(m) for m, _ in pairs):
        raise RuntimeError("model parts share parameter names: expected the stages of one model, named as in it")
    return pairs, {"model": model, "optim": {k: v for _, o in pairs for k, v in o.items()}}


def save(root: Path, step: int, parts: Any, optimizers: Any, *, meta: dict[str, Any], rank: int) -> Path:
    """Collective: every rank calls it, with its model parts (its pipeline stages, or the whole model) and their
    optimizers, one each (or one model and its optimizer). Returns the final checkpoint dir.

    A failure at any point (torch's writer, ``.metadata``, ``meta.json``, the rename) is a
    :class:`CheckpointError` on every rank, the ``.tmp`` removed and the previous checkpoint
    kept; rank 0's message names the cause (:func:`_failure`).
    """
    import torch
    import torch.distributed.checkpoint as dcp

    final = step_dir(root, step)
    tmp = root / f".{final.name}.tmp"
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
    dist.barrier()
    _, state = _states(_listed(parts), _listed(optimizers))
    meta = {**meta, "optim_state": "flat"}
    old = root / f".{final.name}.old"
    failed: BaseException | None = None
    try:
        dcp.save(state, checkpoint_id=str(tmp))
        world_size = dist.get_world_size()
        # every rank hashes what it wrote, at once; the gather replaces a barrier (rank 0
        # hears from every rank only once all have written)
        mine = hash_share(tmp, rank=rank, world_size=world_size)
        shares: list[Any] | None = [None] * world_size if rank == 0 else None
        dist.gather_object(mine, shares, dst=0)
        if rank == 0:
            files = {f.name: f.stat().st_size for f in tmp.iterdir() if f.is_file()}
            sums: dict[str, str] = {k: v for share in shares or [] for k, v in share.items()}
            sums.update({name: file_digest(tmp / name) for name in files if name not in sums})  # none expected
            record = {"step": step, **meta, "files": files, "hash": HASH, "checksums": dict(sorted(sums.items()))}
            with open(tmp / "meta.json", "w") as f:
                f.write(json.dumps(record, indent=1) + "\n")
                f.flush()
                os.fsync(f.fileno())  # ENOSPC on a filesystem that allocates at writeback shows here
            # Re-saving a step (a signal at a checkpoint step): move the old copy aside with a
            # rename first, so a kill never leaves a half-deleted step_* that latest() would pick.
            if old.exists():
                shutil.rmtree(old)
            if final.exists():
                os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # dcp's CheckpointException is a BaseException
        failed = e
    # rank 0's part can fail alone (meta.json): the ranks agree instead of a barrier
    flag = torch.tensor(
        [failed is not None], dtype=torch.int32, device="cuda" if "nccl" in dist.get_backend() else "cpu"
    )
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if not flag.item():
        if rank == 0:
            log.info("checkpoint saved: %s", final)
        return final
    cause = _failure(failed, root, state) if failed is not None else "another rank failed"
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        if old.exists() and not final.exists():  # failed between the two renames
            os.replace(old, final)
    previous = latest(root)
    kept = f"the previous checkpoint {previous[1]} is kept" if previous else "no earlier checkpoint exists"
    raise CheckpointError(
        f"checkpoint save to {str(final)!r} failed: {cause}; {kept}; expected a writable "
        "trainer.checkpoint_dir with room for a checkpoint",
        exit_code=1,
    )


def _failure(e: BaseException, root: Path, state: Any) -> str:
    """Why a save failed, read before its ``.tmp`` is removed: the OSError at its root (torch's
    CheckpointException holds every rank's), else the filesystem's own word when it has less room
    than a checkpoint takes (torch's zip writer reports a short write as "unexpected pos 704 vs
    598" and loses ENOSPC), else the first line of the error."""
    seen = [e, *(f[0] if isinstance(f, tuple) else f for f in (getattr(e, "failures", None) or {}).values())]
    found: OSError | None = None
    for x in seen:
        while x is not None and found is None:
            if isinstance(x, OSError) and x.strerror:
                found = x
            x = x.__cause__ or x.__context__
    mount = root
    while not os.path.ismount(mount) and mount.parent != mount:
        mount = mount.parent
    try:
        st = os.statvfs(root)
        free, total = st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize
    except OSError:
        free = total = -1
    previous = latest(root)
    need = max(sum(f.stat().st_size for f in previous[1].iterdir()) if previous else 0, _nbytes(state))
    if found is not None and found.errno not in (errno.ENOSPC, errno.EFBIG):
        return str(found.strerror)
    if found is None and not 0 <= free < need:
        text = str(seen[1] if len(seen) > 1 else e)
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        return lines[0] if lines else type(e).__name__
    return (
        f"No space left on device: {free} bytes free of {total} on {mount} (statvfs of {root}), "
        f"a checkpoint takes about {need} bytes"
    )


def _nbytes(obj: Any) -> int:
    """The bytes of the tensors in a (nested) state dict, a sharded tensor's whole."""
    if isinstance(obj, (dict, list, tuple)):
        return sum(_nbytes(v) for v in (obj.values() if isinstance(obj, dict) else obj))
    return int(obj.nbytes) if hasattr(obj, "nbytes") and hasattr(obj, "dtype") else 0


def load(path: Path, parts: Any, optimizers: Any) -> int:
    """Collective: load each part's model and optimizer state in place (resharded by DCP when the checkpoint
    was saved on another layout); returns the saved step."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict

    meta = json.loads((path / "meta.json").read_text())
    flat = meta.get("optim_state") == "flat"  # nested: saved by an earlier numarun, whose ranks held one part
    parts, optimizers = _listed(parts), _listed(optimizers)
    pairs, state = _states(parts, optimizers, flat=flat)
    _agree_holds(path, state, optimizer=type(optimizers[0]).__name__)
    running = [_implementation(optim_sd) for _, optim_sd in pairs]
    dcp.load(state, checkpoint_id=str(path))
    options = StateDictOptions(flatten_optimizer_state_dict=flat)
    for (model_sd, optim_sd), own, part, opt in zip(pairs, running, parts, optimizers, strict=True):
        # DCP loads tensors in place and puts the other values (lr, momentum...) into the merged dict: read it
        set_model_state_dict(part, {k: state["model"][k] for k in model_sd})
        loaded = {k: state["optim"][k] for k in optim_sd} if flat else state["optim"]
        set_optimizer_state_dict(part, opt, _with_implementation(loaded, own), options=options)
    return int(meta["step"])


def _agree_holds(path: Path, state: Mapping[str, Any], *, optimizer: str) -> None:
    """Collective: :func:`check_holds` for what each rank loads (its stages' part), every rank refusing when one
    does (a rank alone would leave the others waiting in DCP's load)."""
    try:
        check_holds(path, tensors(state), whole=False, optimizer=optimizer)
        why = ""
    except CheckpointError as e:
        why = str(e)
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        every: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(every, why)
        why = next((w for w in every if w), "")
    if why:
        raise CheckpointError(why)


IMPLEMENTATION = ("foreach", "fused", "capturable", "differentiable")
"""Param-group keys that say how this layout's optimizer runs its step, not what it has learnt: a resume keeps the
running optimizer's own (a fused AdamW's checkpoint resumed under tensor parallelism, whose DTensors need the
per-tensor path, failed its first step with 'mixed torch.Tensor and DTensor'; the other way it ran the slow loop)."""


def _implementation(optim_sd: dict[str, Any]) -> dict[str, Any]:
    """The :data:`IMPLEMENTATION` values of an optimizer state dict, flat (``param_groups.<name>.<key>``) or
    nested (``param_groups``: a list of groups)."""
    if isinstance(optim_sd.get("param_groups"), list):
        return {"param_groups": [{k: g[k] for k in IMPLEMENTATION if k in g} for g in optim_sd["param_groups"]]}
    return {
        k: v for k, v in optim_sd.items() if k.startswith("param_groups.") and k.rpartition(".")[2] in IMPLEMENTATION
    }


def _with_implementation(loaded: dict[str, Any], own: dict[str, Any]) -> dict[str, Any]:
    """``loaded`` (a checkpoint's optimizer state) with the running optimizer's :data:`IMPLEMENTATION` keys."""
    if "param_groups" not in own:
        return {**loaded, **own}
    groups = [{**g, **mine} for g, mine in zip(loaded["param_groups"], own["param_groups"], strict=True)]
    return {**loaded, "param_groups": groups}
