"""The trace-layout registry (``specsim.trace_formats``) is complete: every layout has a parser for
its time column, a file in every layout reads (its header detected, both readers agreeing to the
bit), and the scenario's ``format`` values and docs come from the registry."""

from __future__ import annotations

import dataclasses
import typing

import numpy as np
import pytest

from specsim.trace_formats import AUTO, TIME_SPELLINGS, TRACE_FORMATS, TraceLayout
from specsim.workload import traces
from specsim.workload.traces import read_trace

# Two arrival times in each spelling, 1.5 s apart, the later one first (the reader sorts).
TIMES = {
    "seconds": ("12.25", "10.75"),
    "datetime": ("2023-11-16 18:15:47.5", "2023-11-16 18:15:46"),
}


def missing_parts(layout: TraceLayout) -> list[str]:
    missing = []
    if layout.time_parser not in TIME_SPELLINGS or layout.time_parser not in traces.TIME_PARSERS:
        missing.append("time_parser")
    if len(set(layout.columns)) != 3 or not all(c.strip() == c and c for c in layout.columns):
        missing.append("columns")
    if not layout.description:
        missing.append("description")
    return missing


@pytest.mark.parametrize("name", list(TRACE_FORMATS))
def test_every_layout_is_complete(name):
    assert missing_parts(TRACE_FORMATS[name]) == []


def test_every_spelling_of_time_has_a_parser_and_a_sample():
    assert set(TIME_SPELLINGS) == set(traces.TIME_PARSERS) == set(TIMES)


@pytest.mark.parametrize(
    "change, missing",
    [
        ({"time_parser": "epoch_ms"}, ["time_parser"]),
        ({"output": "ContextTokens"}, ["columns"]),
        ({"description": ""}, ["description"]),
    ],
)
def test_an_incomplete_layout_is_found(change, missing):
    assert missing_parts(dataclasses.replace(TRACE_FORMATS["azure"], **change)) == missing


@pytest.mark.parametrize("name", list(TRACE_FORMATS))
def test_a_file_in_every_layout_reads_with_its_header_detected(tmp_path, name):
    layout = TRACE_FORMATS[name]
    header = ["extra", layout.output, layout.time, layout.prompt]  # any order, one ignored
    later, earlier = TIMES[layout.time_parser]
    rows = [["x", "7", later, "30"], ["y", "5", earlier, "20"]]
    path = tmp_path / f"{name}.csv"
    path.write_text("\n".join(",".join(r) for r in [header, *rows]) + "\n", encoding="utf-8")
    trace = read_trace(path)
    assert trace.format == name
    assert trace.arrival_s.tolist() == [0.0, 1.5]
    assert trace.prompt_tokens.tolist() == [20, 30] and trace.output_tokens.tolist() == [5, 7]
    cols = (2, 3, 1)
    fast = traces._read_columns(path, name, len(header), cols)
    slow = traces._read_rows(path, name, len(header), cols)
    assert [np.asarray(c).tobytes() for c in fast] == [np.asarray(c).tobytes() for c in slow]


def test_the_scenario_takes_its_formats_and_their_docs_from_the_registry():
    from specsim.scenario import Workload
    from specsim.workload_settings import LengthDist

    for model in (Workload, LengthDist):
        values = typing.get_args(model.model_fields["format"].annotation)
        assert values == (AUTO, *TRACE_FORMATS)
    described = Workload.model_fields["trace"].description
    for layout in TRACE_FORMATS.values():
        assert all(column in described for column in layout.columns)
