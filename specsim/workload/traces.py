"""Request trace readers: Azure LLM inference, Vidur and BurstGPT layouts.

Each reader returns arrival times in seconds from the first request, prompt tokens and output
tokens as numpy arrays, in file order. A malformed row is a one-line ``SpecsimError`` naming the
file and the line number. A row with 0 prompt or 0 output tokens (BurstGPT logs failed requests
that way) is read as 1 token: every simulated request processes at least one token each way.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from specsim.bounds import MAX_SECONDS, MAX_TOKENS
from specsim.errors import SpecsimError
from specsim.fileio import read_text

# format -> (time column, prompt column, output column)
FORMATS: dict[str, tuple[str, str, str]] = {
    "azure": ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
    "vidur": ("arrived_at", "num_prefill_tokens", "num_decode_tokens"),
    "burstgpt": ("Timestamp", "Request tokens", "Response tokens"),
}


@dataclass(frozen=True)
class Trace:
    """A request trace: arrival offsets (s, from the first row), prompt and output tokens."""

    path: Path
    format: str
    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray

    def __len__(self) -> int:
        return int(self.arrival_s.shape[0])


def detect_format(header: list[str], path: Path) -> str:
    names = [h.strip() for h in header]
    for fmt, columns in FORMATS.items():
        if all(c in names for c in columns):
            return fmt
    known = "; ".join(f"{f}: {','.join(c)}" for f, c in FORMATS.items())
    raise SpecsimError(
        f"unrecognised trace header {','.join(names)!r}",
        file=str(path),
        key="line 1",
        fix=f"use one of these layouts ({known})",
    )


_EPOCH = dt.date(2000, 1, 1).toordinal()  # near epoch: keeps sub-microsecond float precision


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
    """Read a trace file; ``fmt`` is ``auto`` (from the header) or one of ``FORMATS``."""
    path = Path(path)
    return _read_trace_cached(path.resolve(), fmt, path.stat().st_mtime_ns if path.exists() else 0)


@lru_cache(maxsize=8)
def _read_trace_cached(path: Path, fmt: str, _mtime: int) -> Trace:
    text = read_text(path, "trace file")
    reader = csv.reader(io.StringIO(text))
    try:
        header = next(reader)
    except StopIteration:
        raise SpecsimError("trace file is empty", file=str(path), fix="give a trace") from None
    if fmt == "auto":
        fmt = detect_format(header, path)
    names = [h.strip() for h in header]
    try:
        cols = [names.index(c) for c in FORMATS[fmt]]
    except ValueError:
        raise SpecsimError(
            f"trace header lacks the {fmt!r} columns {','.join(FORMATS[fmt])}",
            file=str(path),
            key="line 1",
            fix="check the file or the format option",
        ) from None
    to_time = parse_timestamp if fmt == "azure" else float
    times: list[float] = []
    prompts: list[int] = []
    outputs: list[int] = []
    width = len(names)
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
    if not times:
        raise SpecsimError("trace has no rows", file=str(path), fix="give a trace with requests")
    arrival = np.asarray(times, dtype=np.float64)
    if not np.all(np.isfinite(arrival)):
        bad = int(np.flatnonzero(~np.isfinite(arrival))[0]) + 2
        raise SpecsimError(
            f"line {bad}: time is not finite", file=str(path), fix="repair or remove the row"
        )
    order = np.argsort(arrival, kind="stable")  # some traces are not sorted by time
    arrival = arrival[order] - arrival[order[0]]
    if arrival[-1] > MAX_SPAN_S:
        raise SpecsimError(
            f"line {int(order[0]) + 2} to line {int(order[-1]) + 2}: the arrivals span "
            f"{arrival[-1]:.3g} s, more than {MAX_SPAN_S:.0e} s",
            file=str(path),
            fix="check the time column's unit (seconds) and rows far from the rest",
        )
    for array in (arrival,):
        array.setflags(write=False)
    prompt = np.asarray(prompts, dtype=np.int64)[order]
    output = np.asarray(outputs, dtype=np.int64)[order]
    prompt.setflags(write=False)
    output.setflags(write=False)
    return Trace(path, fmt, arrival, prompt, output)
