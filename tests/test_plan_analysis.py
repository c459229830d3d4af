"""The planner's decision rules on hand-made summaries: best k, crossover, k-by-batch table
and its verdict."""

from __future__ import annotations

import pytest

from specsim.errors import SpecsimError
from specsim.planning.capacity.capacity import attainment_of, attains_slo
from specsim.planning.common import choose, parse_counts, parse_k_values, parse_loads
from specsim.planning.sweep.sweeper import PointResult
from specsim.planning.window.window import LoadResult, crossover, k_by_batch
from specsim.planning.window.window_table import (
    E2E_TIE,
    NOT_RECOMMENDED,
    RECOMMENDED,
    LoadCheck,
    judge,
    table_verdict,
    vllm_ranges,
)
from specsim.planning.window.window_table_report import verdict_text


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


def _plan(tmp_path, repo, ks=(0, 1, 2, 3, 4)):
    from test_plan_support import write_scenario

    from specsim.planning.window.window import prepare

    return prepare(str(write_scenario(tmp_path, repo)), [], list(ks), [2.0, 60.0, 150.0], None)


def _with_context(summaries: dict, context: float) -> dict:
    """A best-static summary whose running sequences hold ``context`` KV tokens each."""
    batch = summaries["batch_size"]["mean"]
    return {
        **summaries,
        "kv_cache_utilisation": {"mean": batch * context / 1e5},
        "kv_capacity_tokens": 1e5,
    }


def _tokens_per_second(plan, k: int, batch: int, context: float) -> float:
    """Expected tokens per second of a decode-only step, written out from the cost model."""
    from specsim.costs import PassTotals, StepCosts
    from specsim.simulation.acceptance import build_acceptance

    spec = plan.scenario.speculation
    entry = plan.profile.acceptance(spec.drafter, spec.verifier, spec.temperature)
    acceptance = build_acceptance(plan.profile, entry, spec.acceptance, 4)
    costs = StepCosts(plan.profile, spec.drafter)
    new = batch * (k + 1.0)
    pairs = new * context + batch * (k + 1.0) * (k + 2.0) / 2.0
    seconds = costs.iteration_s(k, PassTotals(batch, new, batch * context, pairs))
    return batch * acceptance.row_expected_emitted(k) / seconds


def test_k_by_batch_takes_the_fastest_window_at_each_batch_with_the_drafter_deployed(
    tmp_path, repo
):
    """Best static k 3, 3, 0: the 0 at 150 req/s is "no drafter", which no table row can be.
    Each batch size's k is the one with the most tokens per second of step time."""
    plan = _plan(tmp_path, repo)
    loads = _loads([3, 3, 0], batches=[1.5, 20.0, 70.0])
    for entry in loads:
        result = entry.by_config[f"k={entry.best_k}"]
        result.summary = _with_context(result.summary, 400.0)
    rows, derivation = k_by_batch(plan, loads)
    assert derivation == {
        "context_tokens_per_sequence": pytest.approx(400.0),
        "no_table_reason": None,
    }
    ranges = vllm_ranges(rows)
    assert ranges[0][0] == 1 and ranges[-1][1] == plan.scenario.engine.max_batch == 96
    assert all(k > 0 for _, _, k in ranges)
    for first, last, k in ranges:
        for batch in {first, (first + last) // 2, last}:
            rates = {j: _tokens_per_second(plan, j, batch, 400.0) for j in plan.ks}
            assert rates[k] == pytest.approx(max(rates.values()), rel=1e-12), (batch, rates)
    # Larger batches make verification dearer: the largest batches take the shortest window.
    # (It may first grow: a per-sequence cost a step, 120 us in the roofline, is paid whatever
    # k, and longer windows spread it over more tokens until verification passes the knee.)
    windows = [k for _, _, k in ranges]
    assert windows[-1] == min(windows) < max(windows)
    from specsim.scenario import Speculation

    spec = Speculation.model_validate({"drafter": "d", "policy": "by_batch", "k_by_batch": rows})
    assert [r.k for r in spec.k_by_batch] == [r["k"] for r in rows]


def test_no_table_when_speculation_never_pays_or_only_k0_was_swept(tmp_path, repo):
    plan = _plan(tmp_path, repo)
    rows, derivation = k_by_batch(plan, _loads([0, 0, 0]))
    assert rows == [] and "does not pay at any load" in derivation["no_table_reason"]
    plan = _plan(tmp_path, repo, ks=[0])
    rows, derivation = k_by_batch(plan, _loads([0, 0, 0]))
    assert rows == [] and derivation["no_table_reason"] == "only k = 0 was swept"


def _check(load: float, best_k: int, best: dict, table: dict | None) -> LoadCheck:
    return LoadCheck(load, f"{load:g} req/s", best_k, best, table)


ROWS = [{"max_batch": 50, "k": 3}, {"max_batch": 256, "k": 1}]


def test_compare_counts_small_gaps_as_equal_and_goodput_first_under_an_slo():
    static = summary(2.0, goodput=10.0, served=10.0)
    assert table_verdict(summary(2.0 * (1 + E2E_TIE / 2), goodput=10.0), static, True) == "equal"
    assert table_verdict(summary(2.0 * (1 + 2 * E2E_TIE), goodput=10.0), static, True) == "worse"
    assert table_verdict(summary(2.0 * (1 - 2 * E2E_TIE), goodput=10.0), static, False) == "better"
    # Faster on average but fewer requests within the SLO: worse under an SLO only.
    assert table_verdict(summary(1.0, goodput=9.0), static, True) == "worse"
    assert table_verdict(summary(1.0, goodput=9.0), static, False) == "better"
    assert table_verdict(None, static, True) == "failed"


def test_a_table_that_loses_below_the_crossover_is_not_recommended():
    """The reported case: the table's goodput at 10 req/s is the lowest (9.78 against k = 3's
    9.89 of 9.9 served, outside the 1 % band)."""
    checks = [
        _check(2.0, 3, summary(0.94, goodput=2.01), summary(0.94, goodput=2.01)),
        _check(10.0, 3, summary(2.17, goodput=9.89, served=9.9), summary(2.47, goodput=9.78)),
        _check(14.0, 0, summary(7.2, goodput=11.19, served=13.7), summary(31.9, goodput=0.40)),
    ]
    verdict = judge(checks, ROWS, {"load": 14.0, "last_paying": 10.0}, use_slo=True)
    assert list(verdict) == ["verdict", "reason", "speculation_off_above_load", "per_load"]
    assert verdict["verdict"] == NOT_RECOMMENDED
    assert verdict["reason"] == (
        "it loses to static k = 3 at 10 req/s: goodput 9.78 vs 9.89 req/s, mean E2E 2.47 vs "
        "2.17 s; run the best static k per load instead; above 10 req/s turn speculation off"
    )
    assert verdict["speculation_off_above_load"] == 10.0
    assert [item["outcome"] for item in verdict["per_load"]] == ["equal", "worse", "worse"]
    assert [item["judged"] for item in verdict["per_load"]] == [True, True, False]
    assert verdict["per_load"][1]["best_static"]["k"] == 3
    assert verdict["per_load"][1]["table"]["goodput_requests_per_s"] == 9.78
    text = verdict_text({"rows": ROWS, **verdict})
    assert text.startswith("The k-by-batch table is not recommended: it loses to static k = 3")


def test_a_table_that_matches_below_the_crossover_is_recommended_with_speculation_off_above():
    checks = [
        _check(2.0, 3, summary(0.94), summary(0.94)),
        _check(10.0, 3, summary(2.17, goodput=9.89), summary(2.16, goodput=9.90)),
        _check(14.0, 0, summary(7.2, goodput=11.19), summary(9.8, goodput=6.5)),
    ]
    verdict = judge(checks, ROWS, {"load": 14.0, "last_paying": 10.0}, use_slo=True)
    assert verdict["verdict"] == RECOMMENDED
    assert verdict["reason"] == (
        "it matches the best static k at every load up to 10 req/s (a fixed k = 3 does as "
        "well); above 10 req/s turn speculation off"
    )
    checks[1] = _check(10.0, 2, summary(2.17, goodput=9.89), summary(1.9, goodput=9.90))
    verdict = judge(checks, ROWS, {"load": None, "last_paying": 14.0}, use_slo=False)
    assert verdict["speculation_off_above_load"] is None
    # Without a crossover every load is judged, and static k = 0 wins at 14 req/s.
    assert verdict["verdict"] == NOT_RECOMMENDED
    assert verdict["reason"].startswith("it loses to static k = 0 (no drafter) at 14 req/s: ")
    checks[2] = _check(14.0, 1, summary(9.8), summary(9.7))
    verdict = judge(checks, ROWS, {"load": None, "last_paying": 14.0}, use_slo=False)
    assert verdict["verdict"] == RECOMMENDED
    assert verdict["reason"] == (
        "it beats the best static k at 10 req/s and matches it at every other load swept"
    )


def test_a_failed_table_run_or_no_table_is_not_recommended():
    checks = [_check(2.0, 3, summary(0.94), None)]
    verdict = judge(checks, ROWS, {"load": None, "last_paying": 2.0}, use_slo=False)
    assert verdict["verdict"] == NOT_RECOMMENDED
    assert verdict["reason"] == "its simulation at 2 req/s failed"
    reason = "speculation does not pay at any load swept"
    verdict = judge(checks, [], {"load": 2.0, "last_paying": None}, False, reason)
    assert verdict["verdict"] == NOT_RECOMMENDED and verdict["reason"] == reason
    assert verdict["per_load"][0]["judged"] is False and verdict["per_load"][0]["table"] is None
    assert verdict_text({"rows": [], **verdict}) == f"No k-by-batch table: {reason}."


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


def tree_steps(text):
    return parse_counts(text, "--tree-steps", 1, 32)


def tree_tokens(text):
    return parse_counts(text, "--tree-tokens", 2, 1025)


# Each list option's refusals, word for word: --k and the --tree-* options share one parser.
LIST_REFUSALS = [
    (parse_k_values, "a..b", "--k: cannot read 'a..b' as k values; fix: write e.g. 0..8 or 0,2,4"),
    (parse_k_values, "-1", "--k: cannot read '-1' as k values; fix: write e.g. 0..8 or 0,2,4"),
    (parse_k_values, "5..2", "--k: empty k range '5..2'; fix: write low..high"),
    (
        parse_k_values,
        "0,2-40",
        "--k: k = 40 is more than a window takes (at most 32); fix: give k values from 0 to 32",
    ),
    (parse_k_values, " , ", "--k: no k values given; fix: write e.g. 0..8"),
    (
        tree_steps,
        "x",
        "--tree-steps: cannot read 'x' as whole numbers; fix: write e.g. 1,2,4 or 1..4",
    ),
    (
        tree_steps,
        "1-3",
        "--tree-steps: cannot read '1-3' as whole numbers; fix: write e.g. 1,2,4 or 1..4",
    ),
    (
        tree_steps,
        "0",
        "--tree-steps: '0' is outside 1..32 (or an empty range); fix: give values from 1 to 32",
    ),
    (
        tree_steps,
        "4..1",
        "--tree-steps: '4..1' is outside 1..32 (or an empty range); fix: give values from 1 to 32",
    ),
    (
        tree_steps,
        "2,30..33",
        "--tree-steps: '30..33' is outside 1..32 (or an empty range); fix: give values from 1 "
        "to 32",
    ),
    (
        tree_tokens,
        "1..4",
        "--tree-tokens: '1..4' is outside 2..1025 (or an empty range); fix: give values from 2 "
        "to 1025",
    ),
    (tree_steps, "", "--tree-steps: no values given; fix: write e.g. 1,2,4"),
]


@pytest.mark.parametrize(("parse", "text", "error"), LIST_REFUSALS)
def test_each_list_option_refuses_in_its_own_words(parse, text, error):
    with pytest.raises(SpecsimError) as info:
        parse(text)
    assert str(info.value) == error


def test_the_list_options_read_ranges_alike():
    assert parse_k_values(" 6, 0..2 3-3 ") == [0, 1, 2, 3, 6]
    assert tree_steps(" 6, 1..2 3..3 ") == [1, 2, 3, 6]
    assert parse_k_values("32") == [32] and tree_steps("32") == [32]
    assert tree_tokens("2,1025") == [2, 1025]
    assert parse_k_values(None) is None and tree_steps(None) is None


def test_slo_attainment_prefers_the_summary_figure_and_falls_back_to_goodput():
    assert attainment_of({"slo_attainment": 0.97}) == 0.97
    assert (
        attainment_of({"goodput_requests_per_s": 9.0, "duration_s": 10.0, "requests": 100}) == 0.9
    )
    assert attainment_of(None) is None
    assert attains_slo({"slo_attainment": 0.99}, 0.99)
    assert not attains_slo({"slo_attainment": 0.9899}, 0.99)


def test_the_planner_never_imports_torch(repo):
    import subprocess
    import sys

    code = (
        "import sys\n"
        "import specsim.cli.plan, specsim.cli.report\n"
        "from specsim.planning.capacity import capacity\n"
        "from specsim.planning.swap import swap, swap_report\n"
        "from specsim.planning.window import window, window_report\n"
        "from specsim.planning.sweep.sweeper import simulate_point\n"
        "simulate_point('scenarios/poisson.yaml', ['workload.duration_s=2'])\n"
        "print('torch' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=repo, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"
