"""``numarun/envvars.py`` is the ``NUMARUN_*`` contract: a variable's name is written there once, and every module
that sets or reads it takes the constant, so that a name cannot drift between the side that sets it and the side
that reads it. Docstrings and comments may name a variable; code may not spell one. The prefix alone
(``"NUMARUN_"``, which numarun's options put before their names) names no variable."""

from __future__ import annotations

import ast
import re

from helpers import REPO

from numarun import envvars

NAME = re.compile(r"NUMARUN_[A-Z0-9]")
ENVVARS = REPO / "launcher" / "envvars.py"


def spelled_names(source: str) -> list[tuple[int, str]]:
    """(line, text) of each string in ``source``'s code (f-strings' parts included) that spells a ``NUMARUN_*``
    name; docstrings, a string standing alone as a statement, are none."""
    tree = ast.parse(source)
    docstrings = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    return [
        (n.lineno, n.value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings and NAME.search(n.value)
    ]


def test_the_check_sees_a_name_spelled_in_code() -> None:
    source = (
        '"""Reads ``NUMARUN_PLAN``."""\n'
        "import os\n"
        "# NUMARUN_PLAN, in a comment\n"
        'plan = os.environ.get("NUMARUN_PLAN")\n'
        'print(f"bad NUMARUN_RUN_DIR {plan}")\n'
        'prefix = "NUMARUN_"\n'
    )
    assert [line for line, _ in spelled_names(source)] == [4, 5]


def test_a_variable_is_named_only_in_envvars() -> None:
    sources = sorted([*(REPO / "launcher").rglob("*.py"), *(REPO / "hydra_plugins").rglob("*.py")])
    assert ENVVARS in sources
    spelled = {
        f"{path.relative_to(REPO)}:{line}": text
        for path in sources
        if path != ENVVARS
        for line, text in spelled_names(path.read_text(encoding="utf-8"))
    }
    assert spelled == {}, f"NUMARUN_* names spelled outside numarun/envvars.py (use its constants): {spelled}"


def test_each_variable_is_declared_once() -> None:
    names = [v for k, v in vars(envvars).items() if k.isupper() and isinstance(v, str)]
    assert len(names) == len(set(names)) == len(envvars.ALL), sorted(names)
    assert all(NAME.match(name) for name in names)
