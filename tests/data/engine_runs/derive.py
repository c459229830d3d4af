"""Turn the `vllm bench serve` result blocks of a published page into specsim's normalised CSV.

Usage: python tests/data/engine_runs/derive.py PAGE.md ENGINE VERSION MODEL LINE:LABEL ...
PAGE.md is the page's text (e.g. `git show COMMIT:docs/performance-lab/qwen3-8b/h100-latency.md`);
each LINE is the line of a block's "Serving Benchmark Result" header, so that the table names
exactly which published block each row is. The CSV goes to stdout.
"""

import csv
import re
import sys

# printed name -> (column, scale to seconds); only what the client measured, nothing derived
FIGURES = {
    "Mean TTFT (ms)": ("ttft_s.mean", 1e-3),
    "Median TTFT (ms)": ("ttft_s.p50", 1e-3),
    "P99 TTFT (ms)": ("ttft_s.p99", 1e-3),
    "Mean TPOT (ms)": ("tpot_s.mean", 1e-3),
    "Median TPOT (ms)": ("tpot_s.p50", 1e-3),
    "P99 TPOT (ms)": ("tpot_s.p99", 1e-3),
    "Mean ITL (ms)": ("itl_s.mean", 1e-3),
    "Median ITL (ms)": ("itl_s.p50", 1e-3),
    "P99 ITL (ms)": ("itl_s.p99", 1e-3),
    "Mean E2EL (ms)": ("e2e_s.mean", 1e-3),
    "Median E2EL (ms)": ("e2e_s.p50", 1e-3),
    "P99 E2EL (ms)": ("e2e_s.p99", 1e-3),
    "Output token throughput (tok/s)": ("throughput_tokens_per_s", 1.0),
}
HEADER = ["label", "model", "engine", "engine_version", "request_rate", "max_concurrency"]
HEADER += ["completed", "duration_s", "input_mean", "output_mean"]
HEADER += [column for column, _ in FIGURES.values()]


def block(lines: list[str], start: int) -> dict[str, str]:
    """The `name: value` lines of the block whose header is line START (1-based)."""
    if "Serving Benchmark Result" not in lines[start - 1]:
        sys.exit(f"line {start} is not a 'Serving Benchmark Result' header")
    values = {}
    for line in lines[start:]:
        if line.strip().startswith("====="):
            return values
        match = re.match(r"\s*(.+?):\s+([-\d.]+|inf)\s*$", line)
        if match:
            values[match.group(1)] = match.group(2)
    sys.exit(f"the block at line {start} has no closing rule")


def row(values: dict[str, str], label: str, engine: str, version: str, model: str) -> dict:
    completed = int(values["Successful requests"])
    concurrency = values.get("Maximum request concurrency", "")
    out = {"label": label, "model": model, "engine": engine, "engine_version": version}
    # vllm bench serve sends everything at once (rate inf) unless a rate is configured
    out["request_rate"] = values.get("Request rate configured (RPS)", "inf")
    out["max_concurrency"] = concurrency
    out["completed"] = completed
    out["duration_s"] = values["Benchmark duration (s)"]
    out["input_mean"] = round(int(values["Total input tokens"]) / completed, 3)
    out["output_mean"] = round(int(values["Total generated tokens"]) / completed, 3)
    for printed, (column, scale) in FIGURES.items():
        if printed in values:
            out[column] = f"{float(values[printed]) * scale:.6g}"
    return out


def main(argv: list[str]) -> None:
    page, engine, version, model, *picks = argv
    with open(page, encoding="utf-8") as f:
        lines = f.read().splitlines()
    rows = []
    for pick in picks:
        line, label = pick.split(":", 1)
        rows.append(row(block(lines, int(line)), label, engine, version, model))
    used = [c for c in HEADER if any(r.get(c) not in (None, "") for r in rows) or c == "label"]
    writer = csv.DictWriter(sys.stdout, used, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)


if __name__ == "__main__":
    main(sys.argv[1:])
