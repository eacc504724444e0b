"""The documentation site: it builds strictly, its reference is the code's, the help points home, and a
measured figure is stated once (docs/testing.md, "The docs are tested")."""

from __future__ import annotations

import argparse
import importlib.util
import re
from pathlib import Path

import pytest
import yaml
from helpers import FIXTURES, REPO

from numarun import cli, errors

DOCS = REPO / "docs"


def _hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", REPO / "scripts" / "docs_hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _mkdocs() -> dict:
    # mkdocs.yml holds no !tags: the plain loader reads it
    return yaml.safe_load((REPO / "mkdocs.yml").read_text(encoding="utf-8"))


def _nav_pages(nav) -> list[str]:
    pages = []
    for item in nav:
        for value in item.values() if isinstance(item, dict) else [item]:
            pages += _nav_pages(value) if isinstance(value, list) else [value]
    return pages


def _walk(parser: argparse.ArgumentParser, command: str = ""):
    yield command, parser
    for action in parser._actions:  # noqa: SLF001
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            for name, sub in action.choices.items():
                yield from _walk(sub, f"{command} {name}".strip())


# ---------------------------------------------------------------- fast: the links between code and pages


def test_site_url_is_the_one_the_code_names() -> None:
    assert _mkdocs()["site_url"] == errors.DOCS_URL
    assert errors.page_url("slurm.md#per-node") == errors.DOCS_URL + "slurm/#per-node"
    assert errors.page_url("index.md") == errors.DOCS_URL


def test_every_page_is_in_the_nav_and_every_nav_entry_is_a_page() -> None:
    nav = set(_nav_pages(_mkdocs()["nav"]))
    files = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    assert nav == files, (sorted(files - nav), sorted(nav - files))


def test_every_command_has_a_page_that_exists() -> None:
    """A new command needs its line in numarun.cli.HELP_PAGES (and its page in mkdocs.yml's nav)."""
    nav = set(_nav_pages(_mkdocs()["nav"]))
    missing = [name for name in cli.COMMANDS if name not in cli.HELP_PAGES]
    assert not missing, f"commands without a page in numarun.cli.HELP_PAGES: {missing}"
    for command, page in cli.HELP_PAGES.items():
        assert page in nav, f"{command!r}: {page} is not a page of the site"


@pytest.mark.parametrize("command", [c for c in cli.COMMANDS if c != "run"])  # run's parser starts torch's: slow
def test_help_ends_with_its_page(command: str) -> None:
    parser = cli.build_parser(only=command)
    for name, p in _walk(parser):
        if name and not name.startswith(command):
            continue  # the other commands are listed, not built
        page = cli.help_page(name)
        assert page is not None, f"'numarun {name}' has no page in numarun.cli.HELP_PAGES"
        help_text = p.format_help().rstrip()
        assert help_text.endswith(f"Documentation: {errors.page_url(page)}"), help_text[-300:]


def test_error_lines_name_their_page(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["plan", "--topology", str(REPO / "no-such-topology")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.endswith(f"(see {errors.page_url('topology.md')})"), err
    fixture = str(FIXTURES / "nvidia-smi" / "aws-p4d.24xlarge.txt")
    assert cli.main(["plan", "--topology", fixture, "--nproc-per-node", "9"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("numarun: error: bad --nproc-per-node 9") and err.endswith(
        f"(see {errors.page_url('binding.md')})"
    )
    nav = set(_nav_pages(_mkdocs()["nav"]))
    for cls in vars(errors).values():
        if isinstance(cls, type) and issubclass(cls, errors.NumarunError) and cls.page:
            assert cls.page.partition("#")[0] in nav, (cls.__name__, cls.page)


FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)
CITATION = re.compile(r'(?<![\w/.])(README(?:\.md)?|docs/[\w/-]+\.md)(?:,\s+"([^"]+)")?')
README_CITATION = re.compile(r'README(?:\.md)?,\s+"[^"]+"')


def _headings(page: Path) -> set[str]:
    """The headings of a Markdown page, code blocks left out (a ``# comment`` there is none)."""
    return {m.group(1) for m in HEADING.finditer(FENCE.sub("", page.read_text(encoding="utf-8")))}


def _code() -> list[Path]:
    """The package's code and the project's scripts, which cite the docs too."""
    return sorted(p for folder in ("launcher", "hydra_plugins", "scripts") for p in (REPO / folder).rglob("*.py"))


def _citations() -> list[tuple[str, str, str | None, str]]:
    """(source file, cited page, section or None, the text) of every README or docs/ citation in the package's
    code and the scripts (docstrings, comments and messages alike), the lines of a citation joined."""
    found = []
    for path in _code():
        text = " ".join(path.read_text(encoding="utf-8").split())  # a citation may break across lines
        for m in CITATION.finditer(text):
            found.append((str(path.relative_to(REPO)), m.group(1), m.group(2), text[m.start() : m.end() + 40]))
    return found


def test_every_page_the_code_cites_has_the_section_it_names() -> None:
    """``docs/run.md, "Addresses"``: the page exists and has that heading; a README citation names one of the
    README's headings (its sections move to docs/, and a citation of the whole README says nothing)."""
    citations = _citations()
    assert len(citations) > 40, citations  # the pattern finds them
    wrong = []
    for source, page, section, text in citations:
        path = REPO / ("README.md" if page.startswith("README") else page)
        if not path.is_file():
            wrong.append(f"{source}: {page} is no page ({text!r})")
        elif page.startswith("README") and section is None:
            wrong.append(f'{source}: the README cited without a section; expected README, "Heading" ({text!r})')
        elif section is not None and section not in _headings(path):
            wrong.append(f"{source}: {page} has no heading {section!r} ({text!r})")
    assert not wrong, "\n".join(wrong)


def test_a_citation_names_its_section_in_the_form_the_check_reads() -> None:
    """ "the README's (See the plan)" or "README: per-rank mode" would escape the check above: any README in the
    package's code is a citation of the form it reads."""
    loose = []
    for path in _code():
        text = " ".join(path.read_text(encoding="utf-8").split())
        loose += [
            f"{path.relative_to(REPO)}: {text[m.start() : m.start() + 60]!r}"
            for m in re.finditer(r"README", text)
            if not README_CITATION.match(text, m.start())
        ]
    assert not loose, "\n".join(loose)


def test_the_headings_are_read_outside_code_blocks() -> None:
    headings = _headings(DOCS / "run.md")
    assert {"Where each option comes from", "Addresses", "Signals"} <= headings
    assert not any(h.startswith("options (value, source)") for h in headings)  # a console block's comment


# A path the docs cite (docs/testing.md, "The docs are tested"): a word of an inline code span, of a README link, or a
# GitHub link to this repository's files, that starts with a folder of the repository (``tests/``, ``scripts/``...),
# with ``numarun/`` (the package as imported) or with one of the package's folders (``launch/``: the package's own
# path, as the design notes write it), and names a file (its last part has a suffix) or a folder (it ends in ``/``);
# or a test file's bare name (``test_fsutil.py``, names being unique). A ``*`` is a glob; ``<``, ``{``, ``$``,
# ``~`` or ``...`` mark a placeholder, not a path.
REPO_FOLDERS = ("launcher", "tests", "scripts", "docs", "configs", "slurm", "hydra_plugins", ".ci")
PACKAGE_FOLDERS = tuple(sorted(p.parent.name for p in (REPO / "launcher").glob("*/__init__.py")))
GITHUB_FILE = re.compile(r"https://github\.com/numarun/numarun/(?:blob|tree)/[^/\s]+/([^\s)#]+)")
INLINE_CODE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
README_LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")
TEST_NAME = re.compile(r"test_\w+\.py")


def _cited_words(page: Path) -> list[tuple[int, str]]:
    """(line, word) of every word of ``page`` that may be a path: inline code and links, code blocks left out."""
    text = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), page.read_text(encoding="utf-8"))
    spans = [*INLINE_CODE.finditer(text), *GITHUB_FILE.finditer(text)]
    if page.name == "README.md":  # the README's links are the repository's paths; a page's, mkdocs checks
        spans += [m for m in README_LINK.finditer(text) if "://" not in m.group(1)]
    return [(text.count("\n", 0, m.start()) + 1, word.strip(",;:.()'\"")) for m in spans for word in m.group(1).split()]


def cited_path(word: str) -> str | None:
    """``word`` as a path the docs cite, its ``::test`` part kept; None when it is no path by the rule above."""
    if any(mark in word for mark in "<{$~") or "..." in word:
        return None
    path = word.split("::", 1)[0]
    head, _, rest = path.partition("/")
    names_one = bool(rest) and (path.endswith("/") or "." in path.rsplit("/", 1)[-1])
    if names_one and head in (*REPO_FOLDERS, *PACKAGE_FOLDERS, "numarun"):
        return word
    return word if TEST_NAME.fullmatch(path) else None


def missing_path(word: str) -> str | None:
    """Why the cited ``word`` names nothing in the checkout; None when it does."""
    path, _, test = word.partition("::")
    if "/" not in path:  # a test file's bare name
        found = list((REPO / "tests").rglob(path))
    else:
        inside = path.replace("numarun/", "launcher/", 1) if path.startswith("numarun/") else path
        found = [p for base in (REPO, REPO / "launcher") for p in base.glob(inside.rstrip("/")) if p.exists()]
    if not found:
        return f"{path} is no file or folder of the repository (nor of launcher/)"
    if test and not any(re.search(rf"^(?:async )?def {re.escape(test)}\(", p.read_text(), re.M) for p in found):
        return f"{path} has no test {test}"
    return None


def test_the_rule_for_a_cited_path() -> None:
    words = ["tests/e2e/test_wheel.py", "launch/torchrun.py", "numarun/plan/pack.py", "tests/support/", "conftest.py"]
    assert [cited_path(w) for w in words] == [*words[:4], None]
    assert [cited_path(w) for w in ["topology/tree", "hydra/launcher=numarun", "outputs/<date>/", "test_x.py"]] == [
        None,
        None,
        None,
        "test_x.py",
    ]
    assert missing_path("launch/bootstrap.py") is not None and missing_path("worker/bootstrap.py") is None
    assert missing_path("tests/launch/steps/test_steps_*.py") is None and missing_path("tests/nope_*.py") is not None
    assert missing_path("test_fsutil.py") is None and missing_path("test_fsutil.py::test_nope") is not None


def test_every_path_the_docs_cite_exists() -> None:
    """README.md's and every docs/ page's cited paths exist, so that a file moved or renamed takes its citations
    along."""
    cited = [
        (page, line, word)
        for page in [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]
        for line, w in _cited_words(page)
        if (word := cited_path(w))
    ]
    assert len(cited) > 100, cited  # the rule finds them
    wrong = [f"{page.relative_to(REPO)}:{line}: {why}" for page, line, word in cited if (why := missing_path(word))]
    assert not wrong, "\n".join(wrong)


def test_run_page_lists_every_launch_option_as_declared() -> None:
    """docs/run.md's list of numarun's launch options is :data:`numarun.options.launch.DECLARED`'s, in its order;
    torchrun's options numarun refuses are named on the page with why, and where the README and the quick start
    promise that torchrun's options work."""
    from numarun.commands.run import REFUSED_OPTIONS
    from numarun.options.launch import DECLARED

    declared = [o.flag for o in DECLARED if o.flags and o.launch]  # not a command's own setting (--log-level...)
    run = (DOCS / "run.md").read_text(encoding="utf-8")
    lists = [
        re.findall(r"`(--[\w-]+)`", m.group(0))
        for m in re.finditer(r"`--[\w-]+`(?:,? (?:and )?`--[\w-]+`){2,}", " ".join(run.split()))
    ]
    listed = [flags for flags in lists if "--topology" in flags]  # a list of numarun's launch options
    assert listed, "docs/run.md lists no launch options"
    assert all(flags == declared for flags in listed), (listed, declared)
    for page in (DOCS / "run.md", REPO / "README.md", DOCS / "quickstart.md"):
        text = page.read_text(encoding="utf-8")
        for dest in REFUSED_OPTIONS:
            assert f"`--{dest.replace('_', '-')}`" in text, (page.name, dest)


# a figure: a decimal with its unit, a ratio (×, or three decimals), a duration in minutes and seconds, a test count;
# not a version (2.13, 0.2.0) nor a shape (2×4)
FIGURE = re.compile(
    r"(?<![\w.])(?:\d+\.\d+\s?(?:×|ms\b|s\b|GB/s|MB\b|%)|\d+\.\d{3,}(?![\d.])|\d+×(?!\d)"
    r"|\d+ min \d+ s|\d[\d,]* (?:passed|tests))"
)
NOT_MEASURED = {
    # computed byte-count bounds of the hierarchical all-reduce, stated where they are derived (allreduce.md)
    "0.667",
    "0.571",
    "1.5×",
    "3.0×",
    "1.25×",
    "2.5×",
    # settings, not results: the doctor streams each direction for 0.5 s; a slow node is below 0.5 of the median
    "0.5 s",
}


ELSEWHERE = {
    ("docs/scale.md", "0.03 s"): "the store exchange estimated at 8 nodes, another quantity than Measured's",
}


def _figures(text: str) -> set[str]:
    text = re.sub(r"```.*?```", "", text, flags=re.DOTALL)  # commands and their output: not statements
    return {m.group(0) for m in FIGURE.finditer(text)} - NOT_MEASURED


def test_a_measured_figure_is_stated_once() -> None:
    """The Measured page's figures appear on no other page, the README and the CHANGELOG included."""
    measured = _figures((DOCS / "measured.md").read_text(encoding="utf-8"))
    assert len(measured) > 50, sorted(measured)
    others = [REPO / "README.md", REPO / "CHANGELOG.md", *(p for p in DOCS.rglob("*.md") if p.name != "measured.md")]
    again = []
    for page in others:
        found = _figures(page.read_text(encoding="utf-8")) & measured
        again += [
            f"{page.relative_to(REPO)}: {f}" for f in sorted(found) if (str(page.relative_to(REPO)), f) not in ELSEWHERE
        ]
    assert not again, "figures of docs/measured.md stated again:\n" + "\n".join(again)


# ---------------------------------------------------------------- slow: the reference and the build


@pytest.mark.slow  # run's parser reads torchrun's options from the installed torch, in a child interpreter once
def test_run_help_ends_with_its_page() -> None:
    parser = cli.build_parser(only="run")
    sub = dict(_walk(parser))["run"]
    assert sub.format_help().rstrip().endswith(f"Documentation: {errors.page_url('run.md')}")
    assert parser.format_help().rstrip().endswith(f"Documentation: {errors.DOCS_URL}")


@pytest.mark.slow
def test_reference_holds_every_flag_variable_and_key() -> None:
    hooks = _hooks()
    commands = hooks.commands_markdown()
    for name, parser in hooks.command_parsers():
        for _, p in _walk(parser, name):
            for action in p._actions:  # noqa: SLF001
                for flag in action.option_strings:
                    if action.help != argparse.SUPPRESS:
                        assert f"`{flag}" in commands, (name, flag)
    assert "--run-path" not in commands and "--virtual-local-rank" not in commands  # refused: not offered
    assert "## `numarun bench allreduce`" in commands and "--sizes" in commands
    env = hooks.environment_markdown()
    from numarun import envvars

    for var in (*envvars.ALL, "PET_NNODES", "NUMARUN_BINDING", "NUMARUN_STRICT_BINDING"):
        assert f"`{var}`" in env, var
    config = hooks.config_markdown()
    from dataclasses import fields

    from numarun.config.schema import JobConfig

    for group in fields(JobConfig):
        for f in fields(group.default_factory()):  # type: ignore[misc]
            assert f"`{group.name}.{f.name}`" in config, (group.name, f.name)
    assert "`core-complex`: One last-level-cache domain" in config
    assert "| `OutputError` | 1 |" in hooks.errors_markdown()
    with pytest.raises(ValueError, match="unknown generated part 'nope'"):
        hooks.expand("<!-- generated: nope -->")


@pytest.mark.slow
def test_mkdocs_build_strict(tmp_path: Path) -> None:
    """Broken links, missing anchors, pages left out of the nav: each a warning, and strict makes it fatal."""
    from mkdocs.commands.build import build
    from mkdocs.config import load_config

    config = load_config(str(REPO / "mkdocs.yml"), strict=True, site_dir=str(tmp_path / "site"))
    build(config)
    commands = (tmp_path / "site" / "reference" / "commands" / "index.html").read_text(encoding="utf-8")
    assert "--nproc-per-node" in commands and "PET_NNODES" in commands and "generated:" not in commands
    concepts = (tmp_path / "site" / "topology" / "index.html").read_text(encoding="utf-8")
    assert "img/dgx-a100-topo.svg" in concepts
    assert (tmp_path / "site" / "img" / "dgx-a100-plan.svg").exists()
