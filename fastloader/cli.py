"""`fastloader bench | show | check | cache | pack | tune`: the command line. This module parses and dispatches; each
command lives in its own module, named after it (fastloader/commands/), which adds its options and runs it.

One rule for the exit status, whatever the command, so that scripts and schedulers can tell what
happened: 0 done; 1 `check` found files a loader cannot read (a finding, as a linter's 1); 2 an
error the user can fix (a bad config, option or path, a split without a batch, a full disk), one
line naming the file or key and the fix; 3 an unexpected internal failure (a bug or a broken
install); 130 interrupted; 143 terminated (SIGTERM, as a scheduler stops a job): like Ctrl-C, it
stops the command cleanly, and what it had half-written is removed. `--debug`, before or after the
command, adds tracebacks and DEBUG logs and never changes the status. Every subcommand's help ends
with examples and the exit status.
"""
from __future__ import annotations

import argparse
import errno
import importlib
import logging
import os
import shutil
import signal
import sys
import textwrap
import threading
import traceback

from . import __version__
from .errors import BadImageError, ConfigError, DiskFullError

COMMANDS = ("bench", "show", "check", "cache", "pack", "tune")
"""Subcommands; fastloader.commands.<name> provides HELP, EXAMPLES, add_arguments(parser), run(args),
and may provide FINDINGS: {exit status: meaning} for results that are not errors (check's 1)."""

DONE, USER_ERROR, INTERNAL_ERROR, INTERRUPTED, TERMINATED = 0, 2, 3, 130, 128 + signal.SIGTERM
"""Exit statuses shared by every command (argparse's usage errors exit 2 too)."""
USER_ERRORS = (ConfigError, BadImageError, DiskFullError)
"""Errors raised on purpose, whose message names the file or key and the fix; OSErrors that name a
path (a missing folder, a file that cannot be written) count too, and so does a full disk."""


class Terminated(BaseException):
    """SIGTERM, raised in the main thread as Ctrl-C raises KeyboardInterrupt, so that a command stops
    as cleanly (its pools stopped, its half-written files removed) where the signal's default action
    would kill it on the spot and leave them behind."""


def _terminate(signum, frame) -> None:
    raise Terminated


def _full_disk(error: OSError, out: str | None) -> str:
    """A write that found the disk full (the cache says more itself: fastloader.errors.DiskFullError)."""
    from .machine import human_bytes

    if not out:
        return f"the disk the command writes to is full ({error.strerror}): free space there and run it again"
    free = human_bytes(shutil.disk_usage(out).free) if os.path.isdir(out) else "?"
    return (f"the disk holding {out} is full ({error.strerror}; {free} free now that the unfinished file is "
            f"removed): free space there or write elsewhere (--out DIR), and run the command again")


def exit_status_help(findings: dict[int, str] | None = None) -> str:
    """The 'exit status:' section of a help text; `findings` adds a command's own statuses."""
    lines = {DONE: "done", **(findings or {}),
             USER_ERROR: "an error you can fix: a bad config, option or path, a split that yields no batch; one "
                         "line names the file or key and the fix",
             INTERNAL_ERROR: "an internal failure (a bug or a broken install); --debug shows its traceback",
             INTERRUPTED: "interrupted (Ctrl-C)",
             TERMINATED: "terminated (SIGTERM); what the command had half-written is removed"}
    return "exit status:\n" + "".join(textwrap.fill(text, 100, initial_indent=f"  {code:<4} ",
                                                     subsequent_indent=" " * 7) + "\n"
                                       for code, text in sorted(lines.items()))


def _parser() -> argparse.ArgumentParser:
    modules = {name: importlib.import_module(f".commands.{name}", __package__) for name in COMMANDS}
    examples = "examples:\n" + "".join(m.EXAMPLES for m in modules.values())
    findings = {code: f"{name}: {text}" for name, m in modules.items() for code, text in
                getattr(m, "FINDINGS", {}).items()}
    parser = argparse.ArgumentParser(prog="fastloader", description="Image-classification loading for PyTorch.",
                                     epilog=examples + "\n" + exit_status_help(findings),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"fastloader {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs (here or after "
                                                             "the command)")
    subcommands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in modules.items():
        sub = subcommands.add_parser(name, help=module.HELP, description=module.HELP,
                                     epilog="examples:\n" + module.EXAMPLES + "\n" +
                                     exit_status_help(getattr(module, "FINDINGS", None)),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
        sub.add_argument("config", help="YAML config file")
        module.add_arguments(sub)
        sub.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                         help="override a config key, e.g. --set train.batch_size=32 (repeatable)")
        # SUPPRESS: a --debug before the command stays set when this one is not given
        sub.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                         help="show tracebacks and debug logs")
        sub.set_defaults(run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line; the exit status (the rule: this module's docstring)."""
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit:  # --help, --version (0) and usage errors (2): a status, not an exit
        return exit.code if isinstance(exit.code, int) else USER_ERROR
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.INFO,
                        format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    if args.command is None:
        parser.print_help(sys.stderr)
        print(f"fastloader: error: name a command: {', '.join(COMMANDS)}", file=sys.stderr)
        return USER_ERROR
    previous = signal.signal(signal.SIGTERM, _terminate) if threading.current_thread() is threading.main_thread() \
        else None
    try:
        return args.run(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return INTERRUPTED
    except Terminated:
        print("terminated (SIGTERM)", file=sys.stderr)
        return TERMINATED
    except Exception as error:  # a user-facing tool: one line, the traceback only with --debug
        if args.debug:
            traceback.print_exc()
        if isinstance(error, USER_ERRORS) or (isinstance(error, OSError) and error.filename is not None):
            print(f"fastloader: error: {error}", file=sys.stderr)
            return USER_ERROR
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            print(f"fastloader: error: {_full_disk(error, getattr(args, 'out', None))}", file=sys.stderr)
            return USER_ERROR
        where = "the traceback is above" if args.debug else "run again with --debug for the traceback"
        print(f"fastloader: internal error: {type(error).__name__}: {error}. This is a bug or a broken install, "
              f"not your config: {where}, and report it", file=sys.stderr)
        return INTERNAL_ERROR
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
