"""Which kind of program numarun is about to launch, from its module name or source (never imported in the launcher)."""

from __future__ import annotations

import ast
import enum
import importlib.util
import re
from pathlib import Path


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
    if is_hydra_main(source):
        return AppKind.HYDRA_MAIN
    if runs_trainer(source):
        return AppKind.TRAINER
    return AppKind.PLAIN


def runs_trainer(source: str) -> bool:
    """The script imports ``main`` from ``numarun.train`` or calls ``numarun.train.main`` (borrowing parts does not
    count)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return re.search(r"from\s+numarun\.train\s+import\s[^\n]*\bmain\b|\bnumarun\.train\.main\b", source) is not None
    trainer_modules = {"numarun.train"}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "numarun.train":
            if any(a.name in ("main", "*") for a in node.names):
                return True
        elif isinstance(node, ast.ImportFrom) and node.module == "numarun":
            trainer_modules.update(a.asname or a.name for a in node.names if a.name == "train")
        elif isinstance(node, ast.Import):
            trainer_modules.update(a.asname for a in node.names if a.name == "numarun.train" and a.asname)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "main" and ast.unparse(node.value) in trainer_modules:
            return True
    return False


def is_hydra_main(source: str) -> bool:
    """The script decorates a function with ``@hydra.main(...)``."""
    if "main" not in source:
        return False
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return "@hydra.main" in source
    return any(
        isinstance(dec, ast.Call)
        and isinstance(dec.func, ast.Attribute)
        and dec.func.attr == "main"
        and getattr(dec.func.value, "id", "") == "hydra"
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        for dec in node.decorator_list
    )
