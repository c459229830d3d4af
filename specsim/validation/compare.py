"""Predicted against measured: the metrics ``specsim validate`` compares, and their thresholds.

Relative error = (predicted - measured) / measured, so +10 % means the simulator predicts 10 %
more than the engine measured. Thresholds (the project's targets for a measured profile):
mean E2E latency and throughput within 5 %, p90 TTFT, TPOT and E2E within 10 %, mean acceptance
length within 3 %. The other figures (mean, p50, p99 of each latency) are reported without a
threshold: p99 of a few hundred requests is one or two requests, and p50 TTFT at light load is
a single prefill pass, too short for a shared machine's timer noise to be judged against 10 %.

A finite workload is one draw of its randomness: which drafts are accepted decides which
requests finish in the same step, and a p90 over ~100 requests can hinge on two or three of
them. ``compare`` takes the simulator's summaries of the same requests served again with other
acceptance and jitter draws (``replicas``). The prediction is then each metric's median over
every draw, and the report gives its p10..p90 over them and how many of them lie below the
measured value, so a miss can be told apart from the workload's own sampling noise. The
engine's run is one draw as well, and a seeded one: every run of the same scenario repeats it,
so a miss that recurs run after run can still be that draw's luck. The verdict stays the
thresholds'.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

THRESHOLDS: dict[str, float] = {
    "e2e_s.mean": 0.05,
    "throughput_tokens_per_s": 0.05,
    "ttft_s.p90": 0.10,
    "tpot_s.p90": 0.10,
    "e2e_s.p90": 0.10,
    "mean_acceptance_length": 0.03,
}
LATENCIES = ("ttft_s", "tpot_s", "e2e_s")
TAIL = "p90"  # the percentile the latency thresholds are set on
STATS = ("mean", "p50", "p90", "p99")


@dataclass(frozen=True)
class Row:
    metric: str
    predicted: float
    measured: float
    relative_error: float | None  # None when the measured value is 0
    threshold: float | None
    ok: bool | None  # None: reported only
    band: tuple[float, float] | None = None  # the simulator's p10..p90 over its replicas
    # How many of the simulator's draws (the first and its replicas) lie below the measured
    # value, out of how many: where the engine's one draw falls among them.
    draws_below: int | None = None
    draws: int | None = None
    first_draw: float | None = None  # the first draw alone (the simulation's summary.json)

    @property
    def in_band(self) -> bool | None:
        if self.band is None:
            return None
        return self.band[0] <= self.measured <= self.band[1]


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


def compare_prediction(
    predicted: dict[str, Any],
    measured: dict[str, Any],
    replicas: Sequence[dict[str, Any]] = (),
) -> Comparison:
    """Compare two summary.json mappings (simulator, engine) metric by metric; with
    ``replicas`` (more simulator summaries of the same requests), the prediction is each
    metric's median over all the simulator's draws, and each metric gets its band."""
    names = metric_names()
    draws = [{m: lookup(s, m) for m in names} for s in (predicted, *replicas)]
    return compare_figures(names, draws, {m: lookup(measured, m) for m in names})


def tail_thresholds(metrics: Sequence[str]) -> dict[str, float]:
    """``THRESHOLDS`` for the figures ``metrics``: a latency without a p90 (published runs
    carry p95 and p99) has its p90 threshold on the lowest percentile above p90 it has."""
    out = dict(THRESHOLDS)
    for name in LATENCIES:
        if f"{name}.{TAIL}" in metrics:
            continue
        above = sorted(
            (float(m.split(".", 1)[1][1:]), m)
            for m in metrics
            if m.startswith(f"{name}.p") and float(m.split(".", 1)[1][1:]) > float(TAIL[1:])
        )
        if above:
            out[above[0][1]] = out.pop(f"{name}.{TAIL}")
    return out


def compare_figures(
    metrics: Sequence[str],
    draws: Sequence[Mapping[str, float]],
    measured: Mapping[str, float],
    thresholds: Mapping[str, float] = THRESHOLDS,
) -> Comparison:
    """Compare figures by name: ``draws`` are the simulator's runs of the same requests (the
    first is its seeded run), ``measured`` the engine's. With more than one draw the prediction
    is each metric's median over them, and each metric gets its band."""
    rows = []
    for metric in metrics:
        first, m = draws[0][metric], measured[metric]
        values = np.array([draw[metric] for draw in draws])
        # The prediction is the median over the simulator's draws: any one draw adds its own
        # acceptance and jitter luck to the error.
        p = float(np.median(values))
        error = (p - m) / m if m != 0 else None
        threshold = thresholds.get(metric)
        if threshold is None:
            ok = None
        elif error is None:
            ok = p == 0
        else:
            ok = abs(error) <= threshold
        band, below, count = None, None, None
        if len(draws) > 1:
            low, high = np.quantile(values, [0.1, 0.9])
            band = (float(low), float(high))
            below, count = int((values < m).sum()), len(values)
        rows.append(Row(metric, p, m, error, threshold, ok, band, below, count, first))
    return Comparison(rows)


def comparison_table(comparison: Comparison) -> str:
    """A fixed-width text table for the terminal and comparison.md."""
    banded = any(r.band is not None for r in comparison.rows)
    band_head = f"{'sim p10..p90':>22}" if banded else ""
    lines = [f"{'metric':<26}{'predicted':>12}{'measured':>12}{'error':>9}{band_head}  threshold"]
    for r in comparison.rows:
        error = "n/a" if r.relative_error is None else f"{r.relative_error:+.1%}"
        if r.threshold is None:
            verdict = ""
        else:
            verdict = f"±{r.threshold:.0%} " + ("ok" if r.ok else "EXCEEDED")
        band = ""
        if r.band is not None:
            band = f"{f'{r.band[0]:.5g}..{r.band[1]:.5g}':>22}"
        lines.append(
            f"{r.metric:<26}{r.predicted:>12.5g}{r.measured:>12.5g}{error:>9}{band}  {verdict}"
        )
    return "\n".join(lines)


def explain_failures(comparison: Comparison) -> list[str]:
    """One line per metric beyond its threshold: where the measured value falls among the
    simulator's draws of the same requests. The engine's run is one draw too: it lands outside
    the p10..p90 band one time in five and beyond every one of n simulator draws about one time
    in (n + 1) / 2 by chance alone, so only the latter points at the model or the machine."""
    lines = []
    for r in comparison.failures:
        if r.band is None or r.draws is None or r.draws_below is None:
            continue  # no replicas: nothing to place the measured value among
        where = "inside" if r.in_band else "outside"
        if 0 < r.draws_below < r.draws:
            meaning = (
                f"above {r.draws_below} of the {r.draws} draws: "
                "a miss this workload's own randomness can produce"
            )
        else:
            side = "above" if r.draws_below else "below"
            meaning = (
                f"{side} all {r.draws} draws: a modelling error or the machine's "
                f"(chance alone puts a draw there 1 time in {(r.draws + 1) / 2:.3g})"
            )
        lines.append(
            f"{r.metric}: measured {r.measured:.5g} lies {where} the simulator's p10..p90 over "
            f"{r.draws} replications of the same requests ({r.band[0]:.5g}..{r.band[1]:.5g}), "
            f"{meaning}"
        )
    return lines
