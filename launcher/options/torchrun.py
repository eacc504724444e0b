"""torchrun's options as torch's own parser declares them, read once per torch version without importing torch in
the launcher (a child interpreter writes them as JSON, kept in the user's cache): the options adopt them
(:mod:`numarun.options.launch`) and ``numarun run``'s parser is built on them."""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import os
import subprocess
import sys
from typing import Any

from ..errors import UsageError
from ..fsutil import cache_dir, write_atomic
from ..torch_private import installed_torch_version

log = logging.getLogger(__name__)


RECORD_FORMAT = 1
"""Bumped when :data:`_RECORD` writes something else: the file name holds it, so an old cache is not read."""

# Run by a child interpreter (the launcher never imports torch for a parser): torchrun's options as JSON.
_RECORD = """
import json, sys
from torch.distributed.run import get_args_parser
out = []
for a in get_args_parser()._actions:
    if a.dest == "help":
        continue
    d = a.default if isinstance(a.default, (str, int, float, bool, list, type(None))) else None
    t = getattr(a.type, "__name__", None)
    out.append({"flags": a.option_strings, "dest": a.dest, "nargs": a.nargs, "default": d, "help": a.help,
                "metavar": a.metavar, "choices": list(a.choices) if a.choices else None, "required": a.required,
                "type": t if t in ("int", "float") else None})
json.dump(out, sys.stdout)
"""


@functools.lru_cache(maxsize=1)
def torchrun_record() -> tuple[dict[str, Any], ...]:
    """torchrun's options (flags, dest, default, help...) of the installed torch, read once per torch version
    by a child interpreter and kept in the user's cache (:func:`numarun.fsutil.cache_dir`); a cache that
    cannot be written is skipped."""
    version = installed_torch_version()
    try:
        path = cache_dir() / f"torchrun-options.{RECORD_FORMAT}.{version}.json" if version else None
    except RuntimeError:  # no home directory to hold a cache
        path = None
    if path is not None:
        with contextlib.suppress(OSError, ValueError):
            return tuple(json.loads(path.read_text(encoding="utf-8")))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PET_")}  # torch's defaults, not the user's
    r = subprocess.run(
        [sys.executable, "-c", _RECORD], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    if r.returncode != 0:
        why = (r.stderr.strip().splitlines() or [f"exit code {r.returncode}"])[-1]
        raise UsageError(f"cannot read torchrun's options from torch {version}: {why}; expected a working torch >= 2.4")
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, r.stdout)
        except OSError as e:
            log.debug("torchrun's options not cached in %s: %s", path, e)
    return tuple(json.loads(r.stdout))


def torchrun_parser() -> argparse.ArgumentParser:
    """A parser with torchrun's options, rebuilt from :func:`torchrun_record` (torch itself parses
    torchrun's argv again when it runs)."""
    parser = argparse.ArgumentParser(description="Torch Distributed Elastic Training Launcher")
    for o in torchrun_record():
        kw: dict[str, Any] = {"help": o["help"], "default": o["default"]}
        if o["nargs"] == 0:
            kw["action"] = "store_true"
        else:
            kw.update(
                nargs=o["nargs"],
                metavar=o["metavar"],
                choices=o["choices"],
                type={"int": int, "float": float}.get(o["type"] or ""),
            )
        if o["flags"]:
            parser.add_argument(*o["flags"], dest=o["dest"], required=o["required"], **kw)
        else:
            parser.add_argument(o["dest"], **kw)
    return parser
