"""Bisection for the largest load that still meets an SLO.

``Bisection`` is a small state machine rather than a loop around a callback, so the capacity
planner can advance the searches of many candidates (k, drafter) together and send each round's
probes to the sweep engine as one parallel batch. With spare workers a search probes several
points per round (an m-ary search), which shrinks the bracket by m + 1 per round instead of 2.

The predicate is assumed monotone: feasible below a threshold, infeasible above. A simulation
with a fixed seed is deterministic, but its feasibility near the threshold can wobble; the search
then still returns a bracket [lo, hi] with lo feasible and hi infeasible, within the tolerance.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Bisection:
    """Find the largest x in [lower_limit, upper_limit] with feasible(x), to ``rel_tol``.

    Start at ``start``; grow by ``growth`` until infeasible (or shrink until feasible), then
    bisect until ``hi - lo <= rel_tol * hi``. ``status`` ends as ``"converged"``,
    ``"infeasible"`` (not even ``lower_limit`` is feasible), ``"unbounded"`` (``upper_limit`` is
    still feasible) or ``"exhausted"`` (``max_probes`` used first; the bracket is still valid).
    """

    start: float
    rel_tol: float = 0.02
    lower_limit: float = 1e-3
    upper_limit: float = 1e6
    growth: float = 2.0
    max_probes: int = 60
    lo: float | None = None
    hi: float | None = None
    probes: list[tuple[float, bool]] = field(default_factory=list)
    status: str = "searching"

    def __post_init__(self) -> None:
        if not (0 < self.lower_limit <= self.start <= self.upper_limit):
            raise ValueError(
                f"start {self.start} must lie in [{self.lower_limit}, {self.upper_limit}] (> 0)"
            )
        if not (0 < self.rel_tol < 1) or self.growth <= 1:
            raise ValueError("rel_tol must be in (0, 1) and growth above 1")

    @property
    def done(self) -> bool:
        return self.status != "searching"

    @property
    def estimate(self) -> float | None:
        """The conservative answer: the largest load seen to be feasible (None if none was)."""
        return self.lo

    @property
    def width(self) -> float | None:
        """hi - lo once bracketed."""
        if self.lo is None or self.hi is None:
            return None
        return self.hi - self.lo

    def next_probes(self, m: int = 1) -> list[float]:
        """Up to ``m`` loads to evaluate next (all of them before calling ``record``)."""
        if self.done:
            return []
        m = max(1, m)
        if self.lo is None and self.hi is None:
            return [self.start]
        if self.hi is None:  # still feasible: grow
            points = [self.lo * self.growth**i for i in range(1, m + 1)]
            points = [min(p, self.upper_limit) for p in points]
        elif self.lo is None:  # infeasible: shrink
            points = [self.hi / self.growth**i for i in range(1, m + 1)]
            points = [max(p, self.lower_limit) for p in points]
        else:  # bracketed: split [lo, hi] into m + 1 equal parts
            step = (self.hi - self.lo) / (m + 1)
            points = [self.lo + step * i for i in range(1, m + 1)]
        return sorted(set(points))

    def record(self, x: float, feasible: bool) -> None:
        self.probes.append((x, bool(feasible)))
        self._update()

    def record_all(self, outcomes: list[tuple[float, bool]]) -> None:
        for x, ok in outcomes:
            self.probes.append((x, bool(ok)))
        self._update()

    def _update(self) -> None:
        bad = [x for x, ok in self.probes if not ok]
        self.hi = min(bad) if bad else None
        good = [x for x, ok in self.probes if ok and (self.hi is None or x < self.hi)]
        self.lo = max(good) if good else None
        if self.hi is not None and self.hi <= self.lower_limit and self.lo is None:
            self.status = "infeasible"
        elif self.lo is not None and self.hi is None and self.lo >= self.upper_limit:
            self.status = "unbounded"
        elif self.lo is not None and self.hi is not None and self.width <= self.rel_tol * self.hi:
            self.status = "converged"
        elif len(self.probes) >= self.max_probes:
            self.status = "exhausted"


def solve(feasible: Callable[[float], bool], search: Bisection, m: int = 1) -> Bisection:
    """Drive ``search`` with a plain predicate (one probe batch at a time)."""
    while not search.done:
        search.record_all([(x, feasible(x)) for x in search.next_probes(m)])
    return search
