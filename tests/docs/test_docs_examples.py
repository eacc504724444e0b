"""Every shell example of README.md and docs/ runs, and prints what its page shows (docs/testing.md).

Pages added later are picked up by the glob. An example whose title says it ``needs`` what this machine
lacks (a GPU, root, a Slurm cluster...) is not run: it is listed, page, line and need, as a skipped test
in the run's summary (``-ra``).
"""

from __future__ import annotations

import docs_examples as de
import pytest
from markdown_it import MarkdownIt

EXAMPLES = de.shell_examples()
UNIQUE: dict[str, de.Example] = {}
for _e in EXAMPLES:
    UNIQUE.setdefault(_e.source, _e)  # the same example on two pages (README and Quick start) runs once


def test_every_code_block_is_fenced_with_a_language() -> None:
    """An indented block or a bare fence could hide a shell example from the run below."""
    md = MarkdownIt("commonmark")
    bad = []
    for page in de.PAGES:
        for token in md.parse(page.read_text(encoding="utf-8")):
            where = f"{page.relative_to(de.REPO)}:{token.map[0] + 1 if token.map else '?'}"
            if token.type == "code_block":
                bad.append(f"{where}: an indented code block: fence it and name its language")
            elif token.type == "fence" and not token.info.strip():
                bad.append(f"{where}: a fence without a language (console, bash, text...)")
    assert not bad, "\n".join(bad)


def test_marks_are_known_and_examples_are_found() -> None:
    bad = [m for e in EXAMPLES if (m := e.bad_mark())]
    assert not bad, "\n".join(bad)
    assert len(EXAMPLES) >= 30 and any(e.needs is None for e in EXAMPLES), len(EXAMPLES)
    # the README's first screen: the two set-up commands and the plan of a recorded machine
    readme = [e for e in EXAMPLES if e.page == "README.md"]
    assert readme[0].source.startswith("bash scripts/setup.sh && .venv/bin/numarun scripts/train.py")
    assert readme[1].source.strip() == "bash scripts/test.sh"
    assert readme[2].language == "console" and readme[2].needs is None and "numarun plan --topology" in readme[2].source


def test_examples_run_in_what_a_fresh_clone_holds(tmp_path) -> None:
    """The README's main job leaves outputs/ in the checkout; the examples that run next must not see it (numarun
    refuses a run dir under a symbolic link, so a linked outputs/ failed them after the README's first command)."""
    repo, scratch = tmp_path / "repo", tmp_path / "scratch"
    for name in ("docs", "outputs/2026-01-01/00-00-00", "multirun", ".venv/bin", ".git", "build"):
        (repo / name).mkdir(parents=True)
    (repo / "README.md").write_text("# r\n")
    (repo / ".gitignore").write_text(".venv/\n__pycache__/\n/build/\n/outputs/\n/multirun/\n# a comment\n")
    scratch.mkdir()
    de.farm(scratch, repo)
    assert sorted(p.name for p in scratch.iterdir()) == [".gitignore", ".venv", "README.md", "docs"]
    assert (scratch / "docs").resolve() == (repo / "docs").resolve()


def test_ci_runs_the_readmes_two_commands_in_order() -> None:
    """CI does what a newcomer does: the README's first command, then its test command, as written, in one
    checkout, and nothing after them."""
    readme = [e.source.strip() for e in EXAMPLES if e.page == "README.md"][:2]
    ci = (de.REPO / ".ci" / "run").read_text().splitlines()
    runs = [line for line in ci if line.startswith("run ")]
    assert runs == [f"run '{command}'" for command in readme] and ci[-2:] == runs, ci


def test_session_parsing() -> None:
    assert de.session("$ a \\\n  b\nout 1\nout 2\n$ c\n") == [("a \\\n  b", "out 1\nout 2"), ("c", "")]
    assert de.matches("x ...\n...\nlast\n", "x y z\nmore\nlines\nlast   \n")
    assert not de.matches("rank 0\n", "rank 1\n")
    with pytest.raises(ValueError):
        de.session("output first\n$ cmd\n")


@pytest.mark.slow
@pytest.mark.parametrize("example", list(UNIQUE.values()), ids=[e.where for e in UNIQUE.values()])
def test_shell_example(example: de.Example, tmp_path) -> None:
    if example.needs is not None:
        first = example.source.strip().splitlines()[0]
        pytest.skip(f"not run here: {example.where} needs {example.needs}: {first[:80]}")
    de.check(example, de.farm(tmp_path))
