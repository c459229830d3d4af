"""The planner's decision rules on hand-made summaries: best k, crossover, k-by-batch table."""

from __future__ import annotations

import pytest

from specsim.errors import SpecsimError
from specsim.planning.capacity import attainment_of, meets_slo
from specsim.planning.common import choose, parse_k_values, parse_loads
from specsim.planning.sweep import PointResult
from specsim.planning.window import LoadResult, crossover, k_by_batch, vllm_ranges


def summary(e2e: float, goodput: float = 1.0, batch: float = 4.0, served: float = 0.0) -> dict:
    return {
        "e2e_s": {"mean": e2e, "p50": e2e, "p90": e2e, "p99": e2e},
        "goodput_requests_per_s": goodput,
        "throughput_requests_per_s": max(served, goodput),
        "batch_size": {"mean": batch, "p50": batch},
    }


def test_without_slo_the_lowest_mean_latency_wins_and_ties_go_to_the_smaller_k():
    candidates = [(0, summary(2.0)), (1, summary(1.5)), (2, summary(1.2)), (3, summary(1.2))]
    assert choose(candidates, use_slo=False) == 2


def test_with_slo_goodput_wins_over_mean_latency():
    # k=3 is fastest on average but serves fewer requests within the SLO.
    candidates = [
        (0, summary(2.0, goodput=9.0)),
        (2, summary(1.6, goodput=10.0)),
        (3, summary(1.1, goodput=8.0)),
    ]
    assert choose(candidates, use_slo=True) == 2
    assert choose(candidates, use_slo=False) == 3


def test_goodputs_within_one_percent_are_a_tie_broken_by_latency():
    candidates = [(0, summary(2.0, goodput=10.0)), (4, summary(1.0, goodput=9.95))]
    assert choose(candidates, use_slo=True) == 4
    candidates = [(0, summary(2.0, goodput=10.0)), (4, summary(1.0, goodput=9.8))]
    assert choose(candidates, use_slo=True) == 0


def test_deep_in_overload_a_sliver_of_goodput_does_not_decide():
    # 16 req/s offered and served ~14; nobody meets the SLO: goodput differences of 0.005 req/s
    # are noise, so the lower latency (k = 0, which drains the backlog fastest) wins.
    candidates = [
        (0, summary(24.0, goodput=0.335, served=14.0)),
        (2, summary(34.0, goodput=0.339, served=13.2)),
    ]
    assert choose(candidates, use_slo=True) == 0


def test_failed_points_are_skipped_and_all_failed_gives_none():
    assert choose([(0, None), (1, summary(1.0))], use_slo=False) == 1
    assert choose([(0, None)], use_slo=False) is None


def _loads(best: list[int | None], batches: list[float] | None = None) -> list[LoadResult]:
    batches = batches or [2.0 * (i + 1) for i in range(len(best))]
    out = []
    for i, (k, batch) in enumerate(zip(best, batches, strict=True)):
        entry = LoadResult(float(i + 1), best_k=k)
        if k is not None:
            entry.by_config[f"k={k}"] = PointResult(None, "key", True, summary(1.0, batch=batch))
        out.append(entry)
    return out


@pytest.mark.parametrize(
    ("best", "start", "last_paying"),
    [
        ([4, 3, 2, 0, 0], 4.0, 3.0),
        ([4, 3, 2, 1, 1], None, 5.0),
        ([0, 0, 0], 1.0, None),
        # k = 0 wins once in the middle but speculation pays again above: no crossover there.
        ([3, 0, 2, 0, 0], 4.0, 3.0),
        ([3, 2, None, 0], 4.0, 2.0),
    ],
)
def test_crossover_is_the_load_from_which_k0_wins_for_good(best, start, last_paying):
    assert crossover(_loads(best)) == {"load": start, "last_paying": last_paying}


def test_k_by_batch_puts_boundaries_between_the_loads_and_covers_every_batch():
    rows = k_by_batch(_loads([4, 4, 2, 0], batches=[2.0, 6.0, 20.0, 60.0]), max_batch=128)
    assert rows == [
        {"max_batch": 13, "k": 4},  # halfway between batch 6 (k=4) and 20 (k=2)
        {"max_batch": 40, "k": 2},
        {"max_batch": 128, "k": 0},
    ]
    assert vllm_ranges(rows) == [[1, 13, 4], [14, 40, 2], [41, 128, 0]]


def test_k_by_batch_with_one_k_throughout_is_one_row():
    rows = k_by_batch(_loads([3, 3, 3]), max_batch=64)
    assert rows == [{"max_batch": 64, "k": 3}]
    assert vllm_ranges(rows) == [[1, 64, 3]]


def test_k_by_batch_rows_validate_as_a_scenario_table():
    from specsim.scenario import Speculation

    rows = k_by_batch(_loads([5, 3, 1, 0], batches=[1.5, 3.0, 9.0, 30.0]), max_batch=256)
    spec = Speculation.model_validate({"drafter": "d", "policy": "by_batch", "k_by_batch": rows})
    assert [r.k for r in spec.k_by_batch] == [5, 3, 1, 0]


def test_load_and_k_parsing():
    assert parse_loads(["1,2", "4", "2"]) == [1.0, 2.0, 4.0]
    assert parse_loads(None) is None
    assert parse_k_values("0..3,6") == [0, 1, 2, 3, 6]
    assert parse_k_values("2-4") == [2, 3, 4]
    for bad in ([""], [","]):
        with pytest.raises(SpecsimError, match="load list is empty"):
            parse_loads(bad)
    with pytest.raises(SpecsimError, match="must be positive"):
        parse_loads(["2", "-1"])
    with pytest.raises(SpecsimError, match="not a number"):
        parse_loads(["fast"])
    with pytest.raises(SpecsimError, match="cannot read"):
        parse_k_values("a..b")
    with pytest.raises(SpecsimError, match="empty k range"):
        parse_k_values("5..2")


def test_slo_attainment_prefers_the_summary_figure_and_falls_back_to_goodput():
    assert attainment_of({"slo_attainment": 0.97}) == 0.97
    assert (
        attainment_of({"goodput_requests_per_s": 9.0, "duration_s": 10.0, "requests": 100}) == 0.9
    )
    assert attainment_of(None) is None
    assert meets_slo({"slo_attainment": 0.99}, 0.99)
    assert not meets_slo({"slo_attainment": 0.9899}, 0.99)


def test_the_planner_never_imports_torch(repo):
    import subprocess
    import sys

    code = (
        "import sys\n"
        "import specsim.cli.plan, specsim.cli.report\n"
        "from specsim.planning import capacity, swap, swap_report, window, window_report\n"
        "from specsim.planning.sweep import simulate_point\n"
        "simulate_point('scenarios/poisson.yaml', ['workload.duration_s=2'])\n"
        "print('torch' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=repo, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"
