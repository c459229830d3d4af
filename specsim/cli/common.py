"""Options and output shared by the subcommands."""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from specsim.bounds import MAX_SECONDS, MAX_SEED, MIN_LEVEL, MIN_POSITIVE, MIN_SECONDS


def add_out(parser: argparse.ArgumentParser, required: bool = True, help: str | None = None):
    parser.add_argument(
        "--out",
        metavar="DIR",
        required=required,
        help=help or "folder for the output files (written atomically)",
    )
    parser.set_defaults(_check_out=check_out_folder)


def check_out_folder(args: argparse.Namespace) -> None:
    """``--out DIR`` must be a folder this process can write in (checked before any work)."""
    from specsim.fileio import check_output_folder

    if args.out is not None:
        check_output_folder(args.out)


def check_out(args: argparse.Namespace) -> None:
    """Run the subcommand's check of its output path, if it has one (``specsim.cli.main``)."""
    check = getattr(args, "_check_out", None)
    if check is not None:
        check(args)


def add_json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json", action="store_true", help="print a machine-readable JSON summary instead"
    )


def add_set(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--set",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        dest="overrides",
        help="override a scenario value, e.g. --set speculation.k=3, or a list item by its index, "
        "e.g. --set fleet.pools.1.speculation.k=2 (repeatable; type-checked)",
    )


def emit(args: argparse.Namespace, summary: dict[str, Any], human: str) -> None:
    """Print the human summary, or with ``--json`` the JSON summary, to stdout."""
    if getattr(args, "json", False):
        json.dump(summary, sys.stdout, indent=2, allow_nan=False)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(human.rstrip("\n") + "\n")


class Number:
    """An argparse ``type``: a finite whole (``kind=int``) or real number within bounds.

    ``low``/``high`` are inclusive unless ``low_open``/``high_open``; the error states them,
    and argparse names the option: ``argument --repeats: 0 is below 1; fix: give ...``.
    """

    def __init__(
        self,
        kind: type,
        low: float,
        high: float,
        *,
        low_open: bool = False,
        high_open: bool = False,
    ):
        self.kind, self.low, self.high = kind, low, high
        self.low_open, self.high_open = low_open, high_open
        self.__name__ = "whole number" if kind is int else "number"

    def describe(self) -> str:
        low, high = (f"{v:,}" if self.kind is int else f"{v:g}" for v in (self.low, self.high))
        if not (self.low_open or self.high_open):
            return f"a {self.__name__} from {low} to {high}"
        left = f"above {low}" if self.low_open else f"from {low}"
        right = f"below {high}" if self.high_open else f"at most {high}"
        return f"a {self.__name__} {left} and {right}"

    def __call__(self, text: str):
        fix = f"; fix: give {self.describe()}"
        shown = text if len(text) <= 40 else f"{text[:20]}... ({len(text):,} characters)"
        try:
            value = self.kind(text.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"{shown!r} is not a {self.__name__}{fix}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{shown!r} is not a finite number{fix}")
        # An open bound at 0 refuses denormals too (5e-324 > 0, yet divides to infinity).
        floor = MIN_POSITIVE if self.low_open and self.low == 0 else self.low
        if value < floor or (self.low_open and value == self.low):
            raise argparse.ArgumentTypeError(f"{shown} is too small{fix}")
        if value > self.high or (self.high_open and value == self.high):
            raise argparse.ArgumentTypeError(f"{shown} is too large{fix}")
        return value


SEED = Number(int, 0, MAX_SEED)
LEVEL = Number(float, MIN_LEVEL, 1, high_open=True)  # a test's false-alarm rate
SECONDS = Number(float, 0, MAX_SECONDS)
POSITIVE_SECONDS = Number(float, MIN_SECONDS, MAX_SECONDS)
