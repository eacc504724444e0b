"""Which kind of program numarun is about to launch: numarun's trainer, a user's Hydra app, or any script.

Read from the module name or the script's source (never imported here: a user's script is
imported only in the workers, after binding, as its author wrote it).
"""

from __future__ import annotations

import ast
import enum
import importlib.util
import re
from pathlib import Path
from typing import Any


class AppKind(str, enum.Enum):
    """What kind of script numarun is about to launch."""

    TRAINER = "trainer"
    """numarun's reference trainer (numarun.train): composed once by the launcher from numarun's configs/."""
    HYDRA_MAIN = "hydra-main"
    """A user's own ``@hydra.main`` script: run as Hydra runs it, in every rank."""
    PLAIN = "plain"
    """Not a Hydra app: arguments are passed through untouched."""


def _source_of(target: str, *, is_module: bool) -> str | None:
    if is_module:
        try:
            spec = importlib.util.find_spec(target)
        except (ImportError, ValueError):
            return None
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            return None
        path = Path(spec.origin)
    else:
        path = Path(target)
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def detect_app(target: str, *, is_module: bool) -> AppKind:
    """TRAINER, HYDRA_MAIN or PLAIN, from the module name or the script's source."""
    if is_module and (target == "numarun.train" or target.startswith("numarun.train.")):
        return AppKind.TRAINER
    source = _source_of(target, is_module=is_module)
    if source is None:
        return AppKind.PLAIN
    if hydra_main_args(source) is not None:
        return AppKind.HYDRA_MAIN
    if re.search(r"\bnumarun\.train\b|from\s+numarun\s+import\s+train\b", source):
        return AppKind.TRAINER
    return AppKind.PLAIN


def hydra_main_args(source: str) -> dict[str, Any] | None:
    """The literal keyword arguments of a ``@hydra.main(...)`` decorator, or None."""
    if "main" not in source:
        return None
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {} if "@hydra.main" in source else None
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for dec in node.decorator_list:
            if not isinstance(dec, ast.Call):
                continue
            f = dec.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            owner = getattr(f.value, "id", "") if isinstance(f, ast.Attribute) else ""
            if name == "main" and owner == "hydra":
                kwargs: dict[str, Any] = {}
                for i, arg in enumerate(dec.args[:3]):
                    kwargs[("config_path", "config_name", "version_base")[i]] = _literal(arg)
                for kw in dec.keywords:
                    if kw.arg:
                        kwargs[kw.arg] = _literal(kw.value)
                return kwargs
    return None


def _literal(node: ast.AST) -> Any:
    try:
        return ast.literal_eval(node)
    except ValueError:
        return None
