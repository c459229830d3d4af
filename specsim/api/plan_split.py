"""``plan_disaggregated``: ``specsim plan capacity --disaggregated`` as a function, and the run
the command and the function share (so the function's summary equals the command's file)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specsim.api.results import PlanResult, read_table
from specsim.planning.capacity import disagg, disagg_report, disagg_search
from specsim.planning.capacity.capacity_deploy import DeploymentRequest, write_built
from specsim.planning.capacity.disagg_pareto import pareto_csv
from specsim.planning.emit import emit as engine_files
from specsim.planning.emit import emit_split
from specsim.planning.emit.emit import EmitRequest
from specsim.planning.sweep.cluster import ClusterTls


@dataclass
class SplitPlanned:
    """A finished disaggregated sizing: the plan, its searches and summary.json's dict."""

    plan: disagg.DisaggregatedPlan
    searches: list[disagg.Search]
    summary: dict[str, Any]
    attachments: dict[str, str] = field(default_factory=dict)  # --emit's files (engine/...)

    def tables(self) -> dict[str, str]:
        """The CSV files the command writes, by stem."""
        return {
            "layouts": disagg_report.layouts_csv(self.plan, self.searches),
            "candidates": disagg_report.candidates_csv(self.summary),
            "pareto": pareto_csv(self.summary["pareto"]),
        }


def disaggregated_run(
    scenario: str,
    overrides: Sequence[str],
    target_rps: float,
    tolerance: float,
    attainment: float,
    max_replicas: int,
    seed: int | None,
    out: str | Path,
    options,
    deployments: DeploymentRequest | None = None,
    emit: EmitRequest | None = None,
) -> SplitPlanned:
    """The searches into ``out`` (its points, and the deployments' built profiles); with
    ``emit``, each pool's engine files for the chosen split layout."""
    overrides = [*overrides, *([f"seed={seed}"] if seed is not None else [])]
    built = None if deployments is None else deployments.build(Path(out))
    plan = disagg.prepare(
        scenario, overrides, target_rps, attainment, max_replicas, tolerance, built
    )
    engine_files.check_models(emit, _profiles(plan))
    write_built(plan.deployments)
    with options.sweeper(out, plan.identity()) as sweeper:
        searches = disagg_search.run(plan, sweeper)
    planned = SplitPlanned(plan, searches, disagg_report.json_summary(plan, searches))
    if emit is not None:
        emit_split.attach(plan, searches, planned.summary, planned.attachments, emit)
    return planned


def _profiles(plan: disagg.DisaggregatedPlan) -> list:
    """The profiles whose drafters ``--model`` may name: the deployments', else the pools'."""
    from specsim.simulation.run import cached_profile

    if plan.deployments:
        return [d.profile for d in plan.deployments if d.fits]
    scenario = plan.scenario
    split = scenario.fleet.disaggregation
    paths = {scenario.profile, split.prefill.profile, split.decode.profile} - {None}
    return [cached_profile(scenario.resolve(path)) for path in sorted(paths)]


def write_disaggregated(out: str | Path, planned: SplitPlanned) -> None:
    disagg_report.write(out, planned.plan, planned.searches, planned.summary, planned.attachments)
    emit_split.remove_stale(out, planned.summary)


def plan_disaggregated(
    scenario: str | os.PathLike,
    *,
    target_rps: float,
    tolerance: float = 0.02,
    attainment: float = 0.99,
    max_replicas: int = 8,
    seed: int | None = None,
    out: str | os.PathLike | None = None,
    workers: int | None = None,
    cluster: str | None = None,
    cluster_tls: ClusterTls | None = None,
    progress: bool = True,
    profiles: str | Sequence[str] | None = None,
    tp: str | int | Iterable[int] | None = None,
    precision: str | Sequence[str] | None = None,
    hardware: str | None = None,
    target_model: str | None = None,
    draft_models: str | Sequence[str] | None = None,
    acceptance_from: str | None = None,
    draft_tp: int | None = None,
    expert_parallel: bool = False,
    emit: str | Sequence[str] | None = None,
    models: dict[str, str] | None = None,
    **overrides: Any,
) -> PlanResult:
    """``specsim plan capacity --disaggregated``: the cheapest prefill/decode layout (xPyD)
    and the cheapest co-located fleet at ``target_rps``, with the scenario's speculation and
    with it off; each choice's capacity bisected to ``tolerance``. The deployment options as
    for ``plan_capacity`` (each pool's TP and precision; the pools may differ in TP);
    ``max_replicas`` as ``--max-replicas``. Tables: ``layouts`` (every layout simulated),
    ``candidates`` (why each deployment or pair won or lost) and ``pareto`` (the layouts within
    the SLO, on or off the frontier). ``emit`` and ``models`` as
    for ``plan_window``: each pool's engine files for the chosen split layout in
    ``attachments`` (``engine/``)."""
    from specsim.api.plan import deployments
    from specsim.api.plan_run import SweepOptions, run_planner

    return run_planner(
        disaggregated_run,
        scenario,
        out,
        SweepOptions(workers, cluster, cluster_tls, progress),
        overrides,
        write=write_disaggregated,
        result=_result,
        deployments=deployments(
            profiles,
            tp,
            precision,
            hardware,
            target_model,
            draft_models,
            acceptance_from,
            draft_tp,
            expert_parallel,
        ),
        emit=engine_files.emit_request(emit, models, ("emit", "models")),
        target_rps=target_rps,
        tolerance=tolerance,
        attainment=attainment,
        max_replicas=max_replicas,
        seed=seed,
    )


def _result(planned: SplitPlanned, out: Path | None) -> PlanResult:
    tables = {name: read_table(text) for name, text in planned.tables().items()}
    report = disagg_report.build(planned.summary)
    figures = {f.name: read_table(f.csv_text()) for f in report.figures()}
    return PlanResult(planned.summary, tables, figures, dict(planned.attachments), out)
