"""Reference pages generated from the code, so the docs cannot drift from what specsim accepts.

    python -m specsim.docs            # rewrite docs/reference/ and the validation guide's table
    python -m specsim.docs --check    # exit 1 (and name the pages) when either is stale

Four kinds of page: the profile and scenario schemas (from the pydantic models: key, type,
default, allowed values, description), every CLI command (from the same argparse parsers that
``--help`` prints), the output files (described once, below; the tests check the names
against real runs), the Python API (from its docstrings and signatures) and the normalised
benchmark CSV (from its column list). Nothing is
written by hand twice: change a field's description or an option's help and rerun this module.

The pages depend only on the code, never on the machine: argparse's own help layout (which
varies with the terminal width and the Python version) is not used; tables are built from the
parsers' actions instead.

The validation table of ``docs/guide/validate.md`` is generated too, from the latest saved runs
of ``benchmarks/bench_validation.py`` (``specsim.docs.validation``). Pages written by hand may
sit beside the generated ones when named in ``HANDWRITTEN``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specsim.docs.api import api_page
from specsim.docs.bench_csv import bench_csv_page
from specsim.docs.cli import cli_pages, command_names, option_help, synopsis
from specsim.docs.markdown import GENERATED, cell, docstring_markdown, help_markdown, table
from specsim.docs.outputs import (
    BASELINE_KEYS,
    COMMAND_OUTPUTS,
    REQUEST_COLUMNS,
    SUMMARY_KEYS,
    outputs_page,
)
from specsim.docs.schema import nested_models, schema_page, schema_pages
from specsim.docs.validation import PAGE, RESULTS, page_is_current, write_page_table
from specsim.errors import EXIT_BAD_INPUT, SpecsimError
from specsim.fileio import write_text_atomic

DEFAULT_FOLDER = Path(__file__).resolve().parent.parent.parent / "docs" / "reference"
# Reference pages written by hand (sources cited page by page): kept, indexed, never rewritten.
HANDWRITTEN = {"engine-formats.md": "the engines' file formats and options, with their sources"}

__all__ = [
    "BASELINE_KEYS",
    "COMMAND_OUTPUTS",
    "DEFAULT_FOLDER",
    "HANDWRITTEN",
    "REQUEST_COLUMNS",
    "SUMMARY_KEYS",
    "cell",
    "cli_pages",
    "command_names",
    "docstring_markdown",
    "help_markdown",
    "main",
    "nested_models",
    "option_help",
    "outputs_page",
    "reference_pages",
    "schema_page",
    "schema_pages",
    "stale_pages",
    "synopsis",
    "table",
    "write_pages",
]


def reference_pages() -> dict[str, str]:
    """Every generated page: path relative to docs/reference -> Markdown text."""
    pages = {**schema_pages(), **cli_pages(), "outputs.md": outputs_page(), "api.md": api_page()}
    pages["bench-csv.md"] = bench_csv_page()
    pages["README.md"] = index_page()
    return pages


def index_page() -> str:
    rows = [
        ["[scenario.md](scenario.md)", "every key of a scenario file"],
        ["[profile.md](profile.md)", "every key of a profile file"],
        ["[cli/](cli/README.md)", "every command and option"],
        ["[outputs.md](outputs.md)", "what each output file holds"],
        ["[api.md](api.md)", "the Python API: each function and what it returns"],
        ["[bench-csv.md](bench-csv.md)", "the normalised CSV of benchmark runs"],
        *([f"[{name}]({name})", f"{what} (written by hand)"] for name, what in HANDWRITTEN.items()),
    ]
    return "\n\n".join(["# Reference", GENERATED, table(["page", "what it holds"], rows)]) + "\n"


def stale_pages(folder: Path, pages: dict[str, str]) -> list[str]:
    """Pages missing, different, or present but no longer generated."""
    stale = [name for name, text in pages.items() if _read(folder / name) != text]
    if folder.is_dir():
        stale += [
            str(p.relative_to(folder))
            for p in sorted(folder.rglob("*.md"))
            if str(p.relative_to(folder)) not in {**pages, **HANDWRITTEN}
        ]
    return sorted(stale)


def _read(path: Path) -> str | None:
    return path.read_text(encoding="utf-8") if path.is_file() else None


def write_pages(folder: Path, pages: dict[str, str]) -> list[str]:
    """Write the pages that changed and remove generated pages that no longer exist."""
    changed = stale_pages(folder, pages)
    for name in changed:
        if name in pages:
            write_text_atomic(folder / name, pages[name])
        else:
            (folder / name).unlink()
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m specsim.docs", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_FOLDER, help="reference folder")
    parser.add_argument("--check", action="store_true", help="only report stale pages (exit 1)")
    parser.add_argument(
        "--table-page", type=Path, default=PAGE, help="the page whose validation table to write"
    )
    parser.add_argument(
        "--results", type=Path, default=RESULTS, help="the validation results the table shows"
    )
    args = parser.parse_args(argv)
    try:
        if args.out.exists() and not args.out.is_dir():
            raise SpecsimError(
                "exists and is not a folder", file=str(args.out), fix="give a folder"
            )
        pages = reference_pages()
        if args.check:
            stale = stale_pages(args.out, pages)
            table_current = page_is_current(args.table_page, args.results)
        else:
            changed = write_pages(args.out, pages)
            rewrote = write_page_table(args.table_page, args.results)
    except SpecsimError as error:
        print(f"python -m specsim.docs: error: {error.one_line()}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.check:
        stale += [] if table_current else [f"{args.table_page} (its validation table)"]
        if stale:
            print(f"stale in {args.out}: {', '.join(stale)}; run python -m specsim.docs")
            return 1
        print(
            f"{args.out}: {len(pages)} pages current; {args.table_page}: validation table current"
        )
        return 0
    print(f"{args.out}: {len(changed)} of {len(pages)} pages rewritten")
    print(f"{args.table_page}: validation table {'rewritten' if rewrote else 'current'}")
    return 0
