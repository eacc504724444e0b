"""The shell examples of README.md and docs/: found by Sybil's Markdown fence lexer, run as a user would.

The rules a page follows are written for its authors in docs/testing.md ("The docs are tested"): every
code block fenced with a language; ``console`` blocks are sessions (``$ `` commands, then their output),
``bash``/``sh``/``shell`` blocks are scripts; an example that cannot run on a CPU machine carries a title
``needs ...`` from :data:`NEEDS`, which the page shows and the test lists.
"""

from __future__ import annotations

import doctest
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path

from helpers import REPO, clean_env
from sybil import Document, Region
from sybil.parsers.markdown.lexers import RawFencedCodeBlockLexer

PAGES = (REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")))
SHELL = ("console", "bash", "sh", "shell")
INFO = re.compile(r"(?P<language>[^\s`]*)(?P<attributes>[^\n]*)\n")
TITLE = re.compile(r'title="([^"]*)"')
NEEDS = re.compile(
    r"a GPU|root|a Slurm cluster|several nodes|MPI|a container runtime|a package registry|your script"
    r"|\d+ cores|\d+ minutes?"
)
"""What an example may need that a CPU test machine lacks (or a test's time), as its title says."""
SETUP = re.compile(r"^bash scripts/setup\.sh(?: && |\n|$)", re.MULTILINE)
"""The test command ran scripts/setup.sh before any test: an example's call of it is not repeated."""
TIMEOUT = 540


@dataclass(frozen=True)
class Example:
    page: str
    """The page's path under the repository, e.g. ``docs/run.md``."""
    line: int
    language: str
    title: str
    source: str

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def needs(self) -> str | None:
        """What the title says the example needs (``a GPU and root``), or None: it runs here."""
        return self.title[len("needs ") :] if self.title.startswith("needs ") else None

    def bad_mark(self) -> str | None:
        """Why the title's ``needs`` is not one the tests know, or None."""
        needs = self.needs
        if needs is None:
            return None
        what = needs.split(":", 1)[0]
        for item in re.split(r",\s*|\s+and\s+", what):
            if not NEEDS.fullmatch(item.strip()):
                return f"{self.where}: unknown need {item.strip()!r} in title {self.title!r}: expected {NEEDS.pattern}"
        return None


def _parse(document: Document):
    lexer = RawFencedCodeBlockLexer(info_pattern=INFO)
    for region in lexer(document):
        yield Region(region.start, region.end, parsed=region.lexemes)


def examples(pages=PAGES) -> list[Example]:
    """Every fenced block of the pages, in order."""
    found = []
    for path in pages:
        document = Document.parse(str(path), _parse)
        for ex in document:
            lexemes = ex.parsed
            title = TITLE.search(lexemes["attributes"])
            found.append(
                Example(
                    str(Path(path).relative_to(REPO)),
                    ex.line,
                    lexemes["language"],
                    title.group(1) if title else "",
                    str(lexemes["source"]),
                )
            )
    return found


def shell_examples(pages=PAGES) -> list[Example]:
    return [e for e in examples(pages) if e.language in SHELL]


def session(source: str) -> list[tuple[str, str]]:
    """A console block as (command, expected output) pairs; a line ending in ``\\`` continues its command."""
    steps: list[tuple[list[str], list[str]]] = []
    continuing = False
    for line in source.splitlines():
        if continuing:
            steps[-1][0].append(line)
        elif line.startswith("$ "):
            steps.append(([line[2:]], []))
        elif steps:
            steps[-1][1].append(line)
        else:
            raise ValueError(f"output before the first command: {line!r}")
        continuing = line.endswith("\\") and not steps[-1][1]
    return [("\n".join(cmd), "\n".join(out)) for cmd, out in steps]


KEPT = frozenset({".venv"})
"""Ignored entries an example needs all the same: the environment ``scripts/setup.sh`` made."""


def ignored(repo: Path) -> list[str]:
    """The top-level patterns of ``repo``'s .gitignore (``/outputs/`` -> ``outputs``, ``.venv/`` -> ``.venv``)."""
    path = repo / ".gitignore"
    lines = path.read_text(encoding="utf-8").splitlines() if path.is_file() else []
    return [line.strip().strip("/") for line in lines if line.strip() and not line.startswith(("#", "!"))]


def farm(tmp: Path, repo: Path = REPO) -> Path:
    """A directory standing for a fresh clone's top level: a link to each entry of the checkout, so that what an
    example reads is the repository's and what it writes lands here. What the checkout ignores (the runs a user
    made, ``outputs/`` and ``multirun/``, caches, builds) is not linked: an example sees a fresh clone, whatever
    was run in this one before."""
    patterns = ignored(repo)
    for entry in repo.iterdir():
        if entry.name == ".git" or (entry.name not in KEPT and any(fnmatch(entry.name, p) for p in patterns)):
            continue
        (tmp / entry.name).symlink_to(entry)
    return tmp


def environment() -> dict[str, str]:
    env = clean_env(COLUMNS="100", TERM="dumb")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.pop("NO_COLOR", None)
    return env


def run(command: str, cwd: Path) -> tuple[int, str]:
    command = SETUP.sub("", command)
    proc = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", command],
        cwd=cwd,
        env=environment(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=TIMEOUT,
    )
    return proc.returncode, proc.stdout


def _normal(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip("\n").splitlines()) + "\n"


def matches(want: str, got: str) -> bool:
    """``got`` is what the page shows, ``...`` standing for any text (doctest's ELLIPSIS)."""
    return doctest.OutputChecker().check_output(_normal(want), _normal(got), doctest.ELLIPSIS)


def check(example: Example, cwd: Path) -> None:
    """Run the example; AssertionError naming the page and line when it does not do what the page shows."""
    if example.language == "console":
        for command, want in session(example.source):
            code, got = run(command, cwd)
            where = f"{example.where}: $ {command}"
            if not want.strip():
                assert code == 0, f"{where}\nexited {code}:\n{got}"
                continue
            assert "Traceback (most recent call last)" not in got or "Traceback" in want, f"{where}\n{got}"
            assert matches(want, got), f"{where}\nthe page shows:\n{want}\nit printed:\n{got}"
    else:
        code, got = run(example.source, cwd)
        assert code == 0, f"{example.where}: exited {code}:\n{got}"
