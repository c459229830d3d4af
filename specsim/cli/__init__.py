"""The ``specsim`` command line.

Each subcommand lives in its own module ``specsim.cli.<name>`` with two functions:
``add_arguments(parser)`` and ``run(args) -> int``. Command modules import heavy libraries (torch,
SimPy, matplotlib) inside ``run`` only, so ``specsim --help`` stays fast and commands that do not
need torch work without it. A ``SpecsimError`` anywhere becomes one line on stderr and exit 2.
SIGTERM is handled as Ctrl-C is (exit 143 instead of 130): staging folders are removed and a
sweep's worker processes are ended.
"""

from __future__ import annotations

import _thread
import argparse
import errno
import functools
import importlib
import os
import re
import signal
import sys
import threading
import warnings

from specsim import __version__
from specsim.cli.common import check_out
from specsim.errors import EXIT_BAD_INPUT, SpecsimError

# name -> one-line help. The module is specsim.cli.<name>.
COMMANDS = {
    "profile": "measure, estimate or calibrate a profile YAML",
    "simulate": "simulate a scenario and write per-request records and a summary",
    "plan": "sweep k, load and replicas: choose k, plan capacity",
    "report": "what-if reports, such as swapping one drafter for another",
    "check": "check a verifier for losslessness, or compare two rollouts",
    "validate": "run the real engine and compare it with the simulator's prediction",
    "schema": "print the JSON Schema of a scenario or profile file",
}


DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


class OneLineParser(argparse.ArgumentParser):
    """A parser whose usage errors are one line with a fix, like every other bad input.

    Subcommand parsers are made by ``add_subparsers``, which uses the parent's class, so the
    whole tree reports this way.
    """

    def error(self, message: str):
        # argparse quotes the value it refused whole: a pasted megabyte stays out of the line.
        message = re.sub(r"'([^']{40})[^']{20,}'", r"'\1...'", message)
        if "; fix: " not in message:  # an option's own type may say how to fix it
            message += f"; fix: see {self.prog} --help"
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message}\n")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; with ``command``, that subcommand's options alone (the others
    keep their name and help), so that a run imports its own command's module only."""
    parser = OneLineParser(
        prog="specsim",
        description="Profile, simulate and plan speculative decoding for LLM serving fleets.",
    )
    parser.add_argument("--version", action="version", version=f"specsim {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, help_text in COMMANDS.items():
        if command is not None and name != command:
            sub.add_parser(name, help=help_text)
            continue
        module = importlib.import_module(f"specsim.cli.{name}")
        cmd = sub.add_parser(
            name,
            help=help_text,
            description=module.__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.add_arguments(cmd)
        cmd.set_defaults(_run=module.run)
    return parser


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the program is, so its clean-up runs as it does on Ctrl-C."""


def _on_sigterm(signum, frame):
    # A second SIGTERM during the clean-up ends the process at once, as a second Ctrl-C would.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    raise Terminated


def _raise_dropped_interrupt(report, unraisable):
    """``sys.unraisablehook``: a SIGTERM or Ctrl-C that landed in a finalizer (``__del__``, a
    generator closed by the collector) is dropped there by Python, so the run would go on; it
    is raised again in the main thread, as a Ctrl-C (``main`` remembers it was a SIGTERM)."""
    report(unraisable)
    if isinstance(unraisable.exc_value, KeyboardInterrupt):
        # From another thread, a moment later: raised in this hook it would be dropped again.
        threading.Timer(0.01, _thread.interrupt_main).start()


def named_command(argv: list[str]) -> str | None:
    """The subcommand the arguments name (their first word that is no option; the top level's
    options take no value), or None where they name none (``--help``, a misspelt command)."""
    first = next((word for word in argv if not word.startswith("-")), None)
    return first if first in COMMANDS else None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(named_command(argv))
    args = parser.parse_args(argv)
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
        hook = sys.unraisablehook
        sys.unraisablehook = functools.partial(_raise_dropped_interrupt, hook)
    try:
        with warnings.catch_warnings():
            # Library warnings (an extrapolated latency query, say) are one line, no source dump.
            warnings.showwarning = _one_line_warning
            check_out(args)  # an unusable --out fails before any work
            return int(args._run(args) or 0)
    except SpecsimError as exc:
        print(f"specsim {args.command}: error: {exc.one_line()}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OSError as exc:
        if exc.errno not in DISK_FULL:
            raise
        # Any writer may meet a full disk; the staging folder it wrote in is gone by now.
        error = SpecsimError(
            exc.strerror or "disk full",
            file=exc.filename,
            fix="free space on that disk, or write --out to another",
        )
        print(f"specsim {args.command}: error: {error.one_line()}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt as exc:
        # A SIGTERM raised again after a finalizer dropped it comes back as a plain interrupt.
        dropped = previous is not None and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        terminated = isinstance(exc, Terminated) or dropped
        print(
            f"specsim {args.command}: {'terminated' if terminated else 'interrupted'}",
            file=sys.stderr,
        )
        return 128 + (signal.SIGTERM if terminated else signal.SIGINT)
    except BrokenPipeError:
        # The reader went away (``specsim ... --json | head``): not an error of ours. Point stdout
        # at devnull so the interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
            sys.unraisablehook = hook


def _one_line_warning(message, category, filename, lineno, file=None, line=None):
    print(f"specsim: warning: {message}", file=sys.stderr)
