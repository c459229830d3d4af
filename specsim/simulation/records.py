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

from specsim.errors import SpecsimError
from specsim.fileio import check_input_file
from specsim.metrics import RECORD_COLUMNS, RequestStats

NUMERIC = RECORD_COLUMNS[:-1]
_CELL_FORMATS = ("%d", "%.6f", "%.6f", "%.6f", "%.6f", "%d", "%d", "%d", "%d", "%d", "%d", "%d")
# Each numeric column's printf format in requests.csv, and the type it reads back as.
CELL_FORMATS = dict(zip(NUMERIC, _CELL_FORMATS, strict=True))
COLUMN_DTYPES = {name: "float64" if f[-1] == "f" else "int64" for name, f in CELL_FORMATS.items()}
COLUMN_DTYPES["pool"] = "str"
FLUSH_ROWS = 8192


class RecordSink:
    """Collects finished-request rows; streams them to CSV and into per-pool statistics.

    A row is ``(id, arrival_s, scheduled_s, first_token_s, finish_s, prompt_tokens,
    output_tokens, steps, drafted, accepted, preemptions, replica, pool_index)``. A request
    arrives ``delay`` after its client sent it (``simulation.fleet.Frontend``): its row's
    arrival is taken back to the send time, which its TTFT and E2E count from.
    """

    def __init__(
        self,
        pools: list[str],
        slo_limits: dict[str, float],
        path: Path | None,
        delay: float = 0.0,
    ):
        self.pools = pools
        self.delay = delay
        self.stats = [RequestStats(slo_limits) for _ in pools]
        self.rows: list[tuple] = []
        self.count = 0
        self._fh: TextIO | None = None
        self._waiting: list[tuple] = []  # finished rows not yet written, a heap by request id
        self._next_id = 0
        if path is not None:
            self._fh = open(path, "w", encoding="utf-8", newline="")  # noqa: SIM115
            self._csv = csv.writer(self._fh, lineterminator="\n")
            self._csv.writerow(RECORD_COLUMNS)

    def add(self, row: tuple) -> None:
        if self.delay:
            row = (row[0], row[1] - self.delay, *row[2:])
        self.rows.append(row)
        if self._fh is not None:
            heapq.heappush(self._waiting, row)
        if len(self.rows) >= FLUSH_ROWS:
            self.flush()

    def add_rows(self, rows) -> None:
        """``add`` each of ``rows`` in turn (the buffer folds where it would)."""
        for row in rows:
            self.add(row)

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


def read_requests(path: str | Path):
    """A ``requests.csv`` as a pandas DataFrame: the simulator's columns as int64, float64 (the
    times) and text (``pool``, so that a pool named ``1`` or ``NA`` stays a name); any further
    column (the real engine's) as ``pandas.read_csv`` types it."""
    import pandas as pd

    path = check_input_file(path, "requests.csv")
    try:
        frame = pd.read_csv(path, dtype=COLUMN_DTYPES, keep_default_na=False, na_values=[""])
    except (ValueError, pd.errors.ParserError, UnicodeDecodeError) as exc:
        raise SpecsimError(
            f"not a readable requests.csv ({' '.join(str(exc).split())})",
            file=str(path),
            fix="give the requests.csv a specsim run wrote",
        ) from None
    seconds = [name for name in frame.columns if name.endswith("_s")]
    return frame.astype(dict.fromkeys(seconds, "float64"))


def read_records(path: str | Path) -> dict[str, np.ndarray]:
    """Read a ``requests.csv`` back as numpy columns (``pool`` as strings)."""
    frame = read_requests(path)
    out = {name: frame[name].to_numpy() for name in frame.columns}
    if "pool" in out:
        out["pool"] = np.asarray(out["pool"], dtype=str)
    return out
