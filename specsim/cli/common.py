"""Options and output shared by the subcommands."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


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
