"""The documentation site's generated parts, and the MkDocs hook that puts them in the pages.

The reference pages hold markers such as ``<!-- generated: commands -->``; at build time
(``mkdocs build``, ``mkdocs serve``) :func:`on_page_markdown` replaces each with text made here
from the code itself: every command's parser (``numarun.cli.build_parser``), the launch options'
field table (``numarun.options.launch``), the ``NUMARUN_*`` contract (``numarun.envvars``), the job
config's schema (``numarun.config.schema``) and the error tree (``numarun.errors``). Nothing of it
is written by hand or kept in git, so a new flag, variable or config key shows up with no edit.

Print one part: ``.venv/bin/python scripts/docs_hooks.py commands|environment|config|errors``.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import enum
import html
import inspect
import io
import re
import sys
import tokenize
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

MARKER = re.compile(r"<!--\s*generated:\s*([\w-]+)\s*-->")
HIDDEN_COMMANDS = ("slurm-node",)
"""Commands numarun starts itself (the node task of ``numarun submit``): listed apart."""


CODE_SPAN = re.compile(r"(`+)(.+?)\1")


def _cell(text: object) -> str:
    """Text for one Markdown table cell, on one line: ``<`` and ``&`` escaped outside code spans (help texts
    write ``<host>:<port>``, which Markdown would take for a tag), pipes escaped everywhere."""
    text = " ".join(str(text).split())
    out, end = [], 0
    for m in CODE_SPAN.finditer(text):
        out.append(html.escape(text[end : m.start()], quote=False))
        out.append(m.group(0))
        end = m.end()
    out.append(html.escape(text[end:], quote=False))
    return "".join(out).replace("|", "\\|")


def _code(text: object) -> str:
    text = str(text)
    if not text:
        return "`''`"
    return f"`` {text} ``" if "`" in text else f"`{text}`"


# ---------------------------------------------------------------- commands


def command_parsers() -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """(name, parser) of every command, each built as ``numarun NAME --help`` builds it."""
    from numarun import cli

    for name in cli.COMMANDS:
        parser = cli.build_parser(only=name)
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))  # noqa: SLF001
        yield name, sub.choices[name]


def _fields_by_dest(parser: argparse.ArgumentParser) -> dict[str, Any]:
    return {f.dest: f for f in parser.get_default("launch_options") or ()}


def _default(action: argparse.Action, field: Any) -> str:
    default = field.default if field is not None else action.default
    if default in (None, argparse.SUPPRESS, False) or isinstance(action, argparse._HelpAction):  # noqa: SLF001
        return ""
    if isinstance(default, enum.Enum):
        default = default.value
    owner = f" ({field.owner})" if field is not None and field.owner != "numarun" else ""
    return _code(default) + owner


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    if not action.help:
        return ""
    formatter = parser._get_formatter()  # noqa: SLF001  (argparse's own %(default)s expansion)
    try:
        return formatter._expand_help(action)  # noqa: SLF001
    except (KeyError, TypeError, ValueError):
        return action.help


def _option_names(action: argparse.Action) -> str:
    metavar = ""
    if action.nargs != 0:
        if action.choices is not None and not action.metavar:
            metavar = "{" + ",".join(str(c) for c in action.choices) + "}"
        else:
            metavar = str(action.metavar or action.dest.upper())
    names = action.option_strings or [str(action.metavar or action.dest)]
    return ", ".join(_code(f"{n} {metavar}".strip() if action.option_strings else n) for n in names)


def command_reference(name: str, parser: argparse.ArgumentParser) -> str:
    fields = _fields_by_dest(parser)
    out = [f"## `numarun {name}`\n"]
    if parser.description:
        out.append(f"{parser.description}\n")
    page = parser.epilog or ""
    if page:
        out.append(f"*{_cell(page)}*\n")
    out.append("```text\n" + parser.format_usage().strip() + "\n```\n")
    env_column = bool(fields)
    header = "| option | default |" + (" variable |" if env_column else "") + " what it does |"
    out.append(header)
    out.append("|---|---|" + ("---|" if env_column else "") + "---|")
    subcommands = []
    for action in parser._actions:  # noqa: SLF001  (argparse lists its actions nowhere else)
        if action.help == argparse.SUPPRESS:
            continue
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            subcommands += list(action.choices.items())
            what = "one of: " + ", ".join(f"`{n}`" for n in action.choices)
            out.append(f"| {_code(action.metavar or action.dest)} | | " + ("| " if env_column else "") + f"{what} |")
            continue
        field = fields.get(action.dest)
        row = f"| {_option_names(action)} | {_default(action, field)} |"
        if env_column:
            row += f" {_code(field.variable) if field is not None else ''} |"
        out.append(row + f" {_cell(_help(parser, action))} |")
    text = "\n".join(out) + "\n"
    for sub_name, sub in subcommands:
        text += "\n" + command_reference(f"{name} {sub_name}", sub)
    return text


def commands_markdown() -> str:
    parts = []
    hidden = []
    for name, parser in command_parsers():
        (hidden if name in HIDDEN_COMMANDS else parts).append(command_reference(name, parser))
    if hidden:
        parts.append("## Started by numarun itself\n\nNot for typing: `numarun submit`'s batch script runs these.\n")
        parts.extend(h.replace("## ", "### ", 1) for h in hidden)
    return "\n".join(parts)


# ---------------------------------------------------------------- environment


def source_comments(path: Path) -> dict[int, str]:
    """line number -> the comment on that line (without ``#``), for a module's source."""
    comments = {}
    with path.open(encoding="utf-8") as f:
        for tok in tokenize.generate_tokens(f.readline):
            if tok.type == tokenize.COMMENT:
                comments[tok.start[0]] = tok.string.lstrip("#").strip()
    return comments


def assignment_comments(path: Path) -> dict[str, str]:
    """NAME -> the comment of ``NAME = ...`` in a module: on its line, else the comment lines just above."""
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    comments = source_comments(path)
    alone = {n: c for n, c in comments.items() if lines[n - 1].lstrip().startswith("#")}  # a comment line of its own
    found = {}
    for node in ast.parse(source).body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            text = comments.get(node.lineno, "")
            line = node.lineno - 1
            above = []
            while not text and line in alone:
                above.insert(0, alone[line])
                line -= 1
            text = text or " ".join(above)
            for t in targets:
                if isinstance(t, ast.Name):
                    found[t.id] = text
    return found


def environment_markdown() -> str:
    from numarun import envvars

    out = [
        "## Launch options\n",
        "Each launch option's variable, below the command line and above the job config "
        "([where options come from](../run.md#where-each-option-comes-from)). A switch's `NUMARUN_*` variable "
        "takes `1`/`0`, `true`/`false`, `yes`/`no` or `on`/`off` (any case); a `PET_*` one an integer, as torchrun "
        "reads it.\n",
        "| variable | option | default |",
        "|---|---|---|",
    ]
    parser = dict(command_parsers())["run"]
    for f in (f for f in parser.get_default("launch_options") or () if f.variable):
        default = (
            ""
            if f.default in (None, False)
            else _code(f.default.value if isinstance(f.default, enum.Enum) else f.default)
        )
        out.append(f"| {_code(f.variable)} | {_code(f.flag)} | {default} ({_cell(f.owner)}) |")
    comments = assignment_comments(Path(inspect.getfile(envvars)))
    out += [
        "",
        "## numarun's own variables\n",
        "The `NUMARUN_*` contract between the launcher, the workers, the trainer and the batch script "
        "(`numarun.envvars`). Most are set by numarun for its own processes; the ones a user sets are "
        "named in the guides.\n",
        "| variable | meaning |",
        "|---|---|",
    ]
    names = {v: k for k, v in vars(envvars).items() if k.isupper() and isinstance(v, str) and v.startswith("NUMARUN_")}
    for var in sorted(envvars.ALL):
        out.append(f"| {_code(var)} | {_cell(comments.get(names[var], ''))} |")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- config


def attribute_docs(cls: type) -> dict[str, str]:
    """name -> the string literal just after ``name = ...`` in a class body (Enum members' docs)."""
    tree = ast.parse(inspect.getsource(cls))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs = {}
    for node, nxt in zip(body, body[1:]):
        if (
            isinstance(node, ast.Assign)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    docs[t.id] = " ".join(nxt.value.value.split())
    return docs


def _field_comments(cls: type) -> dict[str, str]:
    lines, start = inspect.getsourcelines(cls)
    comments = {}
    for tok in tokenize.generate_tokens(io.StringIO("".join(lines)).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
    found = {}
    for node in ast.parse("".join(lines)).body[0].body:  # type: ignore[attr-defined]
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            found[node.target.id] = comments.get(node.lineno, "")
    return found


def _type_name(annotation: object) -> str:
    text = str(annotation)
    m = re.fullmatch(r"Optional\[(.+)\]", text)
    return f"{m.group(1)} or null" if m else text


def launcher_rows() -> list[str]:
    """The ``launcher`` group: a key per launch option that declares one (``numarun.options.launch.LaunchOptions``),
    every one null (not set); what it does is its option's help."""
    from numarun.options.launch import config_keys, option

    rows = []
    for key, kind in config_keys():
        o = option(key)
        value = o.default.value if isinstance(o.default, enum.Enum) else o.default
        default = o.default_text or _code(value)
        what = (
            f"{' '.join(o.help.split())} (the option `{o.flag}`, `{o.variable}`; its default: {default}, {o.owner}'s)"
        )
        if isinstance(o.default, enum.Enum):
            docs = attribute_docs(type(o.default))
            what += "; one of " + "; ".join(
                f"`{m.value}`" + (f": {docs[m.name]}" if m.name in docs else "") for m in type(o.default)
            )
        rows.append(f"| {_code('launcher.' + key)} | {kind.__name__} or null | null | {_cell(what)} |")
    return rows


def config_markdown() -> str:
    from numarun.config import schema

    out = []
    for group in dataclasses.fields(schema.JobConfig):
        cls = typing.cast(type, group.default_factory)  # type: ignore[misc]
        doc = inspect.getdoc(cls) or ""
        out.append(f"## `{group.name}`\n")
        if doc and not doc.startswith(cls.__name__ + "("):
            out.append(doc.splitlines()[0] + "\n")
        out += ["| key | type | default | what it does |", "|---|---|---|---|"]
        if group.name == "launcher":
            out += [*launcher_rows(), ""]
            continue
        comments = _field_comments(cls)
        for f in dataclasses.fields(cls):
            key = f"{group.name}.{f.name}"
            default = f.default if f.default is not dataclasses.MISSING else None
            what = comments.get(f.name, "")
            enum_type = schema.ENUM_KEYS.get(key)
            if enum_type is not None:
                member_docs = attribute_docs(enum_type)
                choices = "; ".join(
                    f"`{m.value}`" + (f": {member_docs[m.name]}" if m.name in member_docs else "") for m in enum_type
                )
                what = (what + "; " if what else "") + f"one of {choices}"
            shown = "null" if default is None else _code(default.value if isinstance(default, enum.Enum) else default)
            out.append(f"| {_code(key)} | {_cell(_type_name(f.type))} | {shown} | {_cell(what)} |")
        out.append("")
    return "\n".join(out)


# ---------------------------------------------------------------- errors


def errors_markdown() -> str:
    from numarun import errors

    out = ["| error | exit code | raised when |", "|---|---|---|"]
    for _, cls in inspect.getmembers(errors, inspect.isclass):
        if issubclass(cls, errors.NumarunError):
            doc = (inspect.getdoc(cls) or "").splitlines()[0]
            page = getattr(cls, "page", None)
            if page:
                doc += f" (errors name the page: [{page}](../{page}))"
            out.append(f"| `{cls.__name__}` | {cls.exit_code} | {_cell(doc)} |")
    return "\n".join(out) + "\n"


PARTS: dict[str, Callable[[], str]] = {
    "commands": commands_markdown,
    "environment": environment_markdown,
    "config": config_markdown,
    "errors": errors_markdown,
}


def expand(markdown: str, where: str = "page") -> str:
    """``markdown`` with every generated-part marker replaced; an unknown marker is an error."""

    def part(m: re.Match[str]) -> str:
        name = m.group(1)
        if name not in PARTS:
            raise ValueError(f"{where}: unknown generated part {name!r}: expected one of {', '.join(PARTS)}")
        return PARTS[name]()

    return MARKER.sub(part, markdown)


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    """MkDocs hook (``hooks:`` in mkdocs.yml)."""
    return expand(markdown, where=page.file.src_path)


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in PARTS:
        sys.exit(f"usage: {sys.argv[0]} {'|'.join(PARTS)}")
    print(PARTS[sys.argv[1]]())
