"""``numarun`` command line: ``numarun run|topo|plan|submit|bench``; ``numarun SCRIPT ...`` = run.

Each subcommand lives in ``launcher/commands/<name>.py`` and provides
``add_parser(subparsers) -> argparse.ArgumentParser`` and ``main(args) -> int``.
Modules are imported only when their subcommand runs, so ``numarun topo`` never
imports torch.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import logging
import sys
from collections.abc import Sequence

from . import __version__
from .errors import NumarunError

# subcommand -> module under numarun.commands
COMMANDS: dict[str, str] = {
    "run": "run",
    "topo": "topo",
    "plan": "plan",
    "bench": "bench",
    "submit": "submit",
}


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line on stderr and exit 2 (no usage dump)."""

    def error(self, message: str) -> "NoReturn":  # type: ignore[override]  # noqa: F821
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def _available_commands() -> dict[str, str]:
    found = {}
    for name, mod in COMMANDS.items():
        if importlib.util.find_spec(f"numarun.commands.{mod}") is not None:
            found[name] = mod
    return found


def build_parser(only: str | None = None) -> OneLineParser:
    parser = OneLineParser(
        prog="numarun",
        description="Topology-aware launcher for PyTorch distributed training. "
        "'numarun train.py' runs like 'torchrun train.py', with each local rank bound "
        "to its GPU, CPU cores, memory and NIC.",
    )
    parser.add_argument("--version", action="version", version=f"numarun {__version__}")
    parser.add_argument(
        "--log-level", default=None,
        help="logging level of numarun itself (default WARNING); when given, also of each worker's "
        "bootstrap, whose default INFO shows the one binding line per rank",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    for name, mod in _available_commands().items():
        if only is not None and name != only:
            # keep --help listing all commands without importing every module
            sub.add_parser(name, help=f"see 'numarun {name} --help'")
            continue
        module = importlib.import_module(f"numarun.commands.{mod}")
        module.add_parser(sub)
    return parser


def _split_command(argv: list[str]) -> str | None:
    """The subcommand named in argv, inserting ``run`` for ``numarun [opts] SCRIPT``."""
    commands = _available_commands()
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--log-level":
            i += 2
            continue
        if a.startswith("--log-level="):
            i += 1
            continue
        if a in commands:
            return a
        if a in ("-h", "--help", "--version"):
            return None
        if "run" in commands:
            argv.insert(i, "run")
            return "run"
        return None
    return None


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    command = _split_command(args_list)
    parser = build_parser(only=command)
    args = parser.parse_args(args_list)
    level = getattr(logging, str(args.log_level or "WARNING").upper(), None)
    if not isinstance(level, int):
        parser.error(f"bad --log-level {args.log_level!r}: expected DEBUG, INFO, WARNING or ERROR")
    logging.basicConfig(level=level, format="numarun: %(levelname)s: %(message)s")
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except NumarunError as e:
        print(f"numarun: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
