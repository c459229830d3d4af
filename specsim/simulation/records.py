"""Per-request records: buffered CSV streaming and per-pool metric accumulation.

Rows arrive as tuples when requests finish. Every ``FLUSH_ROWS`` rows the buffer is turned into
numpy columns and folded into the pools' ``RequestStats``, so memory stays flat however many
requests a run simulates. ``requests.csv`` is written in request-id order through the csv module:
a finished row waits (in a heap) only until every earlier request has finished, so what is held
is the requests overtaken by later ones, not the run.
"""

from __future__ import annotations

import csv
import heapq
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
_CELL_FORMATS = ("%d", "%.6f", "%.6f", "%.6f", "%.6f", "%d", "%d", "%d", "%d", "%d", "%d", "%d")
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
        self._waiting: list[tuple] = []  # finished rows not yet written, a heap by request id
        self._next_id = 0
        if path is not None:
            self._fh = open(path, "w", encoding="utf-8", newline="")  # noqa: SIM115
            self._csv = csv.writer(self._fh, lineterminator="\n")
            self._csv.writerow(COLUMNS)

    def add(self, row: tuple) -> None:
        self.rows.append(row)
        if self._fh is not None:
            heapq.heappush(self._waiting, row)
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
            self._write_ready()

    def _write_ready(self, everything: bool = False) -> None:
        """Write the waiting rows that continue the id sequence (all of them at the end)."""
        waiting, ready = self._waiting, []
        while waiting and (everything or waiting[0][0] == self._next_id):
            row = heapq.heappop(waiting)
            self._next_id = row[0] + 1
            ready.append(row)
        names = self.pools
        self._csv.writerows(
            [*(f % v for f, v in zip(_CELL_FORMATS, row, strict=False)), names[row[-1]]]
            for row in ready
        )

    def close(self) -> None:
        self.flush()
        if self._fh is not None:
            self._write_ready(everything=True)
            self._fh.close()
            self._fh = None


def read_records(path: str | Path) -> dict[str, np.ndarray]:
    """Read a ``requests.csv`` back as numpy columns (``pool`` as strings)."""
    with open(path, encoding="utf-8", newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader)
        columns: dict[str, list] = {name: [] for name in header}
        for row in reader:
            for name, value in zip(header, row, strict=True):
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
