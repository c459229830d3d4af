"""``report drafter-swap``: two or more drafters side by side, and which to run.

Each drafter gets the ``plan window`` grid (every k at every load, no adaptive policy) with its own
profile when one is given, so its best k per load is chosen by the same rule as ``plan window``.
A tree drafter (``--tree-drafter NAME=SHAPE``) is a drafter drafting that tree: its grid is the
tree and k = 0 at every load, and it is compared with the chain drafters at its best setting by
the same figures (the tree counts as k = its depth where a k is shown).
The drafters are then compared load by load at their best k; the recommendation is the drafter
that wins the most loads (ties: the lower mean end-to-end latency averaged over loads), with the
margins behind it. A lossy verifier is flagged next to the speed it buys, with the profile's
``tv_distance`` or a clear "not measured".
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specsim.comparison import across_loads, across_loads_text
from specsim.errors import SpecsimError
from specsim.planning.common import choose, metric, scenario_identity
from specsim.planning.sweep.sweeper import Sweeper
from specsim.planning.trees import TreeCandidate
from specsim.planning.window import window
from specsim.planning.window.window_trees import FROM_CHAIN
from specsim.sampling.kinds import LOSSY_VERIFIERS

OFF = "speculation off"


@dataclass
class DrafterPlan:
    name: str  # the entry's label: the drafter's name, or ``NAME tree SHAPE``
    profile_path: str | None  # None: the scenario's own profile
    plan: window.WindowPlan
    tree: TreeCandidate | None = None  # a tree drafter: the tree it drafts
    drafter: str | None = None  # the profile's drafter (None: ``name``)

    @property
    def drafter_name(self) -> str:
        return self.drafter or self.name

    @property
    def acceptance(self):
        spec = self.plan.scenario.speculation
        return self.plan.profile.acceptance(self.drafter_name, spec.verifier, spec.temperature)

    def best_window(self, entry: window.LoadResult) -> int | None:
        """The best k at a load (a tree counts as its depth)."""
        if self.tree is not None and entry.best_config == self.tree.config:
            return self.tree.shape.depth
        return entry.best_k

    @property
    def lossy(self) -> bool:
        return self.plan.scenario.speculation.verifier in LOSSY_VERIFIERS

    @property
    def tv_distance(self) -> float | None:
        return self.acceptance.tv_distance


@dataclass
class SwapPlan:
    scenario_path: str
    base_overrides: list[str]
    drafters: list[DrafterPlan]
    loads: list[float]
    ks: list[int]
    seed: int
    policies: tuple[str, ...] = ()  # the window policies compared (``swap_policies``)

    @property
    def first(self) -> window.WindowPlan:
        return self.drafters[0].plan

    def identity(self) -> dict[str, Any]:
        return {
            "command": "report drafter-swap",
            **scenario_identity(self.scenario_path, self.base_overrides),
            "drafters": [d.name for d in self.drafters],
            "profiles": [d.profile_path for d in self.drafters],
            "loads": self.loads,
            "k": self.ks,
            "seed": self.seed,
            **({"policies": list(self.policies)} if self.policies else {}),
        }


def prepare(
    scenario_path: str,
    overrides: Sequence[str],
    drafters: list[str],
    profiles: list[str] | None,
    ks: list[int] | None,
    loads: list[float] | None,
    seed: int | None,
    tree_drafters: list[tuple[str, TreeCandidate]] | None = None,
    tree_drafts: str | None = None,
) -> SwapPlan:
    tree_drafters = tree_drafters or []
    profiles = _checked_options(drafters, tree_drafters, profiles or [], ks)
    plans = []
    for i, name in enumerate(drafters):
        profile = str(Path(profiles[i]).resolve()) if profiles else None
        if profile is not None and not Path(profile).is_file():
            raise SpecsimError(
                "profile not found", file=profiles[i], key="--profile", fix="check the path"
            )
        extra = _drafter_overrides(overrides, profile, name)
        plan = window.prepare(scenario_path, extra, ks, loads, seed)
        plan.adaptive = False
        plans.append(DrafterPlan(name, profile, plan))
    for name, tree in tree_drafters:
        profile = str(Path(profiles[0]).resolve()) if profiles else None
        extra = _drafter_overrides(overrides, profile, name)
        plan = _tree_plan(scenario_path, extra, loads, seed, (name, tree), tree_drafts)
        plans.append(DrafterPlan(tree_label(name, tree), profile, plan, tree, name))
    # One grid for all: the k values every chain drafter can answer, the same loads.
    chains = [p for p in plans if p.tree is None] or plans
    ks = (
        chains[0].plan.ks
        if ks is not None
        else sorted(set.intersection(*(set(p.plan.ks) for p in chains)))
    )
    for p in chains:
        p.plan.ks = ks
    return SwapPlan(
        scenario_path=str(scenario_path),
        base_overrides=list(overrides),
        drafters=plans,
        loads=plans[0].plan.loads,
        ks=ks,
        seed=plans[0].plan.seed,
    )


def _checked_options(drafters, tree_drafters, profiles: list[str], ks) -> list[str]:
    """The options refused before any plan (with why and the fix), and the profile of each
    chain drafter (none given: the scenario's, an empty list)."""
    labels = [*drafters, *(tree_label(name, tree) for name, tree in tree_drafters)]
    if len(labels) < 2 or len(set(labels)) != len(labels):
        raise SpecsimError(
            "a drafter swap needs at least two different drafters",
            key="--drafter",
            fix="give --drafter A --drafter B (or a drafter and a --tree-drafter NAME=SHAPE)",
        )
    if tree_drafters and len(profiles) > 1:
        raise SpecsimError(
            "with --tree-drafter, one --profile serves every drafter",
            key="--profile",
            fix="give one --profile (or none: the scenario's)",
        )
    if len(profiles) not in (0, 1, len(drafters)):
        raise SpecsimError(
            f"{len(profiles)} --profile options for {len(drafters)} drafters",
            key="--profile",
            fix="give one profile for all drafters, or one per drafter in the same order",
        )
    if len(profiles) == 1:
        profiles = profiles * len(drafters)
    if ks is not None and max(ks) == 0:
        raise SpecsimError(
            "with k = 0 only, no drafter is ever used, so there is nothing to compare",
            key="--k",
            fix="include some k above 0, e.g. --k 0..4",
        )
    return profiles


def _tree_plan(scenario_path, extra, loads, seed, named_tree, tree_drafts):
    """A tree drafter's grid: its tree at k = 0's loads; a refusal names the drafter."""
    name, tree = named_tree
    try:
        plan = window.prepare(
            scenario_path, extra, [0], loads, seed, False, [tree], None, tree_drafts
        )
    except SpecsimError as exc:
        where = f"{exc.key}: " if exc.key else ""
        raise SpecsimError(
            f"{name}={tree.text}: {where}{exc.message}",
            file=exc.file,
            key="--tree-drafter",
            fix=exc.fix,
        ) from None
    plan.adaptive = False
    return plan


def _drafter_overrides(overrides: Sequence[str], profile: str | None, name: str) -> list[str]:
    """A drafter's grid: the scenario's overrides, its profile (None: the scenario's), itself."""
    return [*overrides, *([f"profile={profile}"] if profile else []), f"speculation.drafter={name}"]


def tree_label(name: str, tree: TreeCandidate) -> str:
    return f"{name} tree {tree.text}"


def run(plan: SwapPlan, sweeper: Sweeper) -> dict[str, Any]:
    points = [p for d in plan.drafters for p in _tagged(d)]
    results = sweeper.run(points, desc="drafter swap")
    per_drafter: dict[str, list[window.LoadResult]] = {}
    for d in plan.drafters:
        mine = [r for r in results if r.tags["drafter"] == d.name]
        per_drafter[d.name] = window.analyse(d.plan, mine)
    return {"per_drafter": per_drafter, **recommend(plan, per_drafter)}


def _tagged(d: DrafterPlan):
    for point in d.plan.grid():
        yield type(point)(point.scenario, point.overrides, {**point.tags, "drafter": d.name})


def recommend(plan: SwapPlan, per_drafter: dict[str, list[window.LoadResult]]) -> dict[str, Any]:
    """Winner per load (the drafters at their best k), then the overall recommendation."""
    use_slo = plan.first.use_slo
    winners = []
    for i, load in enumerate(plan.loads):
        candidates = [(d.name, per_drafter[d.name][i].best_setting) for d in plan.drafters]
        winners.append({"load": load, "drafter": choose(candidates, use_slo)})
    wins = {d.name: sum(w["drafter"] == d.name for w in winners) for d in plan.drafters}

    def mean_e2e(name: str) -> float:
        values = [metric(e.best_setting, "e2e_s", "mean") for e in per_drafter[name]]
        values = [v for v in values if v is not None]
        return statistics.fmean(values) if values else float("inf")

    order = sorted(plan.drafters, key=lambda d: (-wins[d.name], mean_e2e(d.name)))
    best = order[0].name
    worse = regressions_of_best(plan, per_drafter, best)
    return {
        "winners": winners,
        "wins": wins,
        "recommended": best,
        "reasons": reasons(plan, per_drafter, best, winners) + regression_sentences(best, worse),
        "regressions": worse,
    }


def regressions_of_best(plan: SwapPlan, per_drafter, best: str) -> list[dict[str, Any]]:
    """Every compared metric that is worse with ``best`` (at its best k, load by load) than with
    each other drafter at its best k, and than with speculation off."""
    mine = per_drafter[best]
    out = []
    for other in [d.name for d in plan.drafters if d.name != best]:
        pairs = [
            (e.load, e.best_setting, theirs.best_setting)
            for e, theirs in zip(mine, per_drafter[other], strict=True)
        ]
        out.append({"against": other, "metrics": across_loads(pairs)})
    pairs = [(e.load, e.best_setting, e.summary("k=0")) for e in mine]
    out.append({"against": OFF, "metrics": across_loads(pairs)})
    return out


def regression_sentences(best: str, worse: list[dict[str, Any]]) -> list[str]:
    """One sentence per comparison: what is worse with ``best``, or that nothing is."""
    out = []
    for item in worse:
        against = item["against"]
        than = "speculation off" if against == OFF else against
        subject = f"{best} at its best k" if against == OFF else best
        if item["metrics"]:
            out.append(
                f"Worse with {subject} than with {than}: {across_loads_text(item['metrics'])}."
            )
        else:
            out.append(f"No compared metric is worse with {subject} than with {than} at any load.")
    return out


def _ratio_median(per_drafter, a: str, b: str, name: str, stat: str | None) -> float | None:
    """Median over loads of metric(b) / metric(a) at each drafter's best k."""
    ratios = []
    for ea, eb in zip(per_drafter[a], per_drafter[b], strict=True):
        va, vb = metric(ea.best_setting, name, stat), metric(eb.best_setting, name, stat)
        if va and vb:
            ratios.append(vb / va)
    return statistics.median(ratios) if ratios else None


def reasons(plan: SwapPlan, per_drafter, best: str, winners) -> list[str]:
    """Short sentences behind the recommendation, one per comparison that matters."""
    out = []
    n = len(plan.loads)
    axis = plan.first.axis
    won = [w["load"] for w in winners if w["drafter"] == best]
    out.append(f"{best} is best at {len(won)} of {n} loads.")
    for other in [d.name for d in plan.drafters if d.name != best]:
        parts = []
        for label, name, stat in (
            ("mean end-to-end latency", "e2e_s", "mean"),
            ("p99 end-to-end latency", "e2e_s", "p99"),
            ("p99 TPOT", "tpot_s", "p99"),
            ("cost per million tokens", "cost_usd_per_million_tokens", None),
        ):
            ratio = _ratio_median(per_drafter, best, other, name, stat)
            if ratio is not None and abs(ratio - 1) >= 0.005:
                word = "higher" if ratio > 1 else "lower"
                parts.append(f"{label} {abs(ratio - 1):.0%} {word}")
        if parts:
            out.append(f"With {other} instead (median over loads): " + ", ".join(parts) + ".")
        theirs = [w["load"] for w in winners if w["drafter"] == other]
        if theirs:
            out.append(f"{other} is better at {', '.join(axis.fmt(x) for x in theirs)}.")
    wasted = {
        d: statistics.median(
            [
                v
                for e in per_drafter[d]
                if (v := metric(e.best_setting, "flops_wasted_fraction")) is not None
            ]
            or [float("nan")]
        )
        for d in per_drafter
    }
    for d in plan.drafters:
        if d.tree is not None and d.plan.trees_from_chain:
            out.append(f"{d.name}: its tree is never chosen: {FROM_CHAIN}.")
    out.append(
        "Wasted FLOPs at the best k (median over loads): "
        + ", ".join(f"{d} {w:.0%}" for d, w in wasted.items() if w == w)
        + "."
    )
    return out


def json_summary(plan: SwapPlan, outcome: dict[str, Any], sweeper: Sweeper) -> dict[str, Any]:
    drafters = []
    for d in plan.drafters:
        loads = outcome["per_drafter"][d.name]
        drafters.append(
            {
                "drafter": d.name,
                "profile": d.profile_path or str(d.plan.profile.path),
                "verifier": d.plan.scenario.speculation.verifier,
                "lossy": d.lossy,
                "tv_distance": d.tv_distance,
                "best_k": [{"load": e.load, "k": d.best_window(e)} for e in loads],
                "crossover_load": window.crossover(loads)["load"],
                "mean_acceptance_length_by_k": {
                    str(k): metric(loads[0].summary(f"k={k}"), "mean_acceptance_length")
                    for k in d.plan.ks
                    if k > 0
                },
            }
        )
        if d.tree is not None:
            drafters[-1]["drafter"] = d.drafter_name
            drafters[-1]["label"] = d.name
            drafters[-1]["tree"] = {**d.tree.json(), "drafts": d.plan.tree_drafts}
            drafters[-1]["best"] = [{"load": e.load, "config": e.best_config} for e in loads]
            drafters[-1]["crossover_load"] = window.off_from(loads, lambda e: e.best_config, "k=0")
            drafters[-1]["mean_acceptance_length_tree"] = metric(
                loads[0].summary(d.tree.config), "mean_acceptance_length"
            )
    return {
        "command": "report drafter-swap",
        "scenario": plan.scenario_path,
        "load_axis": plan.first.axis.kind,
        "loads": plan.loads,
        "k_values": plan.ks,
        "drafters": drafters,
        "winner_per_load": outcome["winners"],
        "recommendation": {
            "drafter": outcome["recommended"],
            "reasons": outcome["reasons"],
            "regressions": outcome["regressions"],
        },
        **sweeper.stats.json(),
    }
