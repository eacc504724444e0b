"""Checks of the trainer's inputs and outputs in the launcher, in one line each, before any run dir exists.

The checkpoint dir can be written (a real probe: root passes ``access(2)`` on a read-only filesystem); with
``trainer.resume``, its checkpoints are trusted and for the same model; with ``data=tokens``, ``data.path``
holds whole tokens, enough of them, every id below ``model.vocab_size``.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError

if TYPE_CHECKING:
    from ..config.files import PreparedJob

log = logging.getLogger(__name__)


def check_writable_dir(path: Path, *, what: str) -> None:
    """``path`` is, or can be created as, a directory this process can write; creates nothing."""
    probe = path
    while not probe.exists() and not probe.is_symlink():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe == path and path.is_symlink():
        raise ConfigError(f"bad {what} {str(path)!r}: it is a symbolic link; expected a real directory")
    if not probe.is_dir():
        raise ConfigError(f"bad {what} {str(path)!r}: {str(probe)!r} is not a directory; expected a writable directory path")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".numarun-probe-", dir=probe))
    except OSError as e:
        where = "it" if probe == path else f"it cannot be created in {str(probe)!r}:"
        raise ConfigError(f"bad {what} {str(path)!r}: {where} {e.strerror}; expected a writable directory") from None


def check_token_file(path: str, *, dtype: str, seq_len: int, vocab_size: int, scan: bool = True) -> int:
    """The number of tokens of a valid token file; one-line ConfigError otherwise."""
    import numpy as np

    try:
        st = os.stat(path)
    except OSError as e:
        raise ConfigError(f"bad data.path {path!r}: {e.strerror}; expected a readable token file") from None
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"bad data.path {path!r}: not a regular file; expected a file of {dtype} token ids")
    item = np.dtype(np.uint16 if dtype == "uint16" else np.int32).itemsize
    if st.st_size % item:
        raise ConfigError(
            f"bad data.path {path!r}: {st.st_size} bytes is not a whole number of {dtype} tokens; "
            f"expected a size that is a multiple of {item} (or data.dtype=int32/uint16 to match the file)"
        )
    tokens = st.st_size // item
    if tokens < seq_len + 2:
        raise ConfigError(f"bad data.path {path!r}: {tokens} tokens; expected at least model.seq_len+2 = {seq_len + 2}")
    if scan:
        data = np.memmap(path, dtype=np.uint16 if dtype == "uint16" else np.int32, mode="r")
        chunk = 1 << 24
        for start in range(0, tokens, chunk):
            part = data[start : start + chunk]
            high, low = int(part.max()), int(part.min())
            if high >= vocab_size or low < 0:
                bad = high if high >= vocab_size else low
                at = start + int(np.argmax(part == bad))
                raise ConfigError(
                    f"bad token id {bad} at position {at} of data.path {path!r}: expected ids from 0 to "
                    f"model.vocab_size-1 = {vocab_size - 1}"
                )
        del data
    return tokens


def check_prepared(job: PreparedJob) -> None:
    """:func:`check_job` for a job the launcher composed (the ``check`` handed to :mod:`numarun.config.compose`)."""
    check_job(job.config, run_dir=job.run_dir)


def check_job(cfg: Any, *, run_dir: Path) -> None:
    """Every check of the module docstring, for one composed trainer config."""
    from ..config.schema import DataKind
    from . import checkpoint

    t = cfg.trainer
    ckpt = Path(os.path.abspath(t.checkpoint_dir)) if t.checkpoint_dir else run_dir / "checkpoints"
    if t.resume and (ckpt.exists() or ckpt.is_symlink()):
        checkpoint.check_trusted(ckpt)  # first: a planted link or file is named as such
    check_writable_dir(ckpt, what="trainer.checkpoint_dir" if t.checkpoint_dir else "checkpoint dir")
    if t.resume and ckpt.exists():
        found = checkpoint.newest_intact(ckpt, report=lambda line: log.warning("%s", line))
        if found is not None:
            meta = json.loads((found[1] / "meta.json").read_text())
            checkpoint.check_model(meta, cfg.model, found[1])
    if cfg.data.kind == DataKind.TOKENS:
        check_token_file(cfg.data.path, dtype=cfg.data.dtype, seq_len=cfg.model.seq_len, vocab_size=cfg.model.vocab_size)
