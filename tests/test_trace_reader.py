"""The column-wise trace reader: the same numbers, bit for bit, as the row-by-row rules, the same
errors, and memory that grows by the columns' bytes per row, not by Python objects."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from specsim.errors import SpecsimError
from specsim.trace_formats import TRACE_FORMATS
from specsim.workload import traces
from specsim.workload.traces import read_trace

DATA = Path(__file__).parent / "data"
AZURE = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
VIDUR = "arrived_at,num_prefill_tokens,num_decode_tokens\n"


def _both_readers(path: Path, fmt: str):
    """(vectorised, row by row) columns of one file; the vectorised one may decline (None)."""
    names = [h.strip() for h in traces._header(path)]
    cols = tuple(names.index(c) for c in TRACE_FORMATS[fmt].columns)
    try:
        fast = traces._read_columns(path, fmt, len(names), cols)
    except traces._Irregular:
        fast = None
    return fast, traces._read_rows(path, fmt, len(names), cols)


def _bytes(columns) -> list[bytes]:
    return [np.ascontiguousarray(c).tobytes() for c in columns]


@pytest.mark.parametrize(
    "name", ["AzureLLMInferenceTrace_conv.csv", "AzureLLMInferenceTrace_code.csv"]
)
def test_the_public_traces_read_vectorised_to_the_bits_of_the_row_rules(traces_dir, name):
    fast, rows = _both_readers(traces_dir / name, "azure")
    assert fast is not None  # the vectorised reader takes Azure's own form
    assert _bytes(fast) == _bytes(rows)


def test_the_other_layouts_read_vectorised_to_the_same_bits():
    for name, fmt in (("vidur_small.csv", "vidur"), ("burstgpt_small.csv", "burstgpt")):
        fast, rows = _both_readers(DATA / name, fmt)
        assert fast is not None and _bytes(fast) == _bytes(rows)


# Unusual spellings (some the vectorised reader declines, some it takes): read_trace must give
# the row rules' result to the bit either way.
UNUSUAL = {
    "blank line": AZURE + "2023-11-16 18:15:46.68,10,5\n\n2023-11-16 18:15:47.5,20,6\n",
    "T separator": AZURE + "2023-11-16T18:15:46.68,10,5\n2023-11-16 18:15:47.5,20,6\n",
    "ten fraction digits": AZURE + "2023-11-16 18:15:46.1234567891,10,5\n"
    "2023-11-16 18:15:47.5,20,6\n",
    "second 60": AZURE + "2023-11-16 18:15:60.3,10,5\n2023-11-16 18:15:47.5,20,6\n",
    "no fraction": AZURE + "2023-11-16 18:15:46,10,5\n2023-11-16 18:15:47.5,20,6\n",
    "padded number": VIDUR + "0.5, 10 ,5\n1.25,20,6\n",
}


@pytest.mark.parametrize("case", list(UNUSUAL))
def test_unusual_files_get_the_row_rules_result(tmp_path, case):
    path = tmp_path / "t.csv"
    path.write_text(UNUSUAL[case], encoding="utf-8")
    fmt = "vidur" if UNUSUAL[case].startswith(VIDUR) else "azure"
    _, rows = _both_readers(path, fmt)
    trace = read_trace(path)
    order = np.argsort(rows[0], kind="stable")
    assert trace.arrival_s.tobytes() == (rows[0][order] - rows[0][order][0]).tobytes()
    assert trace.prompt_tokens.tolist() == rows[1][order].tolist()


ERRORS = {
    "short row": (VIDUR + "0,10,5\n1,10\n", "line 3: expected 3 fields, found 2"),
    "long row": (VIDUR + "0,10,5\n1,10,5,7\n", "line 3: expected 3 fields, found 4"),
    "empty cell": (VIDUR + "0,10,5\n1,,5\n", "line 3: malformed row"),
    "word": (VIDUR + "0,10,5\n1,ten,5\n", "line 3: malformed row"),
    "fraction": (VIDUR + "0,10,5\n1,2.5,5\n", "line 3: malformed row"),
    "huge count": (VIDUR + "0,10,5\n1,1e30,5\n", "line 3: malformed row"),
    "infinite time": (VIDUR + "0,10,5\ninf,10,5\n", "line 3: time is not finite"),
    "bad date": (AZURE + "2023-11-16 18:15:46.6,10,5\n2023-13-16 18:15:46.6,10,5\n", "line 3"),
    "no rows": (VIDUR, "trace has no rows"),
    "empty file": ("", "trace file is empty"),
}


@pytest.mark.parametrize("case", list(ERRORS))
def test_malformed_files_are_one_line_errors_naming_file_and_line(tmp_path, case):
    text, expected = ERRORS[case]
    path = tmp_path / "t.csv"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(SpecsimError) as info:
        read_trace(path)
    line = info.value.one_line()
    assert expected in line and str(path) in line and "\n" not in line


def test_a_non_utf8_trace_names_the_byte(tmp_path):
    path = tmp_path / "t.csv"
    data = VIDUR.encode() + b"0,10,5\n1,1\xe90,5\n"
    path.write_bytes(data)
    with pytest.raises(SpecsimError, match=f"not UTF-8 text \\(byte {data.index(0xE9)}\\)"):
        read_trace(path)


def _traced_peak(path: Path) -> int:
    traces._read_trace_cached.cache_clear()
    tracemalloc.start()
    try:
        trace = read_trace(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(trace) > 0
    return peak


@pytest.mark.slow
def test_memory_grows_by_the_columns_not_by_python_objects(tmp_path):
    """Peak traced memory between a 50,000- and a 250,000-row file, per added row.

    The finished trace is three 8-byte columns (24 B a row); reading holds at most the chunks'
    columns and their concatenation, then the unsorted columns, the sort order and the sorted
    copies: under 8 x 8 = 64 B a row. The old reader kept Python floats and ints in lists and
    the whole text twice (about 300 B a row). The difference of two sizes cancels the fixed
    cost (modules, one chunk of text cells).
    """
    rng = np.random.default_rng(0)
    sizes = (50_000, 250_000)
    peaks = []
    for rows in sizes:
        table = np.column_stack(
            [np.cumsum(rng.exponential(0.05, rows)), rng.integers(1, 8192, (rows, 2))]
        )
        path = tmp_path / f"{rows}.csv"
        np.savetxt(path, table, fmt=("%.6f", "%d", "%d"), delimiter=",", header=VIDUR.strip(),
                   comments="")  # fmt: skip
        peaks.append(_traced_peak(path))
    per_row = (peaks[1] - peaks[0]) / (sizes[1] - sizes[0])
    assert per_row < 8 * 8, f"{per_row:.0f} B per row"
