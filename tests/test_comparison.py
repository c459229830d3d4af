"""A summary against a baseline's: every compared metric, and which got worse by how much."""

from __future__ import annotations

import pytest

from specsim.comparison import (
    UNCHANGED,
    across_loads,
    across_loads_text,
    compare,
    regressions,
    regressions_text,
)


def _summary(ttft=0.1, tpot=0.01, e2e=1.0, throughput=1000.0, goodput=5.0, cost=0.5, slo=True):
    def stats(v):
        return {"mean": v, "p50": v, "p90": v, "p99": v}

    return {
        "ttft_s": stats(ttft),
        "tpot_s": stats(tpot),
        "e2e_s": stats(e2e),
        "throughput_tokens_per_s": throughput,
        "goodput_requests_per_s": goodput,
        "cost_usd_per_million_tokens": cost,
        "slo": {"ttft_s": 1.0} if slo else None,
    }


def test_every_metric_is_compared_and_the_bad_direction_counts_as_worse():
    base = _summary()
    run = _summary(ttft=0.13, tpot=0.005, throughput=900.0, goodput=5.0, cost=0.5)
    changes = {c.metric: c for c in compare(run, base)}
    assert len(changes) == 15 and "ttft_s.p99" in changes and "goodput_requests_per_s" in changes
    assert changes["ttft_s.p99"].worse_by == pytest.approx(0.3)
    assert (
        changes["tpot_s.mean"].worse_by == pytest.approx(-0.5) and not changes["tpot_s.mean"].worse
    )
    # Throughput is better higher: 10 % lower is 10 % worse.
    assert changes["throughput_tokens_per_s"].worse_by == pytest.approx(0.1)
    worse = regressions(changes.values())
    assert [c.metric for c in worse][:4] == [
        "ttft_s.mean",
        "ttft_s.p50",
        "ttft_s.p90",
        "ttft_s.p99",
    ]
    assert {c.metric for c in worse} == {f"ttft_s.{s}" for s in ("mean", "p50", "p90", "p99")} | {
        "throughput_tokens_per_s"
    }
    text = regressions_text(changes.values())
    assert "TTFT p99 30% higher" in text and "throughput 10% lower" in text


def test_small_moves_are_unchanged_and_goodput_needs_an_slo():
    base = _summary(slo=False)
    run = _summary(ttft=0.1 * (1 + UNCHANGED / 2), slo=False)
    changes = compare(run, base)
    assert "goodput_requests_per_s" not in {c.metric for c in changes}
    assert regressions(changes) == []
    assert regressions_text(changes) == "none of the 14 compared metrics is worse"


def test_across_loads_gives_the_range_where_a_metric_is_worse():
    base = _summary()
    pairs = [
        (2.0, _summary(ttft=0.122), base),
        (6.0, _summary(ttft=0.130), base),
        (10.0, _summary(ttft=0.1), base),
        (14.0, None, base),  # a failed simulation is not a comparison
    ]
    entries = {e["metric"]: e for e in across_loads(pairs)}
    assert set(entries) == {f"ttft_s.{s}" for s in ("mean", "p50", "p90", "p99")}
    p99 = entries["ttft_s.p99"]
    assert (p99["loads_worse"], p99["loads_compared"]) == (2, 3)
    assert [x["load"] for x in p99["by_load"]] == [2.0, 6.0]
    assert p99["worse_by"]["min"] == pytest.approx(0.22) and p99["worse_by"][
        "max"
    ] == pytest.approx(0.30)
    assert "TTFT p99 22–30% higher (at 2 of 3 loads)" in across_loads_text([p99])
