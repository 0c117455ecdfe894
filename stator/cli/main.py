"""`stator`: entry point. Subcommands live in `stator.cli.<name>` and are imported lazily
so that `stator --help` stays fast."""

from __future__ import annotations

import argparse
import importlib
import sys

from stator import __version__
from stator.cli.quick_exit import SERVING_COMMANDS, QuickExit

# Subcommand module names, in the order `--help` lists them. Each module defines
# `register(subparsers)`, which adds its parser and sets `func` to a callable(args) -> int.
SUBCOMMANDS: list[str] = [
    "run",
    "frontend",
    "worker",
    "global-router",
    "planner",
    "profile",
    "download",
    "bench",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stator",
        description="stator: OpenAI-compatible LLM serving, from one process to a cluster.",
    )
    parser.add_argument("--version", action="version", version=f"stator {__version__}")
    parser.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="Logging level (default: INFO)",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        importlib.import_module(f"stator.cli.{name.replace('-', '_')}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run a subcommand. `argv` None: this process is the `stator` command (serving
    commands then end it without the interpreter's teardown: `quick_exit.py`)."""
    quick_exit = QuickExit.install() if argv is None else None
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    args, _unknown = parser.parse_known_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 2
    # A subcommand may accept pass-through flags (e.g. vLLM's engine arguments, or the
    # flags of the engine `stator worker --engine` chose); it finds them in `unknown_args`.
    if not getattr(args, "accepts_unknown", False):
        args = parser.parse_args(argv)
    else:
        args.unknown_args = _unknown
    from stator.logs import setup_logging

    setup_logging(args.log_level)
    code = int(args.func(args) or 0)
    if quick_exit is not None and args.command in SERVING_COMMANDS:
        quick_exit.arm(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
