"""Bisection against monotone predicates with known thresholds."""

from __future__ import annotations

import pytest

from specsim.planning.sweep.search import Bisection, solve


@pytest.mark.parametrize("threshold", [0.013, 0.7, 7.3, 55.0, 4321.0])
@pytest.mark.parametrize("m", [1, 3])
@pytest.mark.parametrize("start", [0.5, 10.0])
def test_finds_a_known_threshold_within_the_stated_tolerance(threshold, m, start):
    calls = []

    def feasible(x: float) -> bool:
        calls.append(x)
        return x <= threshold

    search = solve(feasible, Bisection(start=start, rel_tol=0.01), m=m)
    assert search.status == "converged"
    assert search.lo <= threshold < search.hi
    assert search.hi - search.lo <= 0.01 * search.hi
    assert search.estimate == search.lo
    # Each probe was recorded once with its true outcome.
    assert sorted(x for x, _ in search.probes) == sorted(calls)
    assert all(ok == (x <= threshold) for x, ok in search.probes)


def test_more_probes_per_round_take_fewer_rounds():
    def rounds(m: int) -> int:
        search, count = Bisection(start=1.0, rel_tol=0.001), 0
        while not search.done:
            probes = search.next_probes(m)
            search.record_all([(x, x <= 37.7) for x in probes])
            count += 1
        return count

    assert rounds(4) < rounds(1)


def test_nothing_feasible_and_everything_feasible_are_reported():
    never = solve(lambda x: False, Bisection(start=1.0, lower_limit=0.01))
    assert never.status == "infeasible" and never.estimate is None
    always = solve(lambda x: True, Bisection(start=1.0, upper_limit=100.0))
    assert always.status == "unbounded" and always.estimate == 100.0


def test_probe_budget_ends_the_search_with_a_valid_bracket():
    search = solve(lambda x: x <= 3.14159, Bisection(start=1.0, rel_tol=1e-9, max_probes=12))
    assert search.status == "exhausted"
    assert search.lo <= 3.14159 < search.hi


def test_a_wobbling_predicate_still_gives_feasible_below_infeasible():
    # Feasible up to 10 except an isolated failure at 6: the bracket stays consistent.
    def wobbly(x: float) -> bool:
        return x <= 10 and not (5.9 < x < 6.1)

    search = solve(wobbly, Bisection(start=6.0, rel_tol=0.01))
    assert search.status == "converged"
    assert search.lo < search.hi and wobbly(search.lo) and not wobbly(search.hi)


def test_bad_settings_are_rejected():
    with pytest.raises(ValueError):
        Bisection(start=0.0)
    with pytest.raises(ValueError):
        Bisection(start=1.0, rel_tol=0.0)
