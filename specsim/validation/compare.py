"""Predicted against measured: the metrics ``specsim validate`` compares, and their thresholds.

Relative error = (predicted - measured) / measured, so +10 % means the simulator predicts 10 %
more than the engine measured. Thresholds (the project's targets for a measured profile):
mean E2E latency and throughput within 5 %, p90 TTFT, TPOT and E2E within 10 %, mean acceptance
length within 3 %. The other figures (mean, p50, p99 of each latency) are reported without a
threshold: p99 of a few hundred requests is one or two requests, and p50 TTFT at light load is
a single prefill pass, too short for a shared machine's timer noise to be judged against 10 %.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

THRESHOLDS: dict[str, float] = {
    "e2e_s.mean": 0.05,
    "throughput_tokens_per_s": 0.05,
    "ttft_s.p90": 0.10,
    "tpot_s.p90": 0.10,
    "e2e_s.p90": 0.10,
    "mean_acceptance_length": 0.03,
}
LATENCIES = ("ttft_s", "tpot_s", "e2e_s")
STATS = ("mean", "p50", "p90", "p99")


@dataclass(frozen=True)
class Row:
    metric: str
    predicted: float
    measured: float
    relative_error: float | None  # None when the measured value is 0
    threshold: float | None
    ok: bool | None  # None: reported only


@dataclass(frozen=True)
class Comparison:
    rows: list[Row]

    @property
    def passed(self) -> bool:
        return all(row.ok is not False for row in self.rows)

    @property
    def failures(self) -> list[Row]:
        return [row for row in self.rows if row.ok is False]

    def to_dict(self) -> dict[str, Any]:
        return {"passed": self.passed, "rows": [asdict(r) for r in self.rows]}


def metric_names() -> list[str]:
    names = [f"{lat}.{stat}" for lat in LATENCIES for stat in STATS]
    return [*names, "throughput_tokens_per_s", "mean_acceptance_length"]


def lookup(summary: dict[str, Any], metric: str) -> float:
    value: Any = summary
    for part in metric.split("."):
        value = value[part]
    return float(value)


def compare(predicted: dict[str, Any], measured: dict[str, Any]) -> Comparison:
    """Compare two summary.json mappings (simulator, engine) metric by metric."""
    rows = []
    for metric in metric_names():
        p, m = lookup(predicted, metric), lookup(measured, metric)
        error = (p - m) / m if m != 0 else None
        threshold = THRESHOLDS.get(metric)
        if threshold is None:
            ok = None
        elif error is None:
            ok = p == 0
        else:
            ok = abs(error) <= threshold
        rows.append(Row(metric, p, m, error, threshold, ok))
    return Comparison(rows)


def table(comparison: Comparison) -> str:
    """A fixed-width text table for the terminal and comparison.md."""
    lines = [f"{'metric':<26}{'predicted':>12}{'measured':>12}{'error':>9}  threshold"]
    for r in comparison.rows:
        error = "n/a" if r.relative_error is None else f"{r.relative_error:+.1%}"
        if r.threshold is None:
            verdict = ""
        else:
            verdict = f"±{r.threshold:.0%} " + ("ok" if r.ok else "EXCEEDED")
        lines.append(f"{r.metric:<26}{r.predicted:>12.5g}{r.measured:>12.5g}{error:>9}  {verdict}")
    return "\n".join(lines)
