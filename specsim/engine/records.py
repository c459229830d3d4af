"""The engine's per-request records and summary, in the simulator's format.

``requests.csv`` holds the simulator's columns (``specsim.metrics.RECORD_COLUMNS``) in the
same order, then the engine's quality columns: ``target_logprob_mean`` (mean raw log-probability,
in nats, that the target gives the generated tokens) and ``eos`` (1 when the request stopped at
EOS). ``summary.json`` is built by the same metric functions (``specsim.metrics.summarise``), so
every key means what it means in a simulation's summary.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from specsim.bounds import MAX_FACTOR, MAX_K, MAX_REPLICAS, MAX_REQUESTS, MAX_SECONDS, MAX_TOKENS
from specsim.engine.workload import EngineRequest
from specsim.errors import SpecsimError
from specsim.fileio import read_text
from specsim.metrics import (
    RECORD_COLUMNS,
    EngineStats,
    LogHistogram,
    RequestStats,
    round_floats,
    summarise,
)
from specsim.parsing import reading_csv

if TYPE_CHECKING:  # the engine loop imports torch; reading records must not
    from specsim.engine.iteration_log import IterationLog

QUALITY_COLUMNS = ("target_logprob_mean", "eos")
QUALITY_FORMATS = {"target_logprob_mean": "%.9g", "eos": "%d"}  # as format_csv writes them
ENGINE_COLUMNS = (*RECORD_COLUMNS, *QUALITY_COLUMNS)
_FLOAT_COLUMNS = {"arrival_s", "scheduled_s", "first_token_s", "finish_s", "target_logprob_mean"}
# Column -> (type, lowest, highest): what a real run's request can hold. A value outside is a
# damaged file (a count of -1, an EOS flag of 2), not a result to test.
COLUMN_BOUNDS: dict[str, tuple[type, float, float]] = {
    "id": (int, 0, MAX_REQUESTS),
    "arrival_s": (float, 0.0, MAX_SECONDS),
    "scheduled_s": (float, 0.0, MAX_SECONDS),
    "first_token_s": (float, 0.0, MAX_SECONDS),
    "finish_s": (float, 0.0, MAX_SECONDS),
    "prompt_tokens": (int, 1, MAX_TOKENS),
    "output_tokens": (int, 0, MAX_TOKENS),
    "steps": (int, 0, MAX_TOKENS),
    "drafted": (int, 0, MAX_K * MAX_TOKENS),
    "accepted": (int, 0, MAX_K * MAX_TOKENS),
    "preemptions": (int, 0, MAX_TOKENS),
    "replica": (int, 0, MAX_REPLICAS),
    "target_logprob_mean": (float, -MAX_FACTOR, 0.0),
    "eos": (int, 0, 1),
}


def record_columns(requests: list[EngineRequest]) -> dict[str, np.ndarray]:
    """Record columns (numpy) of finished requests, as the metric functions take them."""
    rows = {
        "id": [r.rid for r in requests],
        "arrival_s": [r.arrival for r in requests],
        "scheduled_s": [r.scheduled for r in requests],
        "first_token_s": [r.first_token for r in requests],
        "finish_s": [r.finish for r in requests],
        "prompt_tokens": [r.prompt_len for r in requests],
        "output_tokens": [r.generated for r in requests],
        "steps": [r.steps for r in requests],
        "drafted": [r.drafted for r in requests],
        "accepted": [r.accepted for r in requests],
        "preemptions": [0 for _ in requests],
        "replica": [0 for _ in requests],
        "target_logprob_mean": [r.logprob_sum / max(r.generated, 1) for r in requests],
        "eos": [int(r.eos) for r in requests],
    }
    out = {
        name: np.asarray(values, dtype=np.float64 if name in _FLOAT_COLUMNS else np.int64)
        for name, values in rows.items()
    }
    out["pool"] = np.asarray(["main"] * len(requests), dtype=str)
    return out


def engine_summary(
    records: dict[str, np.ndarray], log: IterationLog, k_max: int, max_batch: int, kv_capacity: int
) -> dict[str, Any]:
    """summary.json of an engine run: ``specsim.metrics.summarise`` over its records and steps."""
    requests = RequestStats()
    requests.add(records)
    engine = EngineStats(k_max, kv_capacity, max_batch)
    engine.add_iterations(
        np.asarray(log.dt, dtype=np.float64),
        np.asarray(log.batch, dtype=np.int64),
        np.asarray(log.kv_tokens, dtype=np.float64),
    )
    if log.accepted:
        engine.add_steps(np.concatenate(log.accepted), np.concatenate(log.drafted))
    itl = LogHistogram()
    itl.add(np.asarray(log.itl, dtype=np.float64))
    engine.itl = itl
    engine.window_rows = float(log.window_rows)
    engine.decode_rows = float(log.decode_rows)
    summary = summarise(requests, engine, replicas=1, price_per_hour_usd=0.0)
    summary["target_logprob_mean"] = float(records["target_logprob_mean"].mean())
    summary["eos_stops"] = int(records["eos"].sum())
    return round_floats(summary)


def format_csv(records: dict[str, np.ndarray]) -> str:
    """requests.csv text, rows by request id: the simulator's columns, then the quality ones."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(ENGINE_COLUMNS)
    for i in np.argsort(records["id"], kind="stable"):
        cells = []
        for name in ENGINE_COLUMNS:
            value = records[name][i]
            if name == "target_logprob_mean":
                cells.append(f"{float(value):.9g}")
            elif name in _FLOAT_COLUMNS:
                cells.append(f"{float(value):.6f}")
            else:
                cells.append(str(value))
        writer.writerow(cells)
    return buf.getvalue()


def read_engine_records(path: str | Path) -> dict[str, np.ndarray]:
    """Read an engine's requests.csv; a missing column or malformed row is a one-line error."""
    path = Path(path)
    with reading_csv(str(path)):
        lines = list(csv.reader(io.StringIO(read_text(path, "requests.csv"), newline="")))
    if not lines:
        raise SpecsimError("file is empty", file=str(path), fix="point at an engine run's folder")
    header = [name.strip() for name in lines[0]]
    missing = [c for c in ENGINE_COLUMNS if c not in header]
    if missing:
        raise SpecsimError(
            f"column {missing[0]!r} missing ({len(missing)} in all)",
            file=str(path),
            key=missing[0],
            fix="give the folder of a real-engine run (specsim validate writes engine/)",
        )
    columns: dict[str, list[str]] = {name: [] for name in header}
    for number, cells in enumerate(lines[1:], start=2):
        if len(cells) != len(header):
            raise SpecsimError(
                f"expected {len(header)} cells, found {len(cells)}",
                file=str(path),
                key=f"line {number}",
                fix="the file is damaged; run the engine again",
            )
        for name, cell in zip(header, cells, strict=True):
            columns[name].append(cell)
    out: dict[str, np.ndarray] = {}
    for name, values in columns.items():
        if name == "pool":
            out[name] = np.asarray(values, dtype=str)
            continue
        dtype = np.float64 if name in _FLOAT_COLUMNS or name.endswith("_s") else np.int64
        word = "a number" if dtype is np.float64 else "a whole number"
        try:
            out[name] = np.asarray(values, dtype=dtype)
        except (ValueError, OverflowError):
            line, bad = next((i, v) for i, v in enumerate(values, 2) if not _parses(v, dtype))
            raise SpecsimError(
                f"line {line}: {bad!r} is not {word}",
                file=str(path),
                key=name,
                fix="the file is damaged; run the engine again",
            ) from None
        _check_range(out[name], name, str(path))
    if "drafted" in out and "accepted" in out and (out["accepted"] > out["drafted"]).any():
        line = int(np.flatnonzero(out["accepted"] > out["drafted"])[0]) + 2
        raise SpecsimError(
            f"line {line}: more tokens accepted than drafted",
            file=str(path),
            key="accepted",
            fix="the file is damaged; run the engine again",
        )
    return out


def _check_range(values: np.ndarray, name: str, source: str) -> None:
    low, high = COLUMN_BOUNDS.get(name, (float, -np.inf, np.inf))[1:]
    bad = ~(np.isfinite(values) & (values >= low) & (values <= high))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise SpecsimError(
            f"line {i + 2}: {values[i].item()!r} is outside [{low:g}, {high:g}]",
            file=source,
            key=name,
            fix="the file is damaged; run the engine again",
        )


def _parses(value: str, dtype) -> bool:
    try:
        np.asarray([value], dtype=dtype)
    except (ValueError, OverflowError):
        return False
    return True


ITERATION_COLUMNS = (
    "kind",
    "window",
    "batch",
    "new_tokens",
    "context",
    "pairs",
    "seconds",
    "target_s",
    "drafter_s",
)


def format_iterations(log: IterationLog) -> str:
    """iterations.csv: one row per engine iteration (what the target pass did, its time, and
    of it the target's and the drafter's passes: empty on the wall clock)."""
    lines = [",".join(ITERATION_COLUMNS)]
    split = zip(log.target_s, log.drafter_s, strict=True) if log.target_s else [None] * len(log.dt)
    columns = (log.kind, log.window, log.batch, log.new_tokens, log.context, log.pairs, log.dt)
    for *row, parts in zip(*columns, split, strict=True):
        kind, k, batch, new, context, pairs, dt = row
        passes = f"{parts[0]:.6f},{parts[1]:.6f}" if parts else ","
        lines.append(f"{kind},{k},{batch},{new},{context},{pairs:.1f},{dt:.6f},{passes}")
    return "\n".join(lines) + "\n"
