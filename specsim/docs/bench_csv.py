"""docs/reference/bench-csv.md: specsim's normalised benchmark CSV, from its column list."""

from __future__ import annotations

from specsim.docs.markdown import GENERATED, cell, docstring_markdown, table
from specsim.serving import normalised

KINDS = {
    "text": "text",
    "rate": "number, or inf",
    "number": "number",
    "count": "whole number",
    "flag": "true/false (on/off, yes/no)",
    "rates": "numbers separated by `;`",
}


def bench_csv_page() -> str:
    rows = [
        [f"`{c.name}`", KINDS[c.kind], "yes" if c.required else "", cell(c.description)]
        for c in normalised.COLUMNS
    ]
    parts = [
        "# Normalised benchmark CSV",
        GENERATED,
        docstring_markdown(normalised.__doc__),
        "## Columns",
        table(["column", "type", "required", "what it holds"], rows),
        "## Rules",
        "\n".join(f"- {rule}" for rule in normalised.RULES),
        "## Example",
        "```csv\n" + normalised.EXAMPLE + "```",
    ]
    return "\n\n".join(parts) + "\n"
