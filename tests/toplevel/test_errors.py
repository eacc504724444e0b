"""The error tree (``numarun/errors.py``): every error numarun raises for others to catch is defined there, under
``NumarunError``; a message is built once, where it is raised, and never rewritten or matched afterwards."""

from __future__ import annotations

import ast
import builtins
from pathlib import Path

import pytest
from helpers import REPO

from numarun import errors
from numarun.errors import NumarunError

LAUNCHER = REPO / "launcher"
PLUGIN = LAUNCHER.parent / "hydra_plugins"
BUILTIN_EXCEPTIONS = {n for n, v in vars(builtins).items() if isinstance(v, type) and issubclass(v, BaseException)}


def _exception_classes(path: Path) -> list[tuple[str, int, list[str]]]:
    """(name, line, bases) of each class ``path`` defines whose bases name an exception: a built-in one, one
    defined in the same file, or an error of ``numarun.errors``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    known = BUILTIN_EXCEPTIONS | {n for n in vars(errors) if isinstance(getattr(errors, n), type)}
    found = []
    for node in ast.walk(tree):  # a file's classes in order: a class deriving from one defined above it counts
        if isinstance(node, ast.ClassDef):
            bases = [ast.unparse(b).rsplit(".", 1)[-1] for b in node.bases]
            if known & set(bases):
                known.add(node.name)
                found.append((node.name, node.lineno, bases))
    return found


def test_every_error_class_is_defined_in_errors_py() -> None:
    """A public exception class outside errors.py is refused; a module's private control-flow exception (named
    with a leading underscore, e.g. config/compose.py's ``_Stopped``) may stay where it is used."""
    outside = [
        f"{path.relative_to(LAUNCHER.parent)}:{line} {name}({', '.join(bases)})"
        for root in (LAUNCHER, PLUGIN)
        for path in sorted(root.rglob("*.py"))
        if path != LAUNCHER / "errors.py"
        for name, line, bases in _exception_classes(path)
        if not name.startswith("_")
    ]
    assert outside == [], "define these in launcher/errors.py, under NumarunError:\n" + "\n".join(outside)


def test_the_walk_finds_what_it_refuses(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from ..errors import UsageError\n"
        "class A(ValueError): pass\n"
        "class B(A): pass\n"
        "class C(UsageError): pass\n"
        "class _D(BaseException): pass\n"
        "class E: pass\n"
    )
    assert [n for n, _, _ in _exception_classes(bad)] == ["A", "B", "C", "_D"]


def test_errors_py_holds_one_tree() -> None:
    """Every exception class of errors.py derives from NumarunError: one base the CLI prints as one line."""
    classes = [v for v in vars(errors).values() if isinstance(v, type) and issubclass(v, BaseException)]
    assert len(classes) > 15 and all(issubclass(c, NumarunError) for c in classes)
    assert {c.__module__ for c in classes} == {"numarun.errors"}


def test_a_schema_error_is_still_a_value_error() -> None:
    """Readers that skip what does not parse catch JSON's errors and the schema's as ValueError."""
    with pytest.raises(ValueError):
        raise errors.SchemaError("$.x: expected a number")
    assert errors.SchemaError("$").exit_code == 2


@pytest.mark.parametrize(
    ("error", "code", "page"),
    [
        (errors.RunFailed("rank 0 exited with 3", 3), 3, None),
        (errors.NoStepReport("no report yet"), 3, "steps.md"),
        (errors.NoStepReport("cannot read it", 1), 1, "steps.md"),
        (errors.StacksUnavailable("no job"), 1, "hangs.md"),
        (errors.DoctorError("node 2 missing"), 1, None),
        (errors.TuneRunFailed("candidate failed"), 1, None),
        (errors.ControllerError("no answer"), 2, "slurm.md"),
        (errors.JobConflict("bad --nnodes", node_varying=True), 2, "slurm.md"),
        (errors.LayoutError("bad --mesh 'tp=3'", where="--mesh"), 2, "layouts.md"),
        (errors.LayoutError("bad parallel.tp 3", where=errors.TRAINER_LAYOUT), 2, "trainer.md"),
    ],
)
def test_each_error_keeps_its_exit_code_and_page(error: NumarunError, code: int, page: str | None) -> None:
    assert error.exit_code == code and error.page == page
    assert error.line().endswith(f"(see {errors.page_url(page)})" if page else str(error))


def test_no_message_is_matched_or_rewritten() -> None:
    """Context travels in attributes: nothing in the package rewrites an error's text (``str(e).replace``) or
    reads its wording back (``"expected" in msg``, ``msg.index(...)``)."""
    found = []
    for path in sorted(LAUNCHER.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("replace", "index")
                and isinstance(node.func.value, ast.Call)
                and ast.unparse(node.func.value) in ("str(e)", "str(err)", "str(exc)", "str(error)")
            ) or (isinstance(node, ast.Compare) and ast.unparse(node).startswith("'expected' in ")):
                found.append(f"{path.relative_to(LAUNCHER)}:{node.lineno} {ast.unparse(node)[:80]}")
    assert found == []
