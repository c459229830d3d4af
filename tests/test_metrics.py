"""Metric definitions (vLLM's) and the streaming histogram's accuracy."""

from __future__ import annotations

import numpy as np
import pytest

from specsim.metrics import (
    RELATIVE_ACCURACY,
    LogHistogram,
    RequestStats,
    acceptance_metrics,
    batch_summary,
    exact_summary,
    meets_slo,
    request_latencies,
    round_floats,
)


def records(**columns):
    n = len(columns["arrival_s"])
    base = {
        "scheduled_s": columns["arrival_s"],
        "prompt_tokens": np.full(n, 10),
        "steps": np.ones(n),
        "drafted": np.zeros(n),
        "accepted": np.zeros(n),
        "preemptions": np.zeros(n),
    }
    base.update(columns)
    return {k: np.asarray(v, dtype=np.float64) for k, v in base.items()}


def test_latency_definitions():
    rec = records(
        arrival_s=[0.0, 1.0],
        scheduled_s=[0.5, 1.0],
        first_token_s=[1.0, 1.2],
        finish_s=[2.0, 1.2],
        output_tokens=[11, 1],
    )
    lat = request_latencies(rec)
    assert lat["ttft_s"].tolist() == pytest.approx([1.0, 0.2])
    assert lat["e2e_s"].tolist() == pytest.approx([2.0, 0.2])
    assert lat["queueing_s"].tolist() == pytest.approx([0.5, 0.0])
    # TPOT only for outputs of 2+ tokens: (2.0 - 1.0) / 10.
    assert lat["tpot_s"].tolist() == pytest.approx([0.1])
    assert meets_slo(rec, {"ttft_s": 0.5}).tolist() == [False, True]
    assert meets_slo(rec, {"tpot_s": 0.05}).tolist() == [False, True]
    assert meets_slo(rec, {}).tolist() == [True, True]


def test_acceptance_metrics_follow_vllm():
    # Steps with 3 drafts: accepted 0, 1, 3, 3 (4 steps) and one step with 0 drafts (no proposal).
    accepted_counts = np.array([1, 1, 0, 2])  # by accepted count, over steps with drafts
    drafted_counts = np.array([1, 0, 0, 4])  # by drafts in the step, over all steps
    m = acceptance_metrics(accepted_counts, drafted_counts)
    assert m["mean_acceptance_length"] == pytest.approx(1 + 7 / 4)
    assert m["draft_acceptance_rate"] == pytest.approx(7 / 12)
    # Unconditional per position: >= 1 accepted in 3 of 4 steps, >= 2 in 2, >= 3 in 2.
    assert m["per_position_acceptance"] == pytest.approx([0.75, 0.5, 0.5])
    off = acceptance_metrics(np.zeros(1, dtype=int), np.array([9]))
    assert off["mean_acceptance_length"] == 1.0 and off["per_position_acceptance"] == []


def test_histogram_quantiles_within_stated_accuracy():
    rng = np.random.default_rng(0)
    values = rng.lognormal(-3, 1.5, size=50_000)
    hist = LogHistogram()
    for chunk in np.array_split(values, 7):
        hist.add(chunk)
    exact = exact_summary(values)
    approx = hist.summary()
    assert approx["mean"] == pytest.approx(exact["mean"], rel=1e-12)
    for q in ("p50", "p90", "p99"):
        # Bucket error plus at most one rank step between neighbouring order statistics.
        assert approx[q] == pytest.approx(exact[q], rel=2 * RELATIVE_ACCURACY + 1e-3)


def test_histogram_merge_equals_one_pass_and_weights_count():
    a, b, both = LogHistogram(), LogHistogram(), LogHistogram()
    x, y = np.linspace(0.001, 1, 100), np.linspace(0.5, 5, 50)
    a.add(x)
    b.add(y)
    both.add(np.concatenate([x, y]))
    a.merge(b)
    assert a.summary() == both.summary()
    weighted = LogHistogram()
    weighted.add(np.array([1.0, 10.0]), np.array([99.0, 1.0]))
    assert weighted.quantile(0.5) == pytest.approx(1.0, rel=RELATIVE_ACCURACY)
    assert weighted.summary()["mean"] == pytest.approx(1.09)
    assert LogHistogram().summary() == {"mean": 0.0, "p50": 0.0, "p90": 0.0, "p99": 0.0}


def test_request_stats_stream_and_merge():
    rec = records(
        arrival_s=[0.0, 1.0, 2.0],
        first_token_s=[0.1, 1.1, 2.5],
        finish_s=[1.0, 2.0, 4.0],
        output_tokens=[10, 10, 4],
    )
    one = RequestStats({"e2e_s": 1.5})
    one.add(rec)
    halves = RequestStats({"e2e_s": 1.5})
    other = RequestStats({"e2e_s": 1.5})
    halves.add({k: v[:1] for k, v in rec.items()})
    other.add({k: v[1:] for k, v in rec.items()})
    halves.merge(other)
    for stats in (one, halves):
        assert stats.requests == 3 and stats.slo_met == 2 and stats.output_tokens == 24
        assert stats.last_finish_s == 4.0


def test_batch_summary_and_rounding():
    counts = np.zeros(9, dtype=int)
    counts[[1, 4, 8]] = [2, 1, 1]  # sizes 1, 1, 4, 8
    s = batch_summary(counts)
    assert s["mean"] == pytest.approx(3.5) and s["p50"] == 1 and s["max"] == 8 and s["p99"] == 8
    assert round_floats({"a": [1.23456789, np.float64(2e-9)], "b": np.int64(3)}) == {
        "a": [1.23457, 2e-9],
        "b": 3,
    }


def test_summary_recomputes_from_the_records_file(tmp_path):
    """Metrics are pure functions of the records: folding requests.csv back in reproduces the
    run's latency summary (to the CSV's microsecond rounding)."""
    from pathlib import Path

    from specsim.scenario import Scenario
    from specsim.simulation import run_simulation
    from specsim.simulation.records import NUMERIC, read_records

    data = Path(__file__).parent / "data"
    scenario = Scenario.model_validate(
        {
            "seed": 2,
            "profile": "sim_profile.yaml",
            "workload": {
                "kind": "poisson",
                "rate": 30.0,
                "requests": 400,
                "prompt": {"dist": "uniform", "low": 50, "high": 500},
                "output": {"dist": "uniform", "low": 5, "high": 100},
            },
            "speculation": {"drafter": "c05", "k": 3},
            "slo": {"ttft_s": 0.012},
        }
    ).with_source(data / "scenario.yaml")
    summary = run_simulation(scenario, records_path=tmp_path / "r.csv").summary
    rec = read_records(tmp_path / "r.csv")
    stats = RequestStats({"ttft_s": 0.012})
    stats.add({name: rec[name].astype(np.float64) for name in NUMERIC})
    assert stats.requests == summary["requests"] and stats.output_tokens == summary["output_tokens"]
    for key in RequestStats.LATENCIES:
        for stat, value in stats.hist[key].summary().items():
            assert value == pytest.approx(summary[key][stat], rel=3e-3, abs=2e-6), (key, stat)
    assert 0 < stats.slo_met < stats.requests
    assert stats.slo_met / summary["duration_s"] == pytest.approx(
        summary["goodput_requests_per_s"], rel=1e-3
    )
