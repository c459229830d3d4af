"""Trace reading: peak memory and speed of ``read_trace`` on a generated 1,000,000-row trace.

Figures (for the Azure layout, whose timestamps are the costliest to parse, and Vidur's):
- ``*_peak_bytes_per_row``: the peak of Python's traced allocations while reading, per row;
- ``*_peak_rss_mb``: the reading child process's peak resident memory (VmHWM) less its resident
  memory once the reader's modules are imported;
- ``*_s_per_million_rows``: wall seconds to read the file (in a child without tracemalloc).

The baseline is the three finished columns (arrival, prompt and output: 24 bytes a row); the
ratio is the Azure peak over it (reading cannot do better than about 1, the sort needs a copy).

    python benchmarks/bench_traces.py            # 1,000,000 rows
    python benchmarks/bench_traces.py --quick    # 100,000 rows
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

COLUMN_BYTES_PER_ROW = 3 * 8

CHILD = """
import json, sys, time, tracemalloc
import pandas
from specsim.workload.traces import read_trace

def status(key):
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith(key))

traced = sys.argv[2] == "traced"
rss = status("VmRSS:")
if traced:
    tracemalloc.start()
started = time.perf_counter()
trace = read_trace(sys.argv[1])
seconds = time.perf_counter() - started
peak = tracemalloc.get_traced_memory()[1] if traced else 0
rss_kb = status("VmHWM:") - rss
print(json.dumps({"rows": len(trace), "peak": peak, "seconds": seconds, "rss_kb": rss_kb}))
"""


def write_trace(path: Path, rows: int, layout: str, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(0.05, rows)
    times = np.cumsum(gaps)
    prompts = rng.integers(1, 8192, rows)
    outputs = rng.integers(1, 1024, rows)
    with open(path, "w", encoding="utf-8", newline="") as fh:
        if layout == "azure":
            fh.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
            start = np.datetime64("2023-11-16T18:15:46", "ns")
            stamps = start + (times * 1e9).astype("timedelta64[ns]")
            for stamp, p, o in zip(stamps.astype(str), prompts, outputs, strict=True):
                # Azure's own form: a space, seven fraction digits.
                fh.write(f"{stamp[:10]} {stamp[11:27]},{p},{o}\n")
        else:
            fh.write("arrived_at,num_prefill_tokens,num_decode_tokens\n")
            for t, p, o in zip(times, prompts, outputs, strict=True):
                fh.write(f"{t:.6f},{p},{o}\n")


def measure(path: Path, how: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(path), how], capture_output=True, text=True, check=True
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(quick: bool) -> dict:
    rows = 100_000 if quick else 1_000_000
    figures: dict[str, float] = {"rows": rows}
    with tempfile.TemporaryDirectory() as tmp:
        for layout in ("azure", "vidur"):
            path = Path(tmp) / f"{layout}.csv"
            write_trace(path, rows, layout)
            traced, timed = measure(path, "traced"), measure(path, "timed")
            assert traced["rows"] == timed["rows"] == rows
            figures[f"{layout}_peak_bytes_per_row"] = round(traced["peak"] / rows, 1)
            figures[f"{layout}_peak_rss_mb"] = round(timed["rss_kb"] / 1024, 1)
            figures[f"{layout}_s_per_million_rows"] = round(timed["seconds"] * 1e6 / rows, 2)
    return {
        "name": "traces",
        "figures": figures,
        "baseline": f"the finished columns, {COLUMN_BYTES_PER_ROW} bytes per row",
        "ratio": round(figures["azure_peak_bytes_per_row"] / COLUMN_BYTES_PER_ROW, 2),
    }


if __name__ == "__main__":
    print(json.dumps(main("--quick" in sys.argv[1:])))
