"""``plan window``: which k to run at each load, and where speculation stops paying.

For every load level the sweep simulates each static k and the goodput-adaptive policy. The
analysis picks the best static k per load (``common.choose``) and finds the crossover load from
which k = 0 wins. It also derives a k-by-batch-size table (``window_table``) in the two forms
engines take: specsim's ``speculation.k_by_batch`` and vLLM's
``num_speculative_tokens_per_batch_size`` ranges ``[start_bs, end_bs, k]``. A second, small sweep
then runs that table (``policy: by_batch``) at every load, and the verdict sets its result
against the best static choice at each load, so the table is checked, not assumed.

Static k = 0 is speculation off: no drafter is deployed, so its weights free KV-cache memory and
no drafter prefill runs. A k-by-batch table keeps the drafter deployed, so its k = 0 rows still
pay the drafter's KV-sync pass: above the crossover the answer is to turn speculation off, not
a table.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from specsim.comparison import across_loads
from specsim.planning.common import (
    LoadAxis,
    answerable_k,
    check_k_values,
    choose,
    default_loads,
    load_axis,
    metric,
    scenario_identity,
    switch_overrides,
    without_pools,
)
from specsim.planning.policy_compare import check_names, check_reach, start_k
from specsim.planning.rates import ArrivalScale
from specsim.planning.sweep.points import SweepPoint
from specsim.planning.sweep.screen import SCREEN_FROM, ScreenOutcome, screen_grid
from specsim.planning.sweep.sweeper import PointResult, Sweeper
from specsim.planning.trees import SglangSpace, TreeCandidate
from specsim.planning.window.window_policies import (
    EXTRA_POLICIES,
    choices,
)
from specsim.planning.window.window_table import (
    BY_BATCH,
    LoadCheck,
    by_batch_points,
    judge,
    k_by_batch,
    table_verdict,
    vllm_ranges,
)
from specsim.planning.window.window_trees import add_trees, json_block

ADAPTIVE = "adaptive"


@dataclass
class WindowPlan:
    """What the sweep will run (validated inputs), before anything is written."""

    scenario_path: str
    base_overrides: list[str]
    scenario: Any
    profile: Any
    axis: LoadAxis
    loads: list[float]
    ks: list[int]
    seed: int
    adaptive: bool = True
    policies: tuple[str, ...] = ()  # policies run beside the default ones (``window_policies``)
    scale: ArrivalScale | None = None  # offered req/s per load (None for a closed loop)
    screen: bool = False  # estimate every point, simulate only those that can win (``screen``)
    # Trees tried beside the chains (``planning.trees``), their drafting, and what was skipped.
    trees: list[TreeCandidate] = field(default_factory=list)
    tree_drafts: str = "top-k"
    tree_skipped: list[str] = field(default_factory=list)
    # No measured tree for the drafter: every tree's acceptance is derived from the chain's
    # rates, siblings accepting nothing, so no tree may win (each is its rank-0 chain plus
    # nodes it verifies and never accepts; ``window_trees.FROM_CHAIN``).
    trees_from_chain: bool = False

    @property
    def tree_by_config(self) -> dict[str, TreeCandidate]:
        return {candidate.config: candidate for candidate in self.trees}

    def offered_rps(self, load: float) -> float | None:
        return None if self.scale is None else self.scale.rate(load)

    @property
    def use_slo(self) -> bool:
        return self.scenario.slo is not None

    def identity(self) -> dict[str, Any]:
        extra: dict[str, Any] = {"trees": [c.config for c in self.trees]} if self.trees else {}
        if self.policies:
            extra["policies"] = list(self.policies)
        return {
            "command": "plan window",
            **scenario_identity(self.scenario_path, self.base_overrides),
            "loads": self.loads,
            "k": self.ks,
            "seed": self.seed,
            **extra,
        }

    def tree_overrides(self, candidate: TreeCandidate) -> list[str]:
        return [
            f"speculation.tree={candidate.text}",
            f"speculation.k={candidate.shape.depth}",
            "speculation.policy=fixed",
            f"speculation.tree_drafts={self.tree_drafts}",
            *switch_overrides(self.scenario.speculation, "fixed", tree=True),
        ]

    def policy_overrides(self, policy: str) -> list[str]:
        """The policy, and the scenario's engine switches it refuses dropped."""
        return [
            f"speculation.policy={policy}",
            *switch_overrides(self.scenario.speculation, policy),
        ]

    def point(self, load: float, config: str, extra: list[str]) -> SweepPoint:
        overrides = [*self.base_overrides, f"seed={self.seed}", *self.axis.overrides(load), *extra]
        return SweepPoint.make(self.scenario_path, overrides, load=load, config=config)

    def grid(self) -> list[SweepPoint]:
        points = []
        # A scenario's own tree would override the chains' k: they run with it off.
        chain = ["speculation.tree=null"] if self.scenario.speculation.tree is not None else []
        for load in self.loads:
            for k in self.ks:
                points.append(
                    self.point(
                        load,
                        f"k={k}",
                        [f"speculation.k={k}", *self.policy_overrides("fixed"), *chain],
                    )
                )
            for candidate in self.trees:
                points.append(self.point(load, candidate.config, self.tree_overrides(candidate)))
            top = max(self.ks)
            if top > 0 and self.adaptive:
                points.append(
                    self.point(
                        load,
                        ADAPTIVE,
                        [f"speculation.k={top}", *self.policy_overrides("adaptive"), *chain],
                    )
                )
            for name in self.policies if top > 0 else ():
                k = start_k(name, self.scenario.speculation, top)
                extra = [f"speculation.k={k}", *self.policy_overrides(name), *chain]
                points.append(self.point(load, name, extra))
        return points


def prepare(
    scenario_path: str,
    overrides: Sequence[str],
    ks: list[int] | None,
    loads: list[float] | None,
    seed: int | None,
    screen: bool | None = None,
    trees: list[TreeCandidate] | None = None,
    space: SglangSpace | None = None,
    tree_drafts: str | None = None,
    policies: Sequence[str] = (),
) -> WindowPlan:
    """Validate everything (one-line errors) and fix the grid; nothing is written.

    ``screen`` None screens a grid of more than ``screen.SCREEN_FROM`` points. ``trees`` and
    ``space`` (SGLang's knobs) add tree shapes beside the chains, drafted ``tree_drafts``
    (default: the scenario's ``speculation.tree_drafts``)."""
    from specsim.errors import SpecsimError
    from specsim.profile import load_profile
    from specsim.scenario import load_scenario

    scenario = load_scenario(scenario_path, list(overrides))
    pools = without_pools(scenario)
    if pools:
        overrides = [*overrides, *pools]
        scenario = load_scenario(scenario_path, list(overrides))
    spec = scenario.speculation
    if spec.drafter is None:
        raise SpecsimError(
            "the scenario has no drafter, so there is no k to choose",
            file=scenario_path,
            key="speculation.drafter",
            fix="set one, e.g. --set speculation.drafter=NAME",
        )
    profile = load_profile(scenario.resolve(scenario.profile))
    limit = answerable_k(profile, spec)
    if ks is None:
        ks = list(range(min(8, limit) + 1))
    check_k_values(ks, limit, spec.drafter, profile.path)
    axis = load_axis(scenario)
    loads = loads if loads is not None else default_loads(axis, scenario.engine.max_batch)
    plan = WindowPlan(
        scenario_path=str(scenario_path),
        base_overrides=list(overrides),
        scenario=scenario,
        profile=profile,
        axis=axis,
        loads=loads,
        ks=ks,
        seed=scenario.seed if seed is None else seed,
        scale=None if axis.kind == "concurrency" else ArrivalScale.for_scenario(scenario, axis),
    )
    if trees or space is not None:
        add_trees(plan, trees or [], space, tree_drafts)
    add_policies(plan, policies, limit)
    plan.screen = len(plan.grid()) > SCREEN_FROM if screen is None else screen
    return plan


def add_policies(plan: WindowPlan, policies: Sequence[str], limit: int) -> None:
    """The policies run beside the default ones, checked against what the acceptance answers."""
    check_names(policies, EXTRA_POLICIES, "a policy plan window adds")
    check_reach(policies, plan.scenario.speculation, limit)
    plan.policies = tuple(dict.fromkeys(policies))


# -- analysis -------------------------------------------------------------------------------------


@dataclass
class LoadResult:
    load: float
    by_config: dict[str, PointResult] = field(default_factory=dict)
    best_k: int | None = None
    best_config: str | None = None  # the best of every chain k and tree (``k=K`` without trees)

    def summary(self, config: str) -> dict[str, Any] | None:
        result = self.by_config.get(config)
        return result.summary if result is not None and result.ok else None

    @property
    def best(self) -> dict[str, Any] | None:
        return None if self.best_k is None else self.summary(f"k={self.best_k}")

    @property
    def best_setting(self) -> dict[str, Any] | None:
        """The best of every chain k and tree (``best`` when no tree was swept)."""
        return None if self.best_config is None else self.summary(self.best_config)

    def speedup(self, summary: dict[str, Any] | None) -> float | None:
        """Mean end-to-end latency at k = 0 over ``summary``'s (above 1: speculation pays)."""
        zero, mine = metric(self.summary("k=0"), "e2e_s", "mean"), metric(summary, "e2e_s", "mean")
        return zero / mine if zero and mine else None


def analyse(plan: WindowPlan, results: list[PointResult]) -> list[LoadResult]:
    per_load = {load: LoadResult(load) for load in plan.loads}
    for result in results:
        per_load[result.tags["load"]].by_config[result.tags["config"]] = result
    for entry in per_load.values():
        candidates = [(k, entry.summary(f"k={k}")) for k in plan.ks]
        entry.best_k = choose(candidates, plan.use_slo)
        entry.best_config = None if entry.best_k is None else f"k={entry.best_k}"
        if plan.trees and not plan.trees_from_chain:
            trees = [(c.config, entry.summary(c.config)) for c in plan.trees]
            tree = choose(trees, plan.use_slo)
            # A tree must beat the best chain by more than the tie bands (``table_verdict``:
            # what redrawing the random streams moves), else the simpler chain is kept.
            if tree is not None and (
                entry.best_k is None
                or table_verdict(entry.summary(tree), entry.best, plan.use_slo) == "better"
            ):
                entry.best_config = tree
    return [per_load[load] for load in plan.loads]


def crossover(loads: list[LoadResult]) -> dict[str, float | None]:
    """The lowest load from which k = 0 is best at it and every higher load swept.

    ``last_paying`` is the highest load where speculation still won below it. Both None when
    the answer lies outside the loads swept (or a load failed).
    """
    start = off_from(loads)
    paying = [e.load for e in loads if e.best_k and (start is None or e.load < start)]
    return {"load": start, "last_paying": max(paying) if paying else None}


def off_from(loads: list[LoadResult], best=lambda e: e.best_k, off: Any = 0) -> float | None:
    """The lowest load from which ``off`` is the ``best`` at it and at every higher load with a
    result (a tree drafter's: ``best_config`` and ``"k=0"``)."""
    start = None
    for entry in reversed([e for e in loads if best(e) is not None]):
        if best(entry) != off:
            break
        start = entry.load
    return start


def run(plan: WindowPlan, sweeper: Sweeper) -> dict[str, Any]:
    """Run the grid and the table check; return everything the report and summary need."""
    screened: ScreenOutcome | None = None
    if plan.screen:
        # k = 0 and the adaptive policy are always simulated: the report compares with them.
        # Trees too: the estimate prices chains only, so it neither prunes a tree nor lets one
        # prune a chain (a chain that cannot beat the best chain cannot beat the best setting).
        trees = plan.tree_by_config
        screened = screen_grid(
            plan.grid(),
            group=lambda point: point.tags["load"],
            label=lambda point: point.tags["config"],
            use_slo=plan.use_slo,
            sweeper=sweeper,
            always=lambda point: point.tags["config"] == "k=0",
            competes=lambda point: point.tags["config"] not in (ADAPTIVE, *EXTRA_POLICIES, *trees),
            desc="plan window (screened)",
            estimable=lambda point: point.tags["config"] not in (*EXTRA_POLICIES, *trees),
        )
        results = [result for result in screened.results if result is not None]
    else:
        results = sweeper.run(plan.grid(), desc="plan window")
    loads = analyse(plan, results)
    rows, derivation = k_by_batch(plan, loads)
    check = sweeper.run(by_batch_points(plan, rows), desc="k-by-batch check")
    for result in check:
        next(e for e in loads if e.load == result.tags["load"]).by_config[BY_BATCH] = result
    cross = crossover(loads)
    checks = [
        LoadCheck(
            load=entry.load,
            label=plan.axis.fmt(entry.load),
            best_k=entry.best_k,
            best=entry.best,
            table=entry.summary(BY_BATCH),
            offered_rps=plan.offered_rps(entry.load),
        )
        for entry in loads
    ]
    verdict = judge(checks, rows, cross, plan.use_slo, derivation["no_table_reason"])
    return {
        "loads": loads,
        "policies": choices(loads, plan.use_slo),
        "rows": rows,
        "crossover": cross,
        "context": derivation["context_tokens_per_sequence"],
        "verdict": verdict,
        "screened": screened,
    }


def regressions_vs_off(loads: list[LoadResult]) -> list[dict[str, Any]]:
    """Every compared metric that is worse at the best k than with speculation off, at the
    loads where speculation is chosen (``comparison.across_loads``)."""
    pairs = [(e.load, e.best, e.summary("k=0")) for e in loads if e.best_k]
    return across_loads(pairs)


def json_summary(plan: WindowPlan, outcome: dict[str, Any], sweeper: Sweeper) -> dict[str, Any]:
    loads: list[LoadResult] = outcome["loads"]
    best = []
    for entry in loads:
        summary = entry.best
        best.append(
            {
                "load": entry.load,
                "offered_rps": plan.offered_rps(entry.load),
                "best_k": entry.best_k,
                "e2e_speedup_vs_k0": entry.speedup(summary),
                "batch_size": metric(summary, "batch_size"),
                "goodput_requests_per_s": metric(summary, "goodput_requests_per_s"),
                "adaptive_e2e_mean_s": metric(entry.summary(ADAPTIVE), "e2e_s", "mean"),
                "best_e2e_mean_s": metric(summary, "e2e_s", "mean"),
            }
        )
    spec = plan.scenario.speculation
    screened: ScreenOutcome | None = outcome.get("screened")
    screening = {} if screened is None else {"screening": screened.json()}
    return {
        "command": "plan window",
        "scenario": plan.scenario_path,
        "drafter": spec.drafter,
        "verifier": spec.verifier,
        "load_axis": plan.axis.kind,
        "chosen_by": "goodput under the SLO" if plan.use_slo else "mean end-to-end latency",
        "k_values": plan.ks,
        "best_k": best,
        "crossover_load": outcome["crossover"]["load"],
        "last_load_where_speculation_pays": outcome["crossover"]["last_paying"],
        "regressions_vs_k0": regressions_vs_off(loads),
        "policies": outcome["policies"],
        "k_by_batch": {
            "rows": outcome["rows"],
            "num_speculative_tokens_per_batch_size": vllm_ranges(outcome["rows"]),
            "context_tokens_per_sequence": outcome["context"],
            **outcome["verdict"],
        },
        **sweeper.stats.json(),
        **screening,
        **({"trees": json_block(plan, loads)} if plan.trees else {}),
    }
