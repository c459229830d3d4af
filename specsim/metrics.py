"""Metrics: pure functions and mergeable accumulators over per-request records and engine steps.

Definitions follow vLLM so numbers compare with production dashboards:

- TTFT = first token - arrival; TPOT = (finish - first token) / (output tokens - 1), over requests
  with at least 2 output tokens; E2E = finish - arrival; queueing = first scheduled - arrival.
- ITL: the gaps between a request's successive token emissions. Every running sequence emits once
  per engine iteration, so the ITL distribution is the iteration durations weighted by the number
  of decoding sequences (with speculation one emission may carry several tokens).
- mean acceptance length = 1 + accepted / steps with drafts; draft acceptance rate = accepted /
  drafted (causal: only the accepted prefix counts); per-position acceptance i = share of steps
  with drafts whose first i drafts were all accepted (unconditional).

Percentiles come from a log-bucketed histogram with 0.1 % relative accuracy, so a run of millions
of requests keeps memory flat; means and counts are exact.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

RELATIVE_ACCURACY = 1e-3
_GAMMA = (1 + RELATIVE_ACCURACY) / (1 - RELATIVE_ACCURACY)
_LOG_GAMMA = math.log(_GAMMA)
_MIN_VALUE = 1e-9  # seconds; smaller values share the zero bucket
_MAX_INDEX = math.ceil(math.log(1e9 / _MIN_VALUE) / _LOG_GAMMA) + 1
QUANTILES = {"p50": 0.50, "p90": 0.90, "p99": 0.99}


class LogHistogram:
    """Mergeable histogram of non-negative values with bounded relative error."""

    def __init__(self):
        self.counts = np.zeros(_MAX_INDEX + 1, dtype=np.float64)  # [0] holds values < _MIN_VALUE
        self.count = 0.0
        self.total = 0.0
        self.max = 0.0

    def add(self, values: np.ndarray, weights: np.ndarray | None = None) -> None:
        values = np.asarray(values, dtype=np.float64)
        if values.size == 0:
            return
        idx = np.zeros(values.shape, dtype=np.int64)
        pos = values >= _MIN_VALUE
        idx[pos] = np.ceil(np.log(values[pos] / _MIN_VALUE) / _LOG_GAMMA).astype(np.int64) + 1
        np.clip(idx, 0, _MAX_INDEX, out=idx)
        w = np.ones_like(values) if weights is None else np.asarray(weights, dtype=np.float64)
        self.counts += np.bincount(idx, weights=w, minlength=_MAX_INDEX + 1)
        self.count += float(w.sum())
        self.total += float(np.dot(values, w))
        self.max = max(self.max, float(values.max()))

    def merge(self, other: LogHistogram) -> None:
        self.counts += other.counts
        self.count += other.count
        self.total += other.total
        self.max = max(self.max, other.max)

    def quantile(self, q: float) -> float:
        if self.count == 0:
            return 0.0
        cumulative = np.cumsum(self.counts)
        i = int(np.searchsorted(cumulative, q * self.count, side="left"))
        i = min(i, _MAX_INDEX)
        if i == 0:
            return 0.0
        # Bucket i holds (MIN * gamma^(i-2), MIN * gamma^(i-1)]; report its centre.
        upper = _MIN_VALUE * _GAMMA ** (i - 1)
        return min(2.0 * upper / (_GAMMA + 1.0), self.max)

    def summary(self) -> dict[str, float]:
        mean = self.total / self.count if self.count else 0.0
        return {"mean": mean, **{name: self.quantile(q) for name, q in QUANTILES.items()}}


def exact_summary(values: np.ndarray) -> dict[str, float]:
    """{mean, p50, p90, p99} of an in-memory array (numpy's linear interpolation)."""
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0:
        return {"mean": 0.0, "p50": 0.0, "p90": 0.0, "p99": 0.0}
    p = np.percentile(values, [50, 90, 99])
    return {"mean": float(values.mean()), "p50": p[0], "p90": p[1], "p99": p[2]}


# One finished request's record, in requests.csv's column order: what the simulator and the
# real engine both write and the functions below read (``pool`` the only text column).
RECORD_COLUMNS = (
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


def _latency_columns(records: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Every request's latencies (TPOT 0 for 1-token outputs) and the mask of those with >= 2."""
    arrival = records["arrival_s"]
    first = records["first_token_s"]
    output = records["output_tokens"]
    multi = output >= 2
    decode_s = records["finish_s"] - first
    values = {
        "ttft_s": first - arrival,
        "tpot_s": np.where(multi, decode_s / np.maximum(output - 1, 1), 0.0),
        "e2e_s": records["finish_s"] - arrival,
        "queueing_s": records["scheduled_s"] - arrival,
    }
    return values, multi


def request_latencies(records: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Per-request latency columns from record columns (pure); TPOT over >= 2-token outputs."""
    values, multi = _latency_columns(records)
    values["tpot_s"] = values["tpot_s"][multi]
    return values


def meets_slo(records: dict[str, np.ndarray], limits: dict[str, float]) -> np.ndarray:
    """Boolean per request: every given limit holds (TPOT of 1-token outputs counts as 0)."""
    values, _ = _latency_columns(records)
    ok = np.ones(records["arrival_s"].shape, dtype=bool)
    for name, limit in limits.items():
        ok &= values[name] <= limit
    return ok


class RequestStats:
    """Streaming accumulator of per-request records (one per pool, merged for the fleet)."""

    LATENCIES = ("ttft_s", "tpot_s", "e2e_s", "queueing_s")

    def __init__(self, slo_limits: dict[str, float] | None = None):
        self.slo_limits = slo_limits or {}
        self.hist = {name: LogHistogram() for name in self.LATENCIES}
        self.requests = 0
        self.slo_met = 0
        self.prompt_tokens = 0
        self.output_tokens = 0
        self.steps = 0
        self.drafted = 0
        self.accepted = 0
        self.preemptions = 0
        self.last_finish_s = 0.0

    def add(self, records: dict[str, np.ndarray]) -> None:
        n = int(records["arrival_s"].shape[0])
        if n == 0:
            return
        for name, values in request_latencies(records).items():
            self.hist[name].add(values)
        self.requests += n
        self.slo_met += int(meets_slo(records, self.slo_limits).sum())
        for name in ("prompt_tokens", "output_tokens", "steps", "drafted", "accepted"):
            setattr(self, name, getattr(self, name) + int(records[name].sum()))
        self.preemptions += int(records["preemptions"].sum())
        self.last_finish_s = max(self.last_finish_s, float(records["finish_s"].max()))

    def merge(self, other: RequestStats) -> None:
        for name in self.LATENCIES:
            self.hist[name].merge(other.hist[name])
        for name in (
            "requests",
            "slo_met",
            "prompt_tokens",
            "output_tokens",
            "steps",
            "drafted",
            "accepted",
            "preemptions",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.last_finish_s = max(self.last_finish_s, other.last_finish_s)


class EngineStats:
    """Per-replica step statistics: ITL, batch sizes, KV use, acceptance counts, FLOPs."""

    def __init__(self, k_max: int, kv_capacity: int, max_batch: int):
        self.k_max = k_max
        self.kv_capacity = kv_capacity
        self.itl = LogHistogram()
        self.batch_counts = np.zeros(max_batch + 1, dtype=np.int64)
        self.accepted_counts = np.zeros(k_max + 1, dtype=np.int64)  # steps with drafts, by accepted
        self.drafted_counts = np.zeros(k_max + 1, dtype=np.int64)  # steps, by drafts in the step
        self.iterations = 0
        self.busy_s = 0.0
        self.kv_token_seconds = 0.0
        self.kv_max_fraction = 0.0
        self.window_rows = 0.0  # sum over iterations of k x decoding rows
        self.decode_rows = 0.0
        self.flops = {"prefill": 0.0, "verification": 0.0, "drafter": 0.0, "wasted": 0.0}

    def add_iterations(
        self,
        dt: np.ndarray,
        batch: np.ndarray,
        kv_tokens: np.ndarray,
    ) -> None:
        """Per-iteration durations, running batch sizes and KV tokens in use."""
        self.iterations += int(dt.shape[0])
        self.busy_s += float(dt.sum())
        self.batch_counts += np.bincount(batch, minlength=self.batch_counts.shape[0])
        self.kv_token_seconds += float(np.dot(dt, kv_tokens))
        if kv_tokens.size:
            peak = float(kv_tokens.max()) / self.kv_capacity
            self.kv_max_fraction = max(self.kv_max_fraction, peak)

    def add_steps(self, accepted: np.ndarray, drafted: np.ndarray) -> None:
        """Per-row accepted and drafted counts of decode steps (-1 marks empty slots)."""
        k1 = self.k_max + 1
        proposing = drafted > 0
        self.accepted_counts += np.bincount(accepted[proposing], minlength=k1)[:k1]
        self.drafted_counts += np.bincount(drafted[drafted >= 0], minlength=k1)[:k1]

    def merge(self, other: EngineStats) -> None:
        self.itl.merge(other.itl)
        size = max(self.batch_counts.shape[0], other.batch_counts.shape[0])
        self.batch_counts = _padded_sum(self.batch_counts, other.batch_counts, size)
        size = max(self.accepted_counts.shape[0], other.accepted_counts.shape[0])
        self.accepted_counts = _padded_sum(self.accepted_counts, other.accepted_counts, size)
        self.drafted_counts = _padded_sum(self.drafted_counts, other.drafted_counts, size)
        self.k_max = size - 1
        self.iterations += other.iterations
        self.busy_s += other.busy_s
        self.kv_token_seconds += other.kv_token_seconds
        self.kv_max_fraction = max(self.kv_max_fraction, other.kv_max_fraction)
        self.kv_capacity += other.kv_capacity
        self.window_rows += other.window_rows
        self.decode_rows += other.decode_rows
        for key in self.flops:
            self.flops[key] += other.flops[key]


def _padded_sum(a: np.ndarray, b: np.ndarray, size: int) -> np.ndarray:
    out = np.zeros(size, dtype=a.dtype)
    out[: a.shape[0]] += a
    out[: b.shape[0]] += b
    return out


def acceptance_metrics(accepted_counts: np.ndarray, drafted_counts: np.ndarray) -> dict[str, Any]:
    """vLLM's acceptance metrics from step counts by accepted and by drafted tokens (pure)."""
    steps_with_drafts = int(drafted_counts[1:].sum())
    accepted = int(np.dot(np.arange(accepted_counts.shape[0]), accepted_counts))
    drafted = int(np.dot(np.arange(drafted_counts.shape[0]), drafted_counts))
    if steps_with_drafts == 0:
        return {
            "mean_acceptance_length": 1.0,
            "draft_acceptance_rate": 0.0,
            "per_position_acceptance": [],
        }
    at_least = np.cumsum(accepted_counts[::-1])[::-1]  # at_least[i] = steps with >= i accepted
    return {
        "mean_acceptance_length": 1.0 + accepted / steps_with_drafts,
        "draft_acceptance_rate": accepted / drafted if drafted else 0.0,
        "per_position_acceptance": (at_least[1:] / steps_with_drafts).tolist(),
    }


def batch_summary(batch_counts: np.ndarray) -> dict[str, float]:
    """{mean, p50, p90, p99, max} of running batch sizes over engine iterations."""
    total = int(batch_counts.sum())
    if total == 0:
        return {"mean": 0.0, "p50": 0, "p90": 0, "p99": 0, "max": 0}
    sizes = np.arange(batch_counts.shape[0])
    cumulative = np.cumsum(batch_counts)
    out: dict[str, float] = {"mean": float(np.dot(sizes, batch_counts)) / total}
    for name, q in QUANTILES.items():
        out[name] = int(np.searchsorted(cumulative, q * total, side="left"))
    out["max"] = int(sizes[batch_counts > 0].max())
    return out


def summarise(
    requests: RequestStats,
    engine: EngineStats,
    *,
    replicas: int,
    price_per_hour_usd: float,
    duration_s: float | None = None,
) -> dict[str, Any]:
    """The summary.json metrics for one pool or the fleet (pure over the accumulators)."""
    duration = requests.last_finish_s if duration_s is None else duration_s
    per_s = (lambda x: x / duration) if duration > 0 else (lambda x: 0.0)
    cost = replicas * price_per_hour_usd * duration / 3600.0
    tokens = requests.output_tokens
    flops = engine.flops
    total_flops = flops["prefill"] + flops["verification"] + flops["drafter"]
    capacity_s = engine.kv_capacity * duration
    summary: dict[str, Any] = {
        "requests": requests.requests,
        "duration_s": duration,
        "throughput_tokens_per_s": per_s(tokens),
        "throughput_requests_per_s": per_s(requests.requests),
        "prompt_tokens": requests.prompt_tokens,
        "output_tokens": tokens,
    }
    for name in RequestStats.LATENCIES:
        summary[name] = requests.hist[name].summary()
    summary["itl_s"] = engine.itl.summary()
    summary.update(acceptance_metrics(engine.accepted_counts, engine.drafted_counts))
    summary["mean_window"] = engine.window_rows / engine.decode_rows if engine.decode_rows else 0.0
    summary.update(
        {
            "flops_total": total_flops,
            "flops_prefill": flops["prefill"],
            "flops_verification": flops["verification"],
            "flops_drafter": flops["drafter"],
            "flops_wasted": flops["wasted"],
            "flops_wasted_fraction": flops["wasted"] / total_flops if total_flops else 0.0,
            "cost_usd_per_million_tokens": cost / tokens * 1e6 if tokens else 0.0,
            "goodput_requests_per_s": per_s(requests.slo_met),
            "slo_attainment": requests.slo_met / requests.requests if requests.requests else 0.0,
            "kv_cache_utilisation": {
                "mean": engine.kv_token_seconds / capacity_s if capacity_s else 0.0,
                "max": engine.kv_max_fraction,
            },
            "batch_size": batch_summary(engine.batch_counts),
            "preemptions": requests.preemptions,
            "engine_iterations": engine.iterations,
            "busy_fraction": engine.busy_s / (replicas * duration) if duration else 0.0,
        }
    )
    return summary


def round_floats(value: Any, digits: int = 6) -> Any:
    """Round floats to ``digits`` significant digits, recursively, for stable JSON."""
    if isinstance(value, float | np.floating):
        value = float(value)
        if value == 0 or not math.isfinite(value):
            return value
        return float(f"{value:.{digits}g}")
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, dict):
        return {k: round_floats(v, digits) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [round_floats(v, digits) for v in value]
    return value
