"""``numarun`` command line: ``numarun run|topo|plan|submit|bench|doctor|tune|stacks|top``; ``numarun SCRIPT`` = run.

Each subcommand lives in ``launcher/commands/<name>.py`` and provides
``add_parser(subparsers) -> argparse.ArgumentParser`` and ``main(args) -> int``.
Only the named subcommand's module is imported; ``numarun --help`` lists the others
from the first line of their module docstrings, read without importing them. Help
screens and ``--version`` never import torch (``numarun run --help`` shows torchrun's
options from :func:`numarun.options.torchrun.torchrun_record`).
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from . import __version__
from .errors import NumarunError, OutputError, page_url
from .options.launch import option

# subcommand -> module under numarun.commands
COMMANDS: dict[str, str] = {
    name: name.replace("-", "_")
    for name in ("run", "topo", "plan", "bench", "submit", "doctor", "tune", "stacks", "top", "slurm-node")
}

# command (as typed after numarun; "" for numarun itself) -> the docs page that explains it, ending its help.
# A new command (or a benchmark under 'numarun bench') needs its line here: tests/docs/test_docs_site.py checks.
HELP_PAGES: dict[str, str] = {
    "": "index.md",
    "run": "run.md",
    "topo": "topology.md",
    "plan": "plan.md",
    "bench": "allreduce.md",
    "bench allreduce": "allreduce.md",
    "bench h2d": "gpu.md",
    "submit": "slurm.md",
    "doctor": "doctor.md",
    "tune": "tune.md",
    "stacks": "hangs.md",
    "top": "steps.md",
    "slurm-node": "slurm.md",
}


def help_page(command: str) -> str | None:
    """The page of ``command`` ("bench h2d"), else of the command above it ("bench")."""
    while command not in HELP_PAGES and " " in command:
        command = command.rsplit(" ", 1)[0]
    return HELP_PAGES.get(command)


def _point_home(parser: argparse.ArgumentParser, command: str) -> None:
    """End the help of ``parser`` and of the commands under it with their docs pages."""
    page = help_page(command)
    if page is not None:
        parser.epilog = f"Documentation: {page_url(page)}"
    for action in parser._actions:  # noqa: SLF001  (argparse lists its actions nowhere else)
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            for name, sub in action.choices.items():
                _point_home(sub, f"{command} {name}".strip())


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line on stderr and exit 2 (no usage dump)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def _available_commands() -> dict[str, str]:
    return {
        name: mod for name, mod in COMMANDS.items() if importlib.util.find_spec(f"numarun.commands.{mod}") is not None
    }


def _summary(mod: str) -> str:
    """The first line of a command module's docstring, read from source (no import)."""
    spec = importlib.util.find_spec(f"numarun.commands.{mod}")
    try:
        with open(spec.origin, encoding="utf-8") as f:  # type: ignore[union-attr, arg-type]
            doc = ast.get_docstring(ast.parse(f.read())) or ""
    except (OSError, SyntaxError, TypeError):
        doc = ""
    line = doc.strip().splitlines()[0] if doc.strip() else ""
    if line.startswith("``") and "``: " in line:  # "``numarun plan``: show ..." -> "show ..."
        line = line.split("``: ", 1)[1]
    line = line.split(". ", 1)[0].rstrip(".")  # the first sentence
    return line or f"see 'numarun {mod} --help'"


def _help_only(argv: list[str], command: str) -> bool:
    """argv asks only for the subcommand's help: options after it, no script named."""
    rest = argv[argv.index(command) + 1 :] if command in argv else []
    return any(a in ("-h", "--help") for a in rest) and all(a.startswith("-") for a in rest)


def build_parser(only: str | None = None) -> OneLineParser:
    parser = OneLineParser(
        prog="numarun",
        description="Topology-aware launcher for PyTorch distributed training. "
        "'numarun train.py' runs like 'torchrun train.py', with each local rank bound "
        "to its GPU, CPU cores, memory and NIC.",
    )
    parser.add_argument("--version", action="version", version=f"numarun {__version__}")
    option("log_level").add_to(parser)  # before the command: every command's options take it (see _main)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    for name, mod in _available_commands().items():
        if name != only:
            # list every command without importing its module (and torch with it)
            sub.add_parser(name, help=_summary(mod))
            continue
        module = importlib.import_module(f"numarun.commands.{mod}")
        module.add_parser(sub)
    _point_home(parser, "")
    return parser


class _CheckedStdout:
    """``sys.stdout`` while a command runs: a failed write or flush is an :class:`OutputError`
    (one line, exit 1) instead of a traceback, whichever command printed (``numarun topo >
    /dev/full``, ``numarun plan --json | head -1``)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def _failed(self, e: OSError) -> OutputError:
        return OutputError(f"cannot write to standard output: {e.strerror or e}")

    def write(self, text: str) -> int:
        try:
            return int(self._stream.write(text))
        except OSError as e:
            raise self._failed(e) from None

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as e:
            raise self._failed(e) from None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _discard_stdout(stream: Any) -> None:
    """Point a failed stdout at /dev/null, so that the exit's own flush adds no second report."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):
        return
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, fd)
    finally:
        os.close(null)


def _split_command(argv: list[str]) -> str | None:
    """The subcommand named in argv, inserting ``run`` for ``numarun [opts] SCRIPT``."""
    commands = _available_commands()
    i = 0
    while i < len(argv) and (argv[i] == "--log-level" or argv[i].startswith("--log-level=")):
        i += 2 if argv[i] == "--log-level" else 1
    if i >= len(argv) or argv[i] in ("-h", "--help", "--version"):
        return None
    if argv[i] in commands:
        return argv[i]
    if "run" not in commands:
        return None
    argv.insert(i, "run")
    return "run"


def main(argv: Sequence[str] | None = None) -> int:
    if os.getpid() == 1:  # a container's command: init's duties come with it
        from .launch.signals import init_main

        return init_main(list(sys.argv[1:] if argv is None else argv))
    stdout = sys.stdout
    sys.stdout = _CheckedStdout(stdout)
    try:
        try:
            return _main(list(sys.argv[1:] if argv is None else argv))
        finally:
            sys.stdout.flush()  # what is still buffered fails here, while it can be reported (help screens too)
    except OutputError as e:
        _discard_stdout(stdout)
        print(e.line(), file=sys.stderr)
        return e.exit_code
    except NumarunError as e:
        print(e.line(), file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130
    finally:
        sys.stdout = stdout


def _main(args_list: list[str]) -> int:
    command = _split_command(args_list)
    supervisor = None
    if command == "run" and not _help_only(args_list, command):
        from .launch.supervisor import Supervisor

        # numarun owns its signals from its first moment: one that arrives while torch is imported
        # for the parser is held for the workers (or ends the run), never lost
        supervisor = Supervisor()
        supervisor.hold_signals()
    else:
        from .launch.signals import say_ready

        say_ready()  # Python's own dispositions are this command's
    parser = build_parser(only=command)
    args = parser.parse_args(args_list)
    if command is not None:
        args.argv = args_list[args_list.index(command) + 1 :]  # what the subcommand was given, as typed
    args.launch_options = (*getattr(args, "launch_options", ()), option("log_level"))
    logging.basicConfig(level=getattr(args, "log_level", "WARNING"), format="numarun: %(levelname)s: %(message)s")
    if args.command is None:
        parser.print_help()
        return 2
    if supervisor is not None:  # numarun run's, holding the signals since before the parser
        return int(args.func(args, supervisor) or 0)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
