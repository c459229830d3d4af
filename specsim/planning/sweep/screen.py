"""Screen, then confirm: rank a sweep's configurations by the closed-form estimate, simulate only
those that can win, and say what was pruned and why.

A sweep's configurations fall into groups, each of which the planner answers by ``common.choose``
(in ``plan window``, a load: its best k). The estimate (``specsim.estimate``) ranks better than
it predicts (a common bias moves every configuration alike), so pruning compares ratios within
a group, and only where the estimate is trusted (below ``TRUSTED_PEAK`` utilisation in the
traffic's busiest window; past it, bursts and saturation make it wrong by factors). ``MARGIN``
comes from every pair of the shipped scenarios' ``plan window`` grids (measured by
``benchmarks/screen_margin.py``; docs/notes/2026-12-01-screen-margin.md). Per group:

1. simulate the configuration the estimate ranks best (and any the caller always needs);
2. against the best of those simulated (b), prune a configuration c when, even with the margin,
   it cannot beat b by the planner's rule: its goodput is below b's tie band
   (``GOODPUT_TIE``), or its goodput cannot rise above b's band and its mean end-to-end
   latency stays above b's;
3. simulate the rest.

The pruned ones are reported with the configuration that beat them and the estimated ratio.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from itertools import permutations
from typing import Any

from specsim.planning.common import GOODPUT_TIE, choose, metric
from specsim.planning.sweep.points import SweepPoint
from specsim.planning.sweep.sweeper import PointResult, Sweeper

# Grids of more points than this are screened unless --exhaustive (plan window): below it a
# sweep takes a minute or two and its report shows every point; the default grids are 70-99.
SCREEN_FROM = 200
# Goodput ratios are taken with this floor, as a share of the best goodput in the group: a
# saturated configuration's goodput may be 0, and below 1 % of the best it cannot win anyway.
GOODPUT_FLOOR = 0.01
# The estimate counts a configuration as meeting the SLO for (nearly) every request from here;
# its goodput ratios there have a margin of their own (``Margin.goodput_met``).
MET = 0.999
# The estimate is trusted only below this utilisation in the traffic's busiest 10 seconds: past
# it queues form in bursts (a trace's) or the replica saturates, which a steady-state closed form
# does not follow. Configurations beyond it are always simulated, and never pruned against.
TRUSTED_PEAK = 0.8


@dataclass(frozen=True)
class Margin:
    """Natural-log gaps. ``e2e``: a configuration estimated slower than the best by more than
    this is slower in simulation too (the widest estimated gap the simulation reversed, with
    headroom). ``goodput_met``: how far an estimated goodput ratio may be from the simulated one
    where both estimates meet the SLO for nearly every request. Where one does not, no goodput
    ratio was measured in the trusted regime, so none is relied on: such a configuration is
    pruned only by the exact goodput ceiling."""

    e2e: float
    goodput_met: float

    def json(self) -> dict[str, float]:
        return {"e2e_log_ratio": self.e2e, "goodput_met_log_ratio": self.goodput_met}


# Mean E2E: ten times the widest estimated gap of a pair the simulation ordered the other way
# (0.0021), rounded up; goodput: twice the worst ratio error (0.013), rounded up
# (docs/notes/2026-12-01-screen-margin.md).
MARGIN = Margin(e2e=0.02, goodput_met=0.03)


@dataclass(frozen=True)
class Figures:
    """What the choice rule reads: mean E2E, goodput and the served request rate."""

    e2e: float | None
    goodput: float | None
    served: float | None
    met: bool = False  # estimated: nearly every request meets the SLO
    trusted: bool = False  # an estimate in the regime its margin was measured in
    ceiling: float | None = None  # the most requests per second any run of the traffic serves

    @classmethod
    def of_summary(cls, summary: dict[str, Any] | None) -> Figures:
        return cls(
            metric(summary, "e2e_s", "mean"),
            metric(summary, "goodput_requests_per_s"),
            metric(summary, "throughput_requests_per_s"),
        )

    @classmethod
    def of_estimate(cls, estimate) -> Figures:
        attained = estimate.slo_attainment
        return cls(
            estimate.e2e_mean_s if math.isfinite(estimate.e2e_mean_s) else None,
            estimate.goodput_requests_per_s,
            estimate.throughput_requests_per_s,
            attained is not None and attained >= MET,
            estimate.peak_utilisation <= TRUSTED_PEAK,
            estimate.ceiling_requests_per_s,
        )

    def summary(self) -> dict[str, Any]:
        """As a run's summary, for ``common.choose``."""
        return {
            "e2e_s": {"mean": self.e2e},
            "goodput_requests_per_s": self.goodput,
            "throughput_requests_per_s": self.served,
        }


def _log_ratio(mine: float | None, theirs: float | None, floor: float = 0.0) -> float | None:
    if mine is None or theirs is None:
        return None
    mine, theirs = max(mine, floor), max(theirs, floor)
    if mine <= 0.0 or theirs <= 0.0:
        return None
    return math.log(mine / theirs)


def cannot_win(
    mine: Figures, best_estimate: Figures, best: Figures, use_slo: bool, margin: Margin
) -> str | None:
    """Why configuration ``mine`` (estimated) cannot beat the simulated ``best`` (its own
    estimate ``best_estimate``), or None when it may (or either estimate is not trusted)."""
    if not (mine.trusted and best_estimate.trusted):
        return None
    e2e = _log_ratio(mine.e2e, best_estimate.e2e)
    slower = e2e is not None and e2e - margin.e2e > 0.0
    if not use_slo:
        return f"mean E2E {math.exp(e2e):.3g}x the best's (estimated)" if slower else None
    if best.goodput is None or best.goodput <= 0.0:
        return None
    band = GOODPUT_TIE * max(best.served or 0.0, best.goodput)
    both_met = mine.met and best_estimate.met
    floor = GOODPUT_FLOOR * max(best_estimate.goodput or 0.0, mine.goodput or 0.0)
    goodput = _log_ratio(mine.goodput, best_estimate.goodput, floor)
    highest = None  # the most its goodput can be, estimated with the margin
    if both_met and goodput is not None:
        highest = best.goodput * math.exp(goodput + margin.goodput_met)
        if highest < best.goodput - band:
            return f"goodput {math.exp(goodput):.3g}x the best's (estimated), below its tie band"
    if mine.ceiling is not None:  # exact, no estimate in it
        highest = mine.ceiling if highest is None else min(highest, mine.ceiling)
    if highest is not None and highest <= best.goodput + band and slower:
        return (
            f"mean E2E {math.exp(e2e):.3g}x the best's (estimated), and its goodput cannot "
            "rise above the best's tie band"
        )
    return None


@dataclass
class Pruned:
    point: SweepPoint
    label: str
    group: Hashable
    beaten_by: str
    reason: str


@dataclass
class ScreenOutcome:
    """The simulated results (in the order of the points given, None for a pruned one), what
    was pruned, and the margin used."""

    results: list[PointResult | None]
    pruned: list[Pruned] = field(default_factory=list)
    estimated: int = 0
    estimate_failures: int = 0
    margin: Margin = MARGIN

    @property
    def simulated(self) -> int:
        return sum(result is not None for result in self.results)

    def json(self, group_name: Callable[[Hashable], Any] = lambda g: g) -> dict[str, Any]:
        return {
            "screened": True,
            "configurations": len(self.results),
            "estimated": self.estimated,
            "estimate_failures": self.estimate_failures,
            "simulated": self.simulated,
            "pruned": len(self.pruned),
            "margin": self.margin.json(),
            "pruned_configurations": [
                {
                    "group": group_name(p.group),
                    "config": p.label,
                    "beaten_by": p.beaten_by,
                    "reason": p.reason,
                }
                for p in self.pruned
            ],
        }


def estimate_figures(point: SweepPoint) -> Figures | None:
    """A point's estimated figures; None where the estimate cannot answer (it is simulated)."""
    from specsim.errors import SpecsimError
    from specsim.estimate import estimate_point

    try:
        return Figures.of_estimate(estimate_point(point.scenario, point.overrides))
    except (SpecsimError, ValueError, ArithmeticError):
        return None


def screen_grid(
    points: Sequence[SweepPoint],
    group: Callable[[SweepPoint], Hashable],
    label: Callable[[SweepPoint], str],
    use_slo: bool,
    sweeper: Sweeper,
    always: Callable[[SweepPoint], bool] = lambda point: False,
    competes: Callable[[SweepPoint], bool] = lambda point: True,
    margin: Margin = MARGIN,
    desc: str = "screened sweep",
    estimable: Callable[[SweepPoint], bool] = lambda point: True,
) -> ScreenOutcome:
    """Simulate the points that can win their group; prune the rest (see the module).

    ``always``: points simulated whatever their estimate; ``competes``: points the group's
    choice is among (the others are always simulated, and never prune one); ``estimable``:
    points the estimate can price (the others are simulated, as an estimate that fails is)."""
    priced = [point for point in points if estimable(point)]
    figures = iter(sweeper.map_local(estimate_figures, priced))
    estimates = [next(figures) if estimable(point) else None for point in points]
    results: list[PointResult | None] = [None] * len(points)
    groups: dict[Hashable, list[int]] = {}
    for i, point in enumerate(points):
        groups.setdefault(group(point), []).append(i)
    kept = [always(p) or not competes(p) or estimates[i] is None for i, p in enumerate(points)]
    first: list[int] = []
    for members in groups.values():
        known = [(i, estimates[i].summary()) for i in members if not kept[i]]
        leader = choose(known, use_slo)
        first += [i for i in members if i == leader or kept[i]]
    _simulate(points, first, results, sweeper, desc)
    pruned, rest = [], []
    for key, members in groups.items():
        done = [i for i in members if results[i] is not None and results[i].ok]
        leader = choose([(i, results[i].summary) for i in done if competes(points[i])], use_slo)
        for i in members:
            if results[i] is not None:
                continue
            reason = None
            if leader is not None and estimates[leader] is not None:
                best = Figures.of_summary(results[leader].summary)
                reason = cannot_win(estimates[i], estimates[leader], best, use_slo, margin)
            if reason is None:
                rest.append(i)
            else:
                winner = label(points[leader])
                pruned.append(Pruned(points[i], label(points[i]), key, winner, reason))
    _simulate(points, rest, results, sweeper, desc)
    return ScreenOutcome(
        results=results,
        pruned=pruned,
        estimated=sum(e is not None for e in estimates),
        estimate_failures=sum(
            e is None for e, point in zip(estimates, points, strict=True) if estimable(point)
        ),
        margin=margin,
    )


def _simulate(points, indices, results, sweeper: Sweeper, desc: str) -> None:
    simulated = sweeper.run([points[i] for i in indices], desc=desc)
    for i, result in zip(indices, simulated, strict=True):
        results[i] = result


# -- the margin's evidence ------------------------------------------------------------------------


def ranking_errors(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """How well the estimate ranks against simulation, over every ordered pair of trusted
    configurations in the same group (rows: ``scenario``, ``load``, ``config``, ``use_slo``,
    ``estimate`` and ``simulated`` figures).

    Per metric: the worst gap between the estimated and the simulated log ratio, and the widest
    estimated gap of a pair the simulation orders the other way (what an e2e margin must
    exceed: pruning at a wider estimated gap than any reversed pair never prunes a winner)."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["scenario"], row["load"]), []).append(row)
    worst = {"e2e": _Worst(), "goodput_met": _Worst()}
    pairs = untrusted = 0
    for key, members in groups.items():
        for a, b in permutations(members, 2):
            ea, eb = a["estimate"], b["estimate"]
            if max(ea["peak_utilisation"], eb["peak_utilisation"]) > TRUSTED_PEAK:
                untrusted += 1
                continue
            pairs += 1
            sa, sb = a["simulated"], b["simulated"]
            where = {"scenario": key[0], "load": key[1], "configs": [a["config"], b["config"]]}
            est = _log_ratio(ea["e2e_mean_s"], eb["e2e_mean_s"])
            sim = _log_ratio(sa["e2e_mean_s"], sb["e2e_mean_s"])
            worst["e2e"].note(est, sim, where)
            met = all((e.get("slo_attainment") or 0.0) >= MET for e in (ea, eb))
            if a["use_slo"] and met:
                est, sim = (
                    _log_ratio(x["goodput_requests_per_s"], y["goodput_requests_per_s"])
                    for x, y in ((ea, eb), (sa, sb))
                )
                worst["goodput_met"].note(est, sim, where)
    return {
        "groups": len(groups),
        "pairs": pairs,
        "pairs_not_trusted": untrusted,
        **{name: w.json() for name, w in worst.items()},
    }


@dataclass
class _Worst:
    """The worst log-ratio error and the widest reversed estimated gap seen so far."""

    pairs: int = 0
    error: float = 0.0
    error_at: dict[str, Any] | None = None
    reversed_pairs: int = 0
    reversed_gap: float = 0.0
    reversed_at: dict[str, Any] | None = None

    def note(self, est: float | None, sim: float | None, where: dict[str, Any]) -> None:
        if est is None or sim is None:
            return
        self.pairs += 1
        if abs(est - sim) > self.error:
            self.error, self.error_at = abs(est - sim), where
        if est > 0.0 >= sim:
            self.reversed_pairs += 1
            if est > self.reversed_gap:
                self.reversed_gap, self.reversed_at = est, where

    def json(self) -> dict[str, Any]:
        return {
            "pairs": self.pairs,
            "worst_log_ratio_error": self.error,
            "worst_at": self.error_at,
            "pairs_ordered_wrongly": self.reversed_pairs,
            "widest_reversed_log_gap": self.reversed_gap,
            "widest_reversed_at": self.reversed_at,
        }
