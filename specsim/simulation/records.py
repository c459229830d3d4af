"""Per-request records: buffered CSV streaming and per-pool metric accumulation.

Rows arrive as tuples when requests finish. Every ``FLUSH_ROWS`` rows the buffer is turned into
numpy columns, folded into the pools' ``RequestStats`` and appended to ``requests.csv``, so memory
stays flat however many requests a run simulates.
"""

from __future__ import annotations

from pathlib import Path
from typing import TextIO

import numpy as np

from specsim.metrics import RequestStats

COLUMNS = (
    "id",
    "arrival_s",
    "scheduled_s",
    "first_token_s",
    "finish_s",
    "prompt_tokens",
    "output_tokens",
    "steps",
    "drafted",
    "accepted",
    "preemptions",
    "replica",
    "pool",
)
NUMERIC = COLUMNS[:-1]
_ROW_FORMAT = "%d,%.6f,%.6f,%.6f,%.6f,%d,%d,%d,%d,%d,%d,%d,%s\n"
FLUSH_ROWS = 8192


class RecordSink:
    """Collects finished-request rows; streams them to CSV and into per-pool statistics.

    A row is ``(id, arrival_s, scheduled_s, first_token_s, finish_s, prompt_tokens,
    output_tokens, steps, drafted, accepted, preemptions, replica, pool_index)``.
    """

    def __init__(self, pools: list[str], slo_limits: dict[str, float], path: Path | None):
        self.pools = pools
        self.stats = [RequestStats(slo_limits) for _ in pools]
        self.rows: list[tuple] = []
        self.count = 0
        self._fh: TextIO | None = None
        if path is not None:
            self._fh = open(path, "w", encoding="utf-8", newline="")  # noqa: SIM115
            self._fh.write(",".join(COLUMNS) + "\n")

    def add(self, row: tuple) -> None:
        self.rows.append(row)
        if len(self.rows) >= FLUSH_ROWS:
            self.flush()

    def flush(self) -> None:
        rows = self.rows
        if not rows:
            return
        self.rows = []
        self.count += len(rows)
        table = np.array(rows, dtype=np.float64)
        pool_index = table[:, -1].astype(np.int64)
        for index, stats in enumerate(self.stats):
            mask = pool_index == index
            if mask.any():
                part = table[mask]
                stats.add({name: part[:, i] for i, name in enumerate(NUMERIC)})
        if self._fh is not None:
            names = self.pools
            self._fh.write("".join(_ROW_FORMAT % (*row[:-1], names[row[-1]]) for row in rows))

    def close(self) -> None:
        self.flush()
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def read_records(path: str | Path) -> dict[str, np.ndarray]:
    """Read a ``requests.csv`` back as numpy columns (``pool`` as strings)."""
    with open(path, encoding="utf-8") as fh:
        header = fh.readline().strip().split(",")
        lines = fh.read().splitlines()
    columns: dict[str, list] = {name: [] for name in header}
    for line in lines:
        for name, value in zip(header, line.split(","), strict=True):
            columns[name].append(value)
    out: dict[str, np.ndarray] = {}
    for name, values in columns.items():
        if name == "pool":
            out[name] = np.asarray(values, dtype=str)
        elif name.endswith("_s"):
            out[name] = np.asarray(values, dtype=np.float64)
        else:
            out[name] = _numbers(values)
    return out


def _numbers(values: list[str]) -> np.ndarray:
    """Integers when every value is one, else floats (e.g. the engine's target_logprob_mean)."""
    try:
        return np.asarray(values, dtype=np.int64)
    except ValueError:
        return np.asarray(values, dtype=np.float64)
