"""Reports as data, rendered to a self-contained ``report.html``, a ``report.md`` and CSV files.

A ``Report`` is a title and sections of blocks: paragraphs, call-outs (warnings such as a lossy
verifier), tables and figures. Every table is also written as CSV and every figure as PNG plus the
CSV of the numbers it plots. The HTML embeds its figures as base64 PNGs and its style inline, so
it opens in a browser with no network. Output is deterministic: no dates, no timings.
"""

from __future__ import annotations

import base64
import csv
import html
import io
import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specsim.planning.plots import Figure


@dataclass
class Paragraph:
    text: str


@dataclass
class Callout:
    text: str
    kind: str = "warning"  # "warning" or "note"


@dataclass
class Table:
    """``name`` is the CSV file stem; cells are raw values (formatted when rendered)."""

    name: str
    columns: list[str]
    rows: list[list[Any]]
    caption: str = ""

    def csv_text(self) -> str:
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(self.columns)
        for row in self.rows:
            writer.writerow([_csv_cell(v) for v in row])
        return buf.getvalue()


Column = tuple[str, Callable[[Any], Any]]  # a header, and the cell it shows of one item


def column_table(name: str, columns: Sequence[Column], items: Iterable, caption: str = "") -> Table:
    """A table as data: a row per item, each column a header and the cell it takes of the
    item, so that a report's table is its list of columns, not code keeping two lists in step."""
    return Table(
        name, [h for h, _ in columns], [[cell(i) for _, cell in columns] for i in items], caption
    )


@dataclass
class Section:
    title: str
    blocks: list[Paragraph | Callout | Table | Figure] = field(default_factory=list)


@dataclass
class Report:
    title: str
    subtitle: str = ""
    sections: list[Section] = field(default_factory=list)
    # Extra files written beside the report (name -> text), e.g. a serving-config snippet; a
    # name may hold a folder (``engine/vllm.json``).
    attachments: dict[str, str] = field(default_factory=dict)

    def tables(self) -> list[Table]:
        return [b for s in self.sections for b in s.blocks if isinstance(b, Table)]

    def figures(self) -> list[Figure]:
        return [b for s in self.sections for b in s.blocks if isinstance(b, Figure)]


def _csv_cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else ""
    return str(value)


def format_cell(value: Any) -> str:
    """A value as a reader wants it: 3-4 significant figures, thousands separators, '—' for none."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if not math.isfinite(value):
            return "—"
        if value == 0:
            return "0"
        magnitude = abs(value)
        if magnitude >= 1000:
            return f"{value:,.0f}"
        if magnitude >= 0.001:
            return f"{value:.4g}"
        return f"{value:.2e}"
    return str(value)


# -- markdown ---------------------------------------------------------------------------------


def to_markdown(report: Report) -> str:
    lines = [f"# {report.title}", ""]
    if report.subtitle:
        lines += [report.subtitle, ""]
    for section in report.sections:
        lines += [f"## {section.title}", ""]
        for block in section.blocks:
            lines += [*_md_block(block), ""]
    return "\n".join(lines).rstrip() + "\n"


def _md_block(block) -> list[str]:
    if isinstance(block, Paragraph):
        return [block.text]
    if isinstance(block, Callout):
        label = "Warning" if block.kind == "warning" else "Note"
        return [f"> **{label}:** {block.text}"]
    if isinstance(block, Table):
        lines = []
        if block.caption:
            lines += [f"*{block.caption}* (data: `{block.name}.csv`)", ""]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in block.columns) + " |")
        lines.append("|" + "|".join("---" for _ in block.columns) + "|")
        for row in block.rows:
            cells = [format_cell(v).replace("|", "\\|") for v in row]
            lines.append("| " + " | ".join(cells) + " |")
        return lines
    if isinstance(block, Figure):
        data = f"*{block.caption}* (data: `{block.name}.csv`)"
        return [f"![{block.caption}]({block.name}.png)", "", data]
    raise TypeError(f"unknown report block {type(block).__name__}")


# -- HTML -------------------------------------------------------------------------------------

_STYLE = """
body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;margin:2rem auto;
max-width:1100px;padding:0 1rem;color:#1d232a;line-height:1.45}
h1{font-size:1.6rem;margin-bottom:.2rem}h2{font-size:1.2rem;margin-top:2rem;
border-bottom:1px solid #dde2e8;padding-bottom:.2rem}.subtitle{color:#5a6570;margin-top:0}
table{border-collapse:collapse;margin:.6rem 0 1rem;font-size:.88rem}
th,td{padding:.25rem .6rem;border-bottom:1px solid #e6e9ee;text-align:right}
th{background:#f3f5f8;font-weight:600}td:first-child,th:first-child{text-align:left}
tr:hover td{background:#fafbfc}caption{caption-side:top;text-align:left;color:#5a6570;
font-size:.85rem;padding-bottom:.3rem}figure{margin:1rem 0}figure img{max-width:100%;
border:1px solid #e6e9ee}figcaption{color:#5a6570;font-size:.85rem}
.callout{padding:.6rem .9rem;border-left:4px solid;margin:.8rem 0;border-radius:3px}
.warning{background:#fff6e5;border-color:#e69b00}.note{background:#eef5ff;border-color:#3b7dd8}
code{background:#f3f5f8;padding:0 .25rem;border-radius:3px;font-size:.9em}
.data{font-size:.8rem;color:#5a6570}
"""


def _inline(text: str) -> str:
    """Escape, then the two inline marks the planner uses: **bold** and `code`."""
    out = html.escape(text)
    out = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", out)
    return re.sub(r"`(.+?)`", r"<code>\1</code>", out)


def to_html(report: Report, figure_png: dict[str, bytes] | None = None) -> str:
    """The whole report as one HTML page; ``figure_png`` maps figure names to drawn PNGs."""
    figure_png = figure_png or {}
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{html.escape(report.title)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{html.escape(report.title)}</h1>",
    ]
    if report.subtitle:
        parts.append(f'<p class="subtitle">{_inline(report.subtitle)}</p>')
    for section in report.sections:
        parts.append(f"<h2>{html.escape(section.title)}</h2>")
        for block in section.blocks:
            parts.append(_html_block(block, figure_png))
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _html_block(block, figure_png: dict[str, bytes]) -> str:
    if isinstance(block, Paragraph):
        return f"<p>{_inline(block.text)}</p>"
    if isinstance(block, Callout):
        label = "Warning" if block.kind == "warning" else "Note"
        body = f"<strong>{label}:</strong> {_inline(block.text)}"
        return f'<div class="callout {block.kind}">{body}</div>'
    if isinstance(block, Table):
        head = "".join(f"<th>{html.escape(c)}</th>" for c in block.columns)
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(format_cell(v))}</td>" for v in row) + "</tr>"
            for row in block.rows
        )
        caption = (
            f"<caption>{_inline(block.caption)} "
            f'<span class="data">(data: {html.escape(block.name)}.csv)</span></caption>'
            if block.caption
            else ""
        )
        return f"<table>{caption}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
    if isinstance(block, Figure):
        png = figure_png.get(block.name) or block.png()
        data = base64.b64encode(png).decode("ascii")
        return (
            f'<figure><img alt="{html.escape(block.caption)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{_inline(block.caption)} "
            f'<span class="data">(data: {html.escape(block.name)}.csv)</span></figcaption></figure>'
        )
    raise TypeError(f"unknown report block {type(block).__name__}")


# -- files ------------------------------------------------------------------------------------


def write_report(report: Report, folder: str | Path) -> list[str]:
    """Write report.html, report.md, each figure's PNG and CSV, each table's CSV, attachments.

    ``folder`` is normally the staging folder of ``atomic_output_dir``. Returns the file names.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written: list[str] = []
    pngs: dict[str, bytes] = {}
    names = [t.name for t in report.tables()] + [f.name for f in report.figures()]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"report has duplicate table/figure names: {duplicates}")
    for figure in report.figures():
        pngs[figure.name] = figure.png()
        (folder / f"{figure.name}.png").write_bytes(pngs[figure.name])
        (folder / f"{figure.name}.csv").write_text(figure.csv_text(), encoding="utf-8")
        written += [f"{figure.name}.png", f"{figure.name}.csv"]
    for table in report.tables():
        (folder / f"{table.name}.csv").write_text(table.csv_text(), encoding="utf-8")
        written.append(f"{table.name}.csv")
    for name, text in report.attachments.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)  # engine/vllm.json, say
        (folder / name).write_text(text, encoding="utf-8")
        written.append(name)
    (folder / "report.md").write_text(to_markdown(report), encoding="utf-8")
    (folder / "report.html").write_text(to_html(report, pngs), encoding="utf-8")
    return [*written, "report.md", "report.html"]
