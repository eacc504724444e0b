"""Each public class name is defined once in the package: a name says what it is, and no two modules make a reader
(or an import) guess which ``Job`` or ``Summary`` is meant. A private helper's name starts with ``_``."""

from __future__ import annotations

import ast
from collections import defaultdict

from helpers import REPO

LAUNCHER = REPO / "launcher"


def public_classes(source: str) -> list[str]:
    """The module's top-level classes whose names do not start with ``_``."""
    return [n.name for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and not n.name.startswith("_")]


def defined_twice(modules: dict[str, str]) -> dict[str, list[str]]:
    """Public class name -> the modules defining it, for the names more than one module defines."""
    where: defaultdict[str, list[str]] = defaultdict(list)
    for module, source in modules.items():
        for name in public_classes(source):
            where[name].append(module)
    return {name: mods for name, mods in sorted(where.items()) if len(mods) > 1}


def test_the_check_sees_a_name_defined_twice() -> None:
    modules = {
        "a.py": "class Job:\n    pass\n\nclass _Helper:\n    pass\n",
        "b.py": "class Job: ...\nclass _Helper: ...\n",
    }
    assert defined_twice(modules) == {"Job": ["a.py", "b.py"]}
    assert public_classes("def f():\n    class Inner: ...\n") == []  # only the module's own classes


def test_each_public_class_name_is_defined_once() -> None:
    modules = {str(p.relative_to(REPO)): p.read_text() for p in sorted(LAUNCHER.rglob("*.py"))}
    assert len(modules) > 100  # the package was found
    twice = defined_twice(modules)
    assert twice == {}, f"public class names defined in more than one module (rename so each says what it is): {twice}"
