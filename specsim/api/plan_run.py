"""The planner's runs, as the CLI and the API share them: ``plan window``, ``plan capacity`` and
``report drafter-swap`` call the ``*_run`` functions below and ``write_plan``, so a PlanResult
holds what the command writes. Without ``out`` a sweep keeps its points in a temporary folder,
removed afterwards (nothing to resume from); with ``out`` it writes everything the command
writes, and a rerun with the same ``out`` computes only what is missing.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specsim.api.overrides import override_texts
from specsim.api.results import SUMMARY, PlanResult, plan_result
from specsim.errors import SpecsimError
from specsim.fileio import atomic_output_dir, check_output_folder, dump_json
from specsim.planning.capacity import capacity, capacity_policies, capacity_report
from specsim.planning.capacity.capacity_deploy import DeploymentRequest, write_built
from specsim.planning.common import check_loads
from specsim.planning.emit import emit as engine_files
from specsim.planning.emit import emit_choice
from specsim.planning.emit.emit import EmitRequest
from specsim.planning.report import Report, write_report
from specsim.planning.swap import swap, swap_policies, swap_report
from specsim.planning.sweep.cluster import ClusterTls
from specsim.planning.sweep.sweeper import Sweeper
from specsim.planning.window import window, window_report

# Varies between runs (how many simulations a rerun reused), so summary.json leaves it out.
SIMULATIONS = "simulations"


@dataclass(frozen=True)
class SweepOptions:
    """Where a sweep runs: ``workers`` local processes (default: the CPUs available), or the
    Dask scheduler at ``cluster`` (with ``cluster_tls``); a progress bar on a terminal."""

    workers: int | None = None
    cluster: str | None = None
    cluster_tls: ClusterTls | None = None
    progress: bool = True

    def sweeper(self, out: str | Path, identity: dict[str, Any]) -> Sweeper:
        return Sweeper(
            out,
            identity,
            workers=self.workers,
            cluster=self.cluster,
            cluster_tls=self.cluster_tls or ClusterTls(),
            progress=self.progress,
        )


@dataclass
class Planned:
    """A finished sweep: the validated plan, the summary (with ``simulations``) and the report."""

    plan: Any
    summary: dict[str, Any]
    report: Report

    def stored(self) -> dict[str, Any]:
        """summary.json's dict: the summary without the counts that vary between reruns."""
        return {key: value for key, value in self.summary.items() if key != SIMULATIONS}


def window_run(
    scenario: str,
    overrides: Sequence[str],
    ks: list[int] | None,
    loads: list[float] | None,
    seed: int | None,
    out: str | Path,
    options: SweepOptions,
    emit: EmitRequest | None = None,
    screen: bool | None = None,
    trees: list | None = None,
    space=None,
    tree_drafts: str | None = None,
    policies: Sequence[str] = (),
) -> Planned:
    """``plan window``'s sweep into ``out`` (its points and sweep.json), and its report;
    ``screen``, ``trees``, ``space``, ``tree_drafts`` and ``policies`` as ``window.prepare``
    takes them (screen None: screened above ``SCREEN_FROM`` points)."""
    plan = window.prepare(
        scenario, overrides, ks, loads, seed, screen, trees, space, tree_drafts, policies
    )
    check_loads(plan.scenario_path, plan.base_overrides, plan.axis, plan.loads, plan.seed)
    engine_files.check_models(emit, [plan.profile])
    return _swept(plan, window, window_report, emit_choice.window_choice, out, options, emit)


def capacity_run(
    scenario: str,
    overrides: Sequence[str],
    target_rps: float,
    drafters: list[str] | None,
    ks: list[int] | None,
    tolerance: float,
    attainment: float,
    seed: int | None,
    out: str | Path,
    options: SweepOptions,
    emit: EmitRequest | None = None,
    deployments: DeploymentRequest | None = None,
    policies: Sequence[str] = (),
) -> Planned:
    """``plan capacity``'s searches into ``out``, and its report; ``deployments``: the TP and
    precision choices searched (None: the scenario's profile only); ``policies``: the window
    policies compared (``capacity_policies``; checked names, as ``compared_policies`` gives)."""
    built = None if deployments is None else deployments.build(Path(out))
    plan = capacity.prepare(
        scenario, overrides, target_rps, drafters, ks, tolerance, attainment, seed, built
    )
    capacity_policies.add(plan, tuple(policies))
    engine_files.check_models(emit, [plan.profile, *(d.profile for d in built or [] if d.fits)])
    write_built(plan.deployments)
    command, report = (capacity_policies,) * 2 if plan.policies else (capacity, capacity_report)
    return _swept(plan, command, report, emit_choice.capacity_choice, out, options, emit)


def swap_run(
    scenario: str,
    overrides: Sequence[str],
    drafters: list[str],
    profiles: list[str] | None,
    ks: list[int] | None,
    loads: list[float] | None,
    seed: int | None,
    out: str | Path,
    options: SweepOptions,
    emit: EmitRequest | None = None,
    tree_drafters: list | None = None,
    tree_drafts: str | None = None,
    policies: Sequence[str] = (),
) -> Planned:
    """``report drafter-swap``'s sweep into ``out``, and its report (``tree_drafters``: (name,
    TreeCandidate) pairs, as ``--tree-drafter``; ``policies``: the window policies compared,
    ``swap_policies``)."""
    plan = swap.prepare(
        scenario, overrides, drafters, profiles, ks, loads, seed, tree_drafters, tree_drafts
    )
    swap_policies.add(plan, tuple(policies))
    for drafter in plan.drafters:
        p = drafter.plan
        check_loads(p.scenario_path, p.base_overrides, p.axis, p.loads, p.seed)
    engine_files.check_models(emit, [d.plan.profile for d in plan.drafters])
    command, report = (swap_policies,) * 2 if plan.policies else (swap, swap_report)
    return _swept(plan, command, report, emit_choice.swap_choice, out, options, emit)


def _swept(plan, command, report, choice, out, options: SweepOptions, emit) -> Planned:
    """Run a prepared plan's sweep into ``out`` (``command``: the planning module's ``run`` and
    ``json_summary``), build its report, and attach the engines' files for its ``choice``."""
    with options.sweeper(out, plan.identity()) as sweeper:
        outcome = command.run(plan, sweeper)
        summary = command.json_summary(plan, outcome, sweeper)
    planned = Planned(plan, summary, report.build(plan, outcome, summary))
    if emit is not None:  # the engines' files join the report's attachments
        engine_files.attach(planned, choice(plan, outcome), emit)
    return planned


def write_plan(out: str | Path, planned: Planned) -> None:
    """The report's files and summary.json, into ``out`` atomically (beside its points)."""
    with atomic_output_dir(out) as staging:
        write_report(planned.report, staging)
        (staging / SUMMARY).write_text(dump_json(planned.stored()), encoding="utf-8")
    engine_files.remove_stale(out, planned.summary)


def run_planner(
    run: Callable[..., Any],
    scenario: Any,
    out: str | os.PathLike | None,
    options: SweepOptions,
    overrides: dict[str, Any],
    *,
    write: Callable[[str | os.PathLike, Any], None] = write_plan,
    result: Callable[[Any, Path | None], PlanResult] | None = None,
    **arguments: Any,
) -> PlanResult:
    """A planner command from the API (``plan_disaggregated`` too): ``run``, a ``*_run``
    function, into ``out`` with its files written there by ``write``, or into a temporary
    folder without ``out``; ``result`` makes the PlanResult (default: from a ``Planned``)."""
    if not isinstance(scenario, (str, os.PathLike)):
        raise TypeError(
            "a plan needs the scenario's file, which its simulations load (in worker processes "
            f"too), not a {type(scenario).__name__}: pass the path, and changes as overrides"
        )
    result = result or _result
    path = os.fspath(scenario)
    texts = override_texts(overrides)
    if out is None:
        with tempfile.TemporaryDirectory(prefix="specsim-plan-") as folder:
            planned = run(path, texts, out=Path(folder) / "sweep", options=options, **arguments)
        refuse_all_failed(planned.summary)
        return result(planned, None)
    check_output_folder(out, "out")
    planned = run(path, texts, out=Path(out), options=options, **arguments)
    refuse_all_failed(planned.summary)
    write(out, planned)
    return result(planned, Path(out))


def refuse_all_failed(summary: dict) -> None:
    """A sweep of which no simulation succeeded has no result: its tables would be empty, so
    it is refused (exit 2, no report written; the points stay for a rerun) with the first
    failure's reason, which is usually the input's fault."""
    failed, sims = summary["failed"], summary.get("simulations") or {}
    if not failed or len(failed) < sims.get("computed", 0) + sims.get("cached", 0):
        return
    reason, _, fix = failed[0]["error"].partition("; fix: ")
    raise SpecsimError(
        f"all {len(failed)} simulations failed, the first ({' '.join(failed[0]['overrides'])}) "
        f"with: {reason}",
        fix=fix or "correct what the error names and run again",
    )


def _result(planned: Planned, out: Path | None) -> PlanResult:
    result = plan_result(planned.stored(), planned.report, out)
    result.simulations = planned.summary.get(SIMULATIONS)
    return result
