"""The deployments ``plan capacity --disaggregated`` searches, and the headroom of its choices.

The deployments (TP x precision) are ``capacity_deploy``'s, built by the same request as a
co-located plan's. A co-located layout runs on one of them; a prefill/decode layout on a pair,
whose pools may differ in TP but share a precision: the KV cache crosses the link in the format
the prefill replica wrote it, and the engines load one checkpoint on both sides. A deployment
that cannot serve a role is left out of that role with its reason: the prefill pool runs
speculation off, the decode pool and a co-located replica the setting searched.

A search stops at the cheapest layout that holds the SLO at the target rate (``disagg``). How far
above the target that layout still holds it is found as the co-located plan finds a replica's
capacity: a ``Bisection`` on the load knob from the target up, to ``--tolerance``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specsim.planning.capacity.capacity_deploy import Deployment
from specsim.planning.capacity.capacity_plan import Candidate, length_misfit, memory_misfit
from specsim.planning.sweep.search import Bisection

HEADROOM_LIMIT = 8.0  # a choice's capacity is searched up to 8 x the target's load


@dataclass(frozen=True)
class Fit:
    """Which deployments serve which role, per speculation setting, and why the others do not."""

    # (role, setting) -> labels of the deployments that serve it
    serving: dict[tuple[str, str], list[str]]
    unfit: list[tuple[str, str]]  # (what, why): a deployment, or a deployment in a role


def role_fits(
    deployments: list[Deployment],
    scenario,
    scenario_path: str,
    overrides: Sequence[str],
    settings: dict[str, bool],
) -> Fit:
    """Check every built deployment in every role. ``settings``: whether each speculation
    setting speculates; the one that does not is also what a prefill replica runs.
    ``overrides``: the scenario's as one co-located replica (no split), as a capacity search
    checks a candidate."""
    unfit = [(d.label, d.reason) for d in deployments if not d.fits]
    serving: dict[tuple[str, str], list[str]] = {}
    spec = scenario.speculation
    for setting, speculating in settings.items():
        off = not speculating
        for d in (d for d in deployments if d.fits):
            if not off:
                d.profile.drafter(spec.drafter)  # a drafter the deployment lacks is an error
            candidate = (
                Candidate(d.label, None, 0, deployment=d)
                if off
                else Candidate(d.label, spec.drafter, spec.k, spec.policy, d)
            )
            reason = memory_misfit(candidate, scenario)
            if reason is not None:
                unfit.append((f"{d.label}, {setting}", reason))
                continue
            # A prefill replica holds a prompt, not its output: it may serve that role alone.
            prefill = off and prompt_misfit(candidate, scenario_path, overrides) is None
            roles = ["prefill"] if prefill else []
            whole = length_misfit(candidate, scenario_path, overrides)
            if whole is None:
                roles += ["co-located", "decode"]
            else:
                only = " (it serves the prefill pool only)" if prefill else ""
                unfit.append((f"{d.label}, {setting}", whole + only))
            for role in roles:
                serving.setdefault((role, setting), []).append(d.label)
    return Fit(serving, unfit)


def prompt_misfit(candidate: Candidate, scenario_path: str, overrides: Sequence[str]) -> str | None:
    """Why the workload's longest prompt never fits ``candidate``'s KV cache as a prefill
    replica (``specsim.simulation.fits``), or None."""
    from specsim.scenario import load_scenario
    from specsim.simulation.fits import longest_prompt_misfit

    scenario = load_scenario(scenario_path, [*overrides, *candidate.overrides()])
    return longest_prompt_misfit(scenario, candidate.deployment.profile)


def pairs(
    prefill: list[str], decode: list[str], by_label: dict[str, Deployment]
) -> list[tuple[str, str]]:
    """Every (prefill, decode) pair of one precision."""
    return [
        (p, d) for p in prefill for d in decode if by_label[p].precision == by_label[d].precision
    ]


def deployment_overrides(prefill: Deployment | None, decode: Deployment | None) -> list[str]:
    """What a layout on these deployments changes in the scenario: a co-located replica's
    profile and TP (``prefill`` None), or each pool's. The scenario's own profile follows the
    decode pool's, so its TP and target agree with the pools'."""
    if decode is None:
        return []
    placed = decode.overrides()
    if prefill is None:
        return placed
    for name, d in (("prefill", prefill), ("decode", decode)):
        placed += [
            f"fleet.disaggregation.{name}.profile={Path(d.profile.path).resolve()}",
            f"fleet.disaggregation.{name}.tensor_parallel_size={d.tp}",
        ]
    return placed


@dataclass
class Headroom:
    """The highest load a chosen layout sustains, searched upwards from the target's."""

    search: Bisection
    error: str | None = None

    @classmethod
    def above(cls, target_knob: float, tolerance: float) -> Headroom:
        search = Bisection(
            start=target_knob,
            rel_tol=tolerance,
            lower_limit=target_knob,
            upper_limit=target_knob * HEADROOM_LIMIT,
        )
        search.record(target_knob, True)  # the search chose the layout for holding it there
        return cls(search)

    @property
    def done(self) -> bool:
        return self.search.done or self.error is not None

    def figures(self, scale, target_rps: float) -> dict[str, Any]:
        """capacity_rps (the highest sustained rate), its bracket, the search's status and the
        headroom over the target (capacity / target - 1)."""
        lo, hi = self.search.lo, self.search.hi
        capacity = None if lo is None else scale.rate(lo)
        return {
            "capacity_rps": capacity,
            "bracket_rps": [capacity, None if hi is None else scale.rate(hi)],
            "status": "failed" if self.error else self.search.status,
            "error": self.error,
            "probes": len(self.search.probes) - 1,  # the target's own run is the choice's
            "headroom": None if capacity is None else capacity / target_rps - 1,
        }
