"""Request trace readers, for every layout in ``specsim.trace_formats`` (Azure LLM inference,
Vidur, BurstGPT).

Each reader returns arrival times in seconds from the first request, prompt tokens and output
tokens as numpy arrays, sorted by arrival. A malformed row is a one-line ``SpecsimError`` naming
the file and the line number. A row with 0 prompt or 0 output tokens (BurstGPT logs failed
requests that way) is read as 1 token: every simulated request processes at least one token each
way.

Traces are read column-wise, so memory follows the columns (8 bytes a value), not Python objects:
pandas reads the file in chunks of text cells, and each chunk becomes numpy columns by the same
arithmetic as the row-by-row rules below. A file that this does not take as it stands (an empty
or missing cell, a blank line, a long row, a value the vectorised parse does not cover) is read
again row by row into typed arrays; that reader decides what is accepted and words every error.
"""

from __future__ import annotations

import csv
import datetime as dt
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from specsim.bounds import MAX_SECONDS, MAX_TOKENS
from specsim.errors import SpecsimError
from specsim.fileio import check_input_file, read_text
from specsim.parsing import reading_csv
from specsim.trace_formats import AUTO, TRACE_FORMATS


@dataclass(frozen=True)
class Trace:
    """A request trace: arrival offsets (s, from the first row), prompt and output tokens."""

    path: Path
    format: str
    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    file_rows: np.ndarray | None = None  # each request's data row in the file (0 = first)

    def __len__(self) -> int:
        return int(self.arrival_s.shape[0])


def detect_format(header: list[str], path: Path) -> str:
    names = [h.strip() for h in header]
    for fmt, layout in TRACE_FORMATS.items():
        if all(c in names for c in layout.columns):
            return fmt
    known = "; ".join(f"{f}: {','.join(layout.columns)}" for f, layout in TRACE_FORMATS.items())
    raise SpecsimError(
        f"unrecognised trace header {','.join(names)!r}",
        file=str(path),
        key="line 1",
        fix=f"use one of these layouts ({known})",
    )


_EPOCH = dt.date(2000, 1, 1).toordinal()  # near epoch: keeps sub-microsecond float precision
_EPOCH_FROM_1970_DAYS = _EPOCH - dt.date(1970, 1, 1).toordinal()
CHUNK_ROWS = 1 << 14
# Azure's stamp as the vectorised reader takes it: YYYY-MM-DD HH:MM:SS[.f...] (up to 9 fraction
# digits), character by character; any other spelling goes to the row-by-row reader.
_STAMP_SEPARATORS = {4: "-", 7: "-", 10: " ", 13: ":", 16: ":", 19: "."}
_STAMP_LENGTHS = range(21, 30)


@lru_cache(maxsize=64)
def _day_seconds(date_text: str) -> float:
    return (dt.date.fromisoformat(date_text).toordinal() - _EPOCH) * 86400.0


def parse_timestamp(text: str) -> float:
    """Seconds for an Azure-style ``YYYY-MM-DD HH:MM:SS.fffffff`` stamp (any fraction digits)."""
    date_text, sep, clock = text.strip().replace("T", " ").partition(" ")
    if not sep:
        raise ValueError(f"not a date and time: {text!r}")
    hours, minutes, seconds = clock.split(":")
    return _day_seconds(date_text) + int(hours) * 3600 + int(minutes) * 60 + float(seconds)


# The longest span of arrivals a trace may hold (3 years): far past any recorded trace, and
# short of what would make a replay's arithmetic meaningless.
MAX_SPAN_S = 100 * MAX_SECONDS


def _tokens(text: str) -> int:
    value = float(text)
    if not 0 <= value <= MAX_TOKENS or value != int(value):
        raise ValueError(
            f"token count {text.strip()!r} is not a whole number from 0 to {MAX_TOKENS:,}"
        )
    return max(1, int(value))


def read_trace(path: str | Path, fmt: str = "auto") -> Trace:
    """Read a trace file; ``fmt`` is ``auto`` (from the header) or one of ``TRACE_FORMATS``."""
    path = Path(path)
    return _read_trace_cached(path.resolve(), fmt, path.stat().st_mtime_ns if path.exists() else 0)


@lru_cache(maxsize=8)
def _read_trace_cached(path: Path, fmt: str, _mtime: int) -> Trace:
    check_input_file(path, "trace file")
    header = _header(path)
    if fmt == AUTO:
        fmt = detect_format(header, path)
    names = [h.strip() for h in header]
    columns = TRACE_FORMATS[fmt].columns
    try:
        cols = tuple(names.index(c) for c in columns)
    except ValueError:
        raise SpecsimError(
            f"trace header lacks the {fmt!r} columns {','.join(columns)}",
            file=str(path),
            key="line 1",
            fix="check the file or the format option",
        ) from None
    try:
        arrival, prompt, output = _read_columns(path, fmt, len(names), cols)
    except _Irregular:
        arrival, prompt, output = _read_rows(path, fmt, len(names), cols)
    order = np.argsort(arrival, kind="stable")  # some traces are not sorted by time
    arrival = arrival[order]
    arrival -= arrival[0]
    if arrival[-1] > MAX_SPAN_S:
        raise SpecsimError(
            f"line {int(order[0]) + 2} to line {int(order[-1]) + 2}: the arrivals span "
            f"{arrival[-1]:.3g} s, more than {MAX_SPAN_S:.0e} s",
            file=str(path),
            fix="check the time column's unit (seconds) and rows far from the rest",
        )
    prompt, output = prompt[order], output[order]
    for column in (arrival, prompt, output, order):
        column.setflags(write=False)
    return Trace(path, fmt, arrival, prompt, output, order)


def _header(path: Path) -> list[str]:
    try:
        with open(path, encoding="utf-8", newline="") as fh, reading_csv(str(path)):
            return next(csv.reader(fh))
    except StopIteration:
        raise SpecsimError("trace file is empty", file=str(path), fix="give a trace") from None
    except UnicodeDecodeError:
        read_text(path, "trace file")  # words the error with the byte's offset in the file
        raise


class _Irregular(Exception):
    """The file is not one the vectorised reader takes as it stands."""


def _read_columns(path: Path, fmt: str, width: int, cols: tuple[int, int, int]):
    """The vectorised reader: pandas text chunks to numpy columns, or ``_Irregular``."""
    import pandas as pd

    parts: tuple[list, list, list] = ([], [], [])
    try:
        chunks = pd.read_csv(
            path,
            header=None,
            skiprows=1,
            names=list(range(width)),
            index_col=False,
            dtype=str,
            na_filter=False,
            skip_blank_lines=False,
            encoding="utf-8",
            engine="c",
            chunksize=CHUNK_ROWS,
        )
        with chunks:
            for chunk in chunks:
                # A short row or a blank line comes back with empty cells; so does an empty cell.
                if (chunk.to_numpy() == "").any():
                    raise _Irregular
                cells = [chunk[c] for c in cols]
                parts[0].append(_times(cells[0], fmt))
                parts[1].append(_token_counts(cells[1]))
                parts[2].append(_token_counts(cells[2]))
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError):
        raise _Irregular from None
    except (ValueError, OverflowError):  # a cell that is not a number of the kind wanted
        raise _Irregular from None
    if sum(len(part) for part in parts[0]) == 0:
        raise _Irregular  # the row reader words "no rows"
    return tuple(np.concatenate(part) for part in parts)


def _token_counts(cells) -> np.ndarray:
    """``_tokens`` of every cell, vectorised: ``float()`` of each, then whole and >= 0."""
    values = cells.to_numpy(dtype=object).astype(np.float64)
    if not (
        np.all(values >= 0) and np.all(values <= MAX_TOKENS) and np.all(values == np.floor(values))
    ):
        raise _Irregular
    return np.maximum(values, 1).astype(np.int64)


def _times(cells, fmt: str) -> np.ndarray:
    """Arrival seconds of every cell, by the same float operations as the row-by-row reader."""
    values = TIME_PARSERS[TRACE_FORMATS[fmt].time_parser].column(cells)
    if not np.all(np.isfinite(values)):
        raise _Irregular
    return values


def _seconds_column(cells) -> np.ndarray:
    """``float()`` of every cell."""
    return cells.to_numpy(dtype=object).astype(np.float64)


def _datetime_column(cells) -> np.ndarray:
    """``parse_timestamp`` of every cell, stamps of one length at a time."""
    text = np.asarray(cells.to_numpy(), dtype=str)
    lengths = np.char.str_len(text)
    values = np.empty(len(text))
    for length in np.unique(lengths):
        rows = lengths == length
        values[rows] = _azure_seconds(text[rows], int(length))
    return values


def _azure_seconds(text: np.ndarray, length: int) -> np.ndarray:
    """``parse_timestamp`` of stamps that all have ``length`` characters, by the same float
    operations: the seconds field is an exact integer over a power of ten, which rounds to the
    same double as ``float()`` of its text."""
    if length != 19 and length not in _STAMP_LENGTHS:
        raise _Irregular
    codes = text.astype(f"U{length}").view(np.uint32).reshape(len(text), length)
    digits = codes.astype(np.int64) - ord("0")
    for at in range(length):
        if at in _STAMP_SEPARATORS:
            if np.any(codes[:, at] != ord(_STAMP_SEPARATORS[at])):
                raise _Irregular
        elif np.any((digits[:, at] < 0) | (digits[:, at] > 9)):
            raise _Irregular
    days = text.astype("U10").astype("datetime64[D]").astype(np.int64) - _EPOCH_FROM_1970_DAYS
    hours = digits[:, 11] * 10 + digits[:, 12]
    minutes = digits[:, 14] * 10 + digits[:, 15]
    places = [17, 18, *range(20, length)]
    units = np.zeros(len(text), dtype=np.int64)
    for at in places:
        units = units * 10 + digits[:, at]
    seconds = units / 10.0 ** (len(places) - 2)
    # parse_timestamp's order: ((day seconds + hours) + minutes) + seconds.
    return days * 86400.0 + hours * 3600 + minutes * 60 + seconds


@dataclass(frozen=True)
class TimeParser:
    """One spelling of a trace's time column (``trace_formats.TIME_SPELLINGS``), read two ways
    that agree to the bit: ``cell`` for the row-by-row reader, which decides what is accepted;
    ``column`` for the vectorised one, which raises ``_Irregular`` on anything it does not take.
    """

    cell: Callable[[str], float]
    column: Callable[..., np.ndarray]


TIME_PARSERS: dict[str, TimeParser] = {
    "seconds": TimeParser(float, _seconds_column),
    "datetime": TimeParser(parse_timestamp, _datetime_column),
}


def _read_rows(path: Path, fmt: str, width: int, cols: tuple[int, int, int]):
    """The row-by-row reader: the rules of every layout and the words of every error."""
    to_time = TIME_PARSERS[TRACE_FORMATS[fmt].time_parser].cell
    times, prompts, outputs = array("d"), array("q"), array("q")
    try:
        with open(path, encoding="utf-8", newline="") as fh, reading_csv(str(path)):
            reader = csv.reader(fh)
            next(reader)
            for line_no, row in enumerate(reader, start=2):
                if not row or (len(row) == 1 and not row[0].strip()):
                    continue
                if len(row) != width:
                    raise SpecsimError(
                        f"line {line_no}: expected {width} fields, found {len(row)}",
                        file=str(path),
                        fix="repair or remove the row",
                    )
                try:
                    times.append(to_time(row[cols[0]]))
                    prompts.append(_tokens(row[cols[1]]))
                    outputs.append(_tokens(row[cols[2]]))
                except (ValueError, OverflowError) as exc:
                    raise SpecsimError(
                        f"line {line_no}: malformed row ({exc})",
                        file=str(path),
                        fix="repair or remove the row",
                    ) from None
    except UnicodeDecodeError:
        read_text(path, "trace file")  # words the error with the byte's offset in the file
        raise
    if not times:
        raise SpecsimError("trace has no rows", file=str(path), fix="give a trace with requests")
    arrival = np.frombuffer(times, dtype=np.float64).copy()
    if not np.all(np.isfinite(arrival)):
        bad = int(np.flatnonzero(~np.isfinite(arrival))[0]) + 2
        raise SpecsimError(
            f"line {bad}: time is not finite", file=str(path), fix="repair or remove the row"
        )
    prompt = np.frombuffer(prompts, dtype=np.int64).copy()
    output = np.frombuffer(outputs, dtype=np.int64).copy()
    return arrival, prompt, output
