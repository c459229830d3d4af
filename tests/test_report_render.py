"""Report rendering: self-contained HTML, markdown, CSVs of every plotted number, determinism."""

from __future__ import annotations

import base64
import csv
import re
from html.parser import HTMLParser

from specsim.planning.plots import Figure, Panel, Series
from specsim.planning.report import (
    Callout,
    Paragraph,
    Report,
    Section,
    Table,
    format_cell,
    to_html,
    to_markdown,
    write_report,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _report() -> Report:
    figure = Figure(
        name="latency_vs_k",
        caption="p99 latency against k",
        panels=[
            Panel(
                "rate 2/s",
                "k",
                "p99 e2e (s)",
                [
                    Series("p99", [0, 1, 2], [1.5, 1.25, None]),
                    Series("p50", [0, 1, 2], [1, 0.9, 0.8]),
                ],
            ),
            Panel("rate 8/s", "k", "tokens/s", [Series("throughput", [0, 1], [100.0, 120.5])]),
        ],
    )
    table = Table(
        name="best_k",
        columns=["load", "best k", "p99 e2e (s)"],
        rows=[[2.0, 3, 1.23456], [8.0, 0, None]],
        caption="Best static k per load",
    )
    return Report(
        title="Choosing k <for> scenario",
        subtitle="`demo.yaml`, **3** loads",
        sections=[
            Section(
                "Answer", [Paragraph("Use **k = 3** below 8 req/s."), Callout("lossy verifier")]
            ),
            Section("Data", [table, figure]),
        ],
        attachments={"k_by_batch_size.yaml": "- {max_batch_size: 8, k: 3}\n"},
    )


class _Collector(HTMLParser):
    def __init__(self):
        super().__init__()
        self.sources: list[str] = []
        self.links: list[str] = []
        self.tables = 0

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "img":
            self.sources.append(attrs.get("src", ""))
        if tag in ("link", "script", "a") and (attrs.get("href") or attrs.get("src")):
            self.links.append(attrs.get("href") or attrs.get("src"))
        if tag == "table":
            self.tables += 1


def test_html_is_self_contained_with_embedded_pngs(tmp_path):
    report = _report()
    files = write_report(report, tmp_path)
    text = (tmp_path / "report.html").read_text(encoding="utf-8")
    parser = _Collector()
    parser.feed(text)
    assert parser.links == []  # nothing to fetch
    assert parser.tables == 1
    assert len(parser.sources) == 1 and parser.sources[0].startswith("data:image/png;base64,")
    png = base64.b64decode(parser.sources[0].split(",", 1)[1])
    assert png.startswith(PNG_SIGNATURE)
    assert png == (tmp_path / "latency_vs_k.png").read_bytes()
    assert "&lt;for&gt;" in text  # titles are escaped
    assert "<strong>k = 3</strong>" in text and "<code>demo.yaml</code>" in text
    assert set(files) >= {"report.html", "report.md", "best_k.csv", "latency_vs_k.csv"}
    assert (tmp_path / "k_by_batch_size.yaml").read_text() == "- {max_batch_size: 8, k: 3}\n"


def test_every_plotted_number_is_in_the_figure_csv(tmp_path):
    write_report(_report(), tmp_path)
    with open(tmp_path / "latency_vs_k.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 3 + 3 + 2
    p99 = [r for r in rows if r["panel"] == "rate 2/s" and r["series"] == "p99"]
    assert [(r["x"], r["y"]) for r in p99] == [("0", "1.5"), ("1", "1.25"), ("2", "")]
    assert float(rows[-1]["y"]) == 120.5
    with open(tmp_path / "best_k.csv", newline="") as fh:
        table = list(csv.reader(fh))
    assert table == [["load", "best k", "p99 e2e (s)"], ["2.0", "3", "1.23456"], ["8.0", "0", ""]]


def test_markdown_has_tables_figures_and_callouts():
    text = to_markdown(_report())
    assert text.startswith("# Choosing k <for> scenario\n")
    assert "| load | best k | p99 e2e (s) |" in text
    assert "| 2 | 3 | 1.235 |" in text and "| 8 | 0 | — |" in text
    assert "![p99 latency against k](latency_vs_k.png)" in text
    assert "> **Warning:** lossy verifier" in text


def test_outputs_are_byte_identical_across_runs(tmp_path):
    write_report(_report(), tmp_path / "a")
    write_report(_report(), tmp_path / "b")
    for path in sorted((tmp_path / "a").iterdir()):
        assert path.read_bytes() == (tmp_path / "b" / path.name).read_bytes(), path.name
    assert not re.search(r"20\d\d-\d\d-\d\d", to_html(_report()))  # no dates in the page


def test_cell_formatting():
    assert format_cell(None) == "—"
    assert format_cell(12345) == "12,345"
    assert format_cell(0.0123456) == "0.01235"
    assert format_cell(98765.4) == "98,765"
    assert format_cell(2.5e-5) == "2.50e-05"
    assert format_cell(True) == "yes"
    assert format_cell(float("nan")) == "—"


def test_markdown_escapes_pipes_in_headers_and_cells():
    table = Table("t", ["P(a | b)", "x"], [["1 | 2", 3]])
    text = to_markdown(Report("r", sections=[Section("s", [table])]))
    assert "| P(a \\| b) | x |" in text and "| 1 \\| 2 | 3 |" in text
