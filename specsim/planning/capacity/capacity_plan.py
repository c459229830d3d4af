"""What ``plan capacity`` searches: its candidates (speculation off, every (drafter, k) asked
for and each drafter's adaptive policy, on each deployment) and the checked plan.

``prepare`` refuses what no search can answer (a closed loop, no SLO or one on TPOT alone, a
target no fleet within the bounds reaches) before anything runs or is written, and leaves out
the candidates that do not fit: on a deployment, weights that leave no KV cache; on any, a
cache too small for the workload's longest request (``specsim.simulation.fits``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from specsim.bounds import MAX_REPLICAS
from specsim.errors import SpecsimError
from specsim.planning.capacity.capacity_deploy import Deployment
from specsim.planning.common import (
    answerable_k,
    check_k_values,
    check_loads,
    load_axis,
    scenario_identity,
    switch_overrides,
    without_pools,
)
from specsim.planning.rates import ArrivalScale
from specsim.planning.sweep.points import SweepPoint

RANGE_FACTOR = 1024.0  # the search looks between start / 1024 and start * 1024
OFF = "speculation off"


@dataclass(frozen=True)
class Candidate:
    label: str
    drafter: str | None
    k: int
    policy: str = "fixed"
    deployment: Deployment | None = None  # None: the scenario's own profile
    extra: tuple[str, ...] = ()  # what else its policy sets (a k-by-batch table)

    def overrides(self) -> list[str]:
        placed = self.deployment.overrides() if self.deployment is not None else []
        if self.drafter is None:
            # No drafter at all: its weights would otherwise take KV-cache memory.
            return [
                *placed,
                "speculation.drafter=null",
                "speculation.k=0",
                "speculation.policy=fixed",
            ]
        return [
            *placed,
            f"speculation.drafter={self.drafter}",
            f"speculation.k={self.k}",
            f"speculation.policy={self.policy}",
            *self.extra,
        ]

    @property
    def tp(self) -> int:
        return 1 if self.deployment is None else self.deployment.tp

    @property
    def devices(self) -> int:
        """Devices one replica of this candidate takes (what its price pays for)."""
        return 1 if self.deployment is None else self.deployment.devices

    def profile(self, plan: CapacityPlan):
        return plan.profile if self.deployment is None else self.deployment.profile


@dataclass
class CapacityPlan:
    scenario_path: str
    base_overrides: list[str]
    scenario: Any
    profile: Any
    target_rps: float
    candidates: list[Candidate]
    tolerance: float
    attainment: float
    seed: int
    scale: ArrivalScale
    # Searched over several deployments (TP, precision); empty: the scenario's profile only.
    deployments: list[Deployment] = field(default_factory=list)
    # (candidate label, why it does not fit: its weights leave no KV cache, or one too small
    # for the workload's longest request) for candidates left out.
    unfit: list[tuple[str, str]] = field(default_factory=list)
    # ``--policies`` (``capacity_policies``): the policies compared, and the candidates run
    # for them after the search above (the k-by-batch tables join once it has run).
    policies: tuple[str, ...] = ()
    policy_candidates: list[Candidate] = field(default_factory=list)

    def identity(self) -> dict[str, Any]:
        identity = {
            "command": "plan capacity",
            **scenario_identity(self.scenario_path, self.base_overrides),
            "target_rps": self.target_rps,
            "candidates": [c.label for c in self.candidates],
            "tolerance": self.tolerance,
            "attainment": self.attainment,
            "seed": self.seed,
        }
        if self.deployments:
            identity["deployments"] = [d.identity() for d in self.deployments]
        if self.policies:
            identity["policies"] = list(self.policies)
        return identity

    def point(self, candidate: Candidate, knob: float, extra: Sequence[str] = ()) -> SweepPoint:
        """A simulation of ``candidate`` at load ``knob`` (an arrival rate or a trace speed)."""
        overrides = [
            *self.base_overrides,
            f"seed={self.seed}",
            *candidate.overrides(),
            *switch_overrides(self.scenario.speculation, candidate.policy),
            *self.scale.axis.overrides(knob),
            *extra,
        ]
        return SweepPoint.make(self.scenario_path, overrides, candidate=candidate.label, knob=knob)


def prepare(
    scenario_path: str,
    overrides: Sequence[str],
    target_rps: float,
    drafters: list[str] | None,
    ks: list[int] | None,
    tolerance: float,
    attainment: float,
    seed: int | None,
    deployments: list[Deployment] | None = None,
) -> CapacityPlan:
    from specsim.profile import load_profile
    from specsim.scenario import load_scenario

    scenario = load_scenario(scenario_path, list(overrides))
    # Capacity is per replica: pools go, one replica is searched, the fleet check sets its size.
    overrides = [*overrides, *without_pools(scenario), "fleet.replicas=1"]
    scenario = load_scenario(scenario_path, overrides)
    axis = load_axis(scenario)
    _check_question(scenario, scenario_path, axis, target_rps, (tolerance, attainment))
    profile = load_profile(scenario.resolve(scenario.profile))
    spec = scenario.speculation
    drafters = drafters or ([spec.drafter] if spec.drafter else [])
    if deployments:
        places = [(d.profile, d) for d in deployments if d.fits]

        def misfit(c: Candidate) -> str | None:
            return memory_misfit(c, scenario) or length_misfit(c, scenario_path, overrides)
    else:
        places = [(profile, None)]

        def misfit(c: Candidate) -> str | None:
            return plain_length_misfit(c, profile, scenario_path, overrides)

    candidates, unfit = _fitting(places, spec, drafters, ks, misfit)
    _check_some_fit(candidates, unfit, deployments, scenario_path)
    scale = ArrivalScale.for_scenario(scenario, axis)
    seed = scenario.seed if seed is None else seed
    check_target(scenario_path, overrides, scale, target_rps, seed)
    return CapacityPlan(
        scenario_path=str(scenario_path),
        base_overrides=list(overrides),
        scenario=scenario,
        profile=profile,
        target_rps=float(target_rps),
        candidates=candidates,
        tolerance=tolerance,
        attainment=attainment,
        seed=seed,
        scale=scale,
        deployments=list(deployments or []),
        unfit=unfit,
    )


def _check_question(scenario, scenario_path: str, axis, target_rps: float, bounds) -> None:
    """Refuse a question capacity cannot answer: a closed loop, no SLO or one on TPOT alone,
    a target rate, tolerance or attainment out of range."""
    tolerance, attainment = bounds
    if axis.kind == "concurrency":
        raise SpecsimError(
            "capacity is an arrival rate, but a closed loop has none (its clients wait for "
            "each other)",
            file=scenario_path,
            key="workload.kind",
            fix="use an open-loop workload or a trace, e.g. --set workload.kind=poisson "
            "--set workload.rate=1",
        )
    if scenario.slo is None:
        raise SpecsimError(
            "capacity within the SLO needs an SLO",
            file=scenario_path,
            key="slo",
            fix="add an slo section or e.g. --set slo.tpot_s=0.05",
        )
    if set(scenario.slo.limits()) == {"tpot_s"}:
        raise SpecsimError(
            "an SLO on TPOT alone does not bound queueing, so an overloaded replica would "
            "still meet it",
            file=scenario_path,
            key="slo",
            fix="add slo.ttft_s, slo.e2e_s or slo.queueing_s",
        )
    if not (math.isfinite(target_rps) and target_rps > 0):
        raise SpecsimError(
            f"target rate must be positive (got {target_rps:g})",
            key="--target-rps",
            fix="give requests per second above 0",
        )
    if not 0 < tolerance < 0.5:
        raise SpecsimError("tolerance must be in (0, 0.5)", key="--tolerance", fix="e.g. 0.02")
    if not 0 < attainment <= 1:
        raise SpecsimError("attainment must be in (0, 1]", key="--attainment", fix="e.g. 0.99")


def _fitting(places, spec, drafters, ks, misfit) -> tuple[list, list]:
    """The candidates at each place (profile, deployment) that fit, and (label, why) of those
    that do not."""
    candidates, unfit = [], []
    for where, deployment in places:
        for candidate in speculation_candidates(where, spec, drafters, ks, deployment):
            reason = misfit(candidate)
            if reason is None:
                candidates.append(candidate)
            else:
                unfit.append((candidate.label, reason))
    return candidates, unfit


def _check_some_fit(candidates, unfit, deployments, scenario_path: str) -> None:
    """Refuse a plan where no candidate (or no deployment) fits, saying why each does not."""
    if not candidates and not deployments:
        raise SpecsimError(
            "no candidate fits: " + "; ".join(f"{label}: {why}" for label, why in unfit),
            file=scenario_path,
            key="workload",
            fix="shorten the workload's longest request or give the replica more KV-cache "
            "memory (engine.memory_utilisation, a larger device)",
        )
    if not candidates:
        reasons = [(d.label, d.reason) for d in deployments if not d.fits] + unfit
        raise SpecsimError(
            "no deployment fits: " + "; ".join(f"{label}: {why}" for label, why in reasons),
            key="--tp",
            fix="give more devices per replica (--tp), smaller formats (--precision) or a "
            "device with more memory",
        )


def speculation_candidates(
    profile, spec, drafters: list[str], ks: list[int] | None, deployment: Deployment | None = None
) -> list[Candidate]:
    """Speculation off, each drafter's k values and its adaptive policy, on one profile."""
    prefix = "" if deployment is None else f"{deployment.label}, "
    candidates = [Candidate(prefix + OFF, None, 0, deployment=deployment)]
    for drafter in drafters:
        profile.drafter(drafter)
        settings = spec.model_copy(update={"drafter": drafter})
        limit = answerable_k(profile, settings)
        chosen = ks if ks is not None else list(range(1, min(8, limit) + 1))
        check_k_values(chosen, limit, drafter, profile.path)
        for k in [k for k in chosen if k > 0]:
            label = f"{prefix}{drafter} k={k}"
            candidates.append(Candidate(label, drafter, k, "fixed", deployment))
        if chosen and max(chosen) > 0:
            label = f"{prefix}{drafter} adaptive"
            candidates.append(Candidate(label, drafter, max(chosen), "adaptive", deployment))
    return candidates


def memory_misfit(candidate: Candidate, scenario) -> str | None:
    """Why ``candidate``'s weights leave no KV cache on its deployment's devices (None: they
    leave one)."""
    from specsim.costs import kv_capacity_tokens

    engine = scenario.engine.model_copy(update={"tensor_parallel_size": candidate.tp})
    profile = candidate.deployment.profile
    try:
        kv_capacity_tokens(profile, candidate.drafter, candidate.drafter is not None, engine)
    except SpecsimError as exc:
        return exc.message
    return None


def length_misfit(
    candidate: Candidate, scenario_path: str, overrides: Sequence[str], profile=None
) -> str | None:
    """Why the workload's longest request never fits ``candidate``'s KV cache (the simulator's
    admission rule, ``specsim.simulation.fits``), or None. ``profile``: the candidate's own when
    it has no deployment."""
    from specsim.scenario import load_scenario
    from specsim.simulation.fits import longest_request_misfit

    scenario = load_scenario(scenario_path, [*overrides, *candidate.overrides()])
    return longest_request_misfit(scenario, profile or candidate.deployment.profile)


def plain_length_misfit(
    candidate: Candidate, profile, scenario_path: str, overrides: Sequence[str]
) -> str | None:
    """``length_misfit`` on the scenario's own profile. A cache that cannot be sized at all
    (weights that leave none, a profile without KV bytes) is left to the runs to report, as
    before: only a too-small cache is a misfit here."""
    try:
        return length_misfit(candidate, scenario_path, overrides, profile)
    except SpecsimError:
        return None


def check_target(
    scenario_path: str, overrides: Sequence[str], scale: ArrivalScale, target_rps: float, seed: int
) -> None:
    """A target no fleet within the bounds reaches is refused before any simulation (and so
    before anything is written): one replica must run at the target's load (the fleet check
    offers it), and the search's highest rate times ``MAX_REPLICAS`` must reach it."""
    knob = scale.knob(target_rps)  # a trace too short for the target fails here
    check_loads(scenario_path, overrides, scale.axis, [knob], seed, option="--target-rps")
    top = scale.rate(scale.axis.base * RANGE_FACTOR)
    if target_rps > MAX_REPLICAS * top:
        raise SpecsimError(
            f"{target_rps:g} req/s needs more than {MAX_REPLICAS:,} replicas even at "
            f"{top:.4g} req/s each, the highest rate the search tries per replica",
            key="--target-rps",
            fix="lower --target-rps, or raise the scenario's own load (the search spans "
            f"1/{RANGE_FACTOR:g} to {RANGE_FACTOR:g} times it)",
        )
