"""`fastloader bench | show | check | cache`: the command line. This module parses and dispatches; each
command lives in its own module, named after it (fastloader/commands/), which adds its options and runs it.

Errors are one line without a traceback (exit 2) unless --debug; every subcommand's help ends with
examples.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import sys

from . import __version__

COMMANDS = ("bench", "show", "check", "cache")
"""Subcommands; fastloader.commands.<name> provides HELP, EXAMPLES, add_arguments(parser), run(args)."""


def _parser() -> argparse.ArgumentParser:
    modules = {name: importlib.import_module(f".commands.{name}", __package__) for name in COMMANDS}
    examples = "examples:\n" + "".join(m.EXAMPLES for m in modules.values())
    parser = argparse.ArgumentParser(prog="fastloader", description="Image-classification loading for PyTorch.",
                                     epilog=examples, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"fastloader {__version__}")
    subcommands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in modules.items():
        sub = subcommands.add_parser(name, help=module.HELP, description=module.HELP,
                                     epilog="examples:\n" + module.EXAMPLES,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
        sub.add_argument("config", help="YAML config file")
        module.add_arguments(sub)
        sub.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                         help="override a config key, e.g. --set train.batch_size=32 (repeatable)")
        sub.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
        sub.set_defaults(run=module.run)
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.INFO,
                        format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    if args.command is None:
        _parser().print_help()
        return 2
    try:
        return args.run(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as error:  # a user-facing tool: the message, not a traceback, unless --debug
        if args.debug:
            raise
        print(f"fastloader: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
