"""The checkout stays buildable: no directory symlink points back up the tree.

setuptools walks the whole project directory following links when it builds the package
(``pip install -e .`` in scripts/setup.sh); a link to an ancestor, such as the ones inside
recorded sysfs trees, makes that walk endless. Recorded trees are therefore extracted
outside the checkout (tests/conftest.py).
"""

import os
import re
from pathlib import Path

import pytest
from helpers import REPO
from trees import EXTRACTED, H200_TARBALL, extract_tree

# what the build never packs: the venvs (.venv-wheel is the installed-wheel test), caches, git
SKIP = {".git", ".venv", ".venv-wheel", "__pycache__", ".pytest_cache", ".hypothesis", ".mypy_cache", ".ruff_cache"}


def test_fixture_trees_are_extracted_outside_the_checkout() -> None:
    root = extract_tree(H200_TARBALL).resolve()
    assert REPO not in root.parents and REPO not in EXTRACTED.resolve().parents


def test_walking_the_checkout_through_links_ends() -> None:
    """Walk as setuptools does, following links: a directory inside itself is a cycle."""
    cycles: list[str] = []
    budget = [200_000]

    def walk(path: Path, chain: tuple[str, ...]) -> None:
        real = os.path.realpath(path)
        if real in chain:
            cycles.append(str(path.relative_to(REPO)))
            return
        budget[0] -= 1
        if budget[0] < 0 or len(cycles) > 5:
            return
        with os.scandir(path) as it:
            subdirs = [Path(e.path) for e in it if e.name not in SKIP and e.is_dir(follow_symlinks=True)]
        for sub in subdirs:
            walk(sub, (*chain, real))

    walk(REPO, ())
    assert cycles == [] and budget[0] >= 0


def _test_sources() -> list[Path]:
    """The suite's own Python files: tests and their support modules, not the recorded fixtures nor the programs
    tests run as ranks (tests/support/scripts/, whose sleeps are what a test waits on)."""
    tests = REPO / "tests"
    skip = (("fixtures",), ("golden",), ("support", "scripts"))
    return sorted(p for p in tests.rglob("*.py") if not any(p.relative_to(tests).parts[: len(k)] == k for k in skip))


def _fixed_sleeps(source: str) -> list[int]:
    """Lines of ``time.sleep`` calls outside any ``while`` loop (a poll waits on a condition; a bare
    sleep bets on a duration). Scripts that tests write for their children are strings: not seen."""
    import ast

    found: list[int] = []

    def visit(node: ast.AST, in_loop: bool) -> None:
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "sleep"
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "time"
            and not in_loop
        ):
            found.append(node.lineno)
        for child in ast.iter_child_nodes(node):
            visit(child, in_loop or isinstance(node, ast.While))

    visit(ast.parse(source), False)
    return found


def test_no_test_waits_a_fixed_time() -> None:
    assert _fixed_sleeps("import time\ntime.sleep(1)\nwhile x:\n    time.sleep(0.1)\n") == [2]  # the check itself
    offenders = {p.name: lines for p in _test_sources() if (lines := _fixed_sleeps(p.read_text()))}
    assert offenders == {}, f"tests that sleep instead of waiting on a condition: {offenders}"


CLOCKS = {"monotonic", "perf_counter", "time", "monotonic_ns", "perf_counter_ns", "time_ns"}
DURATION_WORDS = re.compile(r"(?:elapsed|seconds|duration|wall|took)(?:_s|_ms)?")


def _duration_bounds(source: str) -> list[int]:
    """Lines where a measured duration is held below a constant: ``time.monotonic() - t0 < 60``, ``elapsed <= 5``,
    ``head["seconds"] < TIMEOUT``. A duration is a clock reading minus another (a name a clock reading was
    assigned to counts as one), a name such a difference was assigned to, or a name, attribute or key called
    ``elapsed``, ``seconds``, ``duration``, ``wall`` or ``took`` (``_s`` or ``_ms`` after it; not ``est_seconds``,
    a simulation's estimate); a constant is a number or an UPPER_CASE name,
    or arithmetic of them. A lower bound (``elapsed >= 7``: it waited for a timeout) is not one: a loaded machine
    only makes durations longer."""
    import ast

    tree = ast.parse(source)

    def clock_call(node: ast.AST) -> bool:
        if not isinstance(node, ast.Call) or node.args:
            return False
        f = node.func
        return (isinstance(f, ast.Attribute) and f.attr in CLOCKS and ast.unparse(f.value) == "time") or (
            isinstance(f, ast.Name) and f.id in CLOCKS - {"time"}
        )

    readings = {
        t.id
        for n in ast.walk(tree)
        if isinstance(n, ast.Assign) and clock_call(n.value)
        for t in n.targets
        if isinstance(t, ast.Name)
    }

    def reading(node: ast.AST) -> bool:
        return clock_call(node) or (isinstance(node, ast.Name) and node.id in readings)

    def difference(node: ast.AST) -> bool:
        return isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub) and reading(node.left)

    durations = {
        t.id
        for n in ast.walk(tree)
        if isinstance(n, ast.Assign) and difference(n.value)
        for t in n.targets
        if isinstance(t, ast.Name)
    }

    def duration(node: ast.AST) -> bool:
        if difference(node):
            return True
        name = (
            node.id
            if isinstance(node, ast.Name)
            else node.attr
            if isinstance(node, ast.Attribute)
            else node.slice.value
            if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant)
            else None
        )
        return isinstance(name, str) and (name in durations or bool(DURATION_WORDS.fullmatch(name)))

    def constant(node: ast.AST) -> bool:
        if isinstance(node, ast.Constant):
            return isinstance(node.value, (int, float)) and not isinstance(node.value, bool)
        if isinstance(node, ast.Name):
            return node.id.isupper()
        if isinstance(node, ast.UnaryOp):
            return constant(node.operand)
        return isinstance(node, ast.BinOp) and constant(node.left) and constant(node.right)

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            for op, a, b in zip(node.ops, sides, sides[1:]):
                below = isinstance(op, (ast.Lt, ast.LtE)) and duration(a) and constant(b)
                above = isinstance(op, (ast.Gt, ast.GtE)) and constant(a) and duration(b)
                if below or above:
                    found.append(node.lineno)
    return found


def test_no_test_holds_a_duration_below_a_constant() -> None:
    """Never a wall-clock bound in a test (a loaded machine fails it): what it meant is checked without a clock."""
    old = 'head = results[0]\nassert head["seconds"] < 60\n'  # test_doctor_multinode.py had it
    assert _duration_bounds(old) == [2]
    caught = (
        "t0 = time.monotonic()\nrun()\nassert time.monotonic() - t0 < TIMEOUT\n"
        "wall = time.perf_counter() - t0\nassert 2 * TIMEOUT > wall\nassert 0 < r.elapsed <= 5.0\n"
    )
    assert _duration_bounds(caught) == [3, 5, 6]
    passed = (
        "start = time.monotonic()\nassert time.monotonic() - start >= 7\n"  # a lower bound: it waited
        "while time.monotonic() < deadline:\n    pass\n"  # a poll's deadline
        "while time.perf_counter() - start < seconds:\n    pass\n"  # a script's own loop, to a variable
        "assert args.seconds == 3 and head['seconds'] > 0 and r['est_seconds'] < 60\n"
    )
    assert _duration_bounds(passed) == []
    here = Path(__file__).resolve().parent
    offenders = {
        str(p.relative_to(here)): lines
        for p in sorted(here.rglob("*.py"))
        if "fixtures" not in p.parts and (lines := _duration_bounds(p.read_text()))
    }
    assert offenders == {}, f"tests that hold a measured duration below a constant: {offenders}"


def _port_helpers(source: str) -> list[int]:
    """Lines where a socket bound to port 0 is closed again for its number: a free-port helper of its own
    (a socket kept listening, a server the test needs, is not one)."""
    import ast

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.With):
            text = ast.unparse(node)
            if ", 0))" in text and "getsockname()[1]" in text and ".listen(" not in text:
                found.append(node.lineno)
    return found


def test_a_free_port_comes_from_one_helper() -> None:
    assert _port_helpers("with socket.socket() as s:\n    s.bind(('127.0.0.1', 0))\n    p = s.getsockname()[1]\n") == [
        1
    ]
    assert (
        _port_helpers("with socket.socket() as s:\n    s.bind(('', 0))\n    s.listen()\n    p = s.getsockname()[1]\n")
        == []
    )
    offenders = {
        p.name: lines for p in _test_sources() if p.name != "helpers.py" and (lines := _port_helpers(p.read_text()))
    }
    assert offenders == {}, f"tests with a free-port helper of their own (use helpers.free_port): {offenders}"


@pytest.mark.slow
def test_a_run_says_at_its_end_how_many_tests_need_root(tmp_path: Path) -> None:
    import subprocess
    import sys

    (tmp_path / "test_some.py").write_text(
        "import pytest\n\n"
        "def test_mounts():\n    pytest.skip('bind mounts need root')\n\n"
        "def test_netns():\n    pytest.skip('needs root for namespaces')\n\n"
        "def test_other():\n    pytest.skip('mpiexec is not installed (scripts/test.sh installs it as root)')\n\n"
        "def test_listed():\n    pytest.skip('not run here: docs/doctor.md:78 needs root: sudo bash demo.sh')\n\n"
        "def test_fine():\n    pass\n"
    )
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "skips", "-q", "test_some.py"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO / "tests" / "support")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout[-2000:]
    assert f"2 tests skipped for want of root (this run's uid is {os.geteuid()})" in r.stdout, r.stdout[-2000:]
    assert "in test_some.py: run the suite as root to run them" in r.stdout


def test_the_wheel_lists_every_package() -> None:
    """setuptools packs only the packages pyproject.toml names: a new subpackage left out installs a numarun whose
    import fails (the installed-wheel test shows it too, slowly)."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {
        ".".join(("numarun", *p.parent.relative_to(REPO / "launcher").parts))
        for p in (REPO / "launcher").rglob("__init__.py")
    }
    assert found <= listed, sorted(found - listed)


def test_the_tests_are_laid_out_as_docs_testing_says() -> None:
    """docs/testing.md, "Where a test goes": the top level holds the hooks and the suite's own rules only, and no two
    test files share a name (pytest imports each by its name: a second one fails the whole run's collection)."""
    tests = REPO / "tests"
    assert sorted(p.name for p in tests.glob("*.py")) == ["conftest.py", "test_repo_hygiene.py", "test_tiers.py"]
    by_name: dict[str, list[str]] = {}
    for p in _test_sources():
        if p.name.startswith("test_"):
            by_name.setdefault(p.name, []).append(str(p.relative_to(tests)))
    assert {n: paths for n, paths in by_name.items() if len(paths) > 1} == {}
