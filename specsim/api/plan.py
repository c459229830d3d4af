"""``plan_window``, ``plan_capacity``, ``drafter_swap``: the planner's sweeps, as the CLI runs them.

``specsim plan window``, ``specsim plan capacity`` and ``specsim report drafter-swap`` call the
``*_run`` functions below and ``write_plan``, so a PlanResult holds what the command writes.
Without ``out`` a sweep keeps its points in a temporary folder, removed afterwards (nothing to
resume from); with ``out`` it writes everything the command writes, and a rerun with the same
``out`` computes only what is missing.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from numbers import Real
from pathlib import Path
from typing import Any

from specsim.api.overrides import override_texts
from specsim.api.results import SUMMARY, PlanResult, plan_result
from specsim.errors import SpecsimError
from specsim.fileio import atomic_output_dir, check_output_folder, dump_json
from specsim.planning.capacity import capacity, capacity_policies, capacity_report
from specsim.planning.capacity.capacity_deploy import (
    DeploymentRequest,
    deployment_request,
    write_built,
)
from specsim.planning.common import check_loads, parse_k_values, parse_loads
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


# -- the API ----------------------------------------------------------------------------------


def plan_window(
    scenario: str | os.PathLike,
    *,
    k: str | int | Iterable[int] | None = None,
    loads: str | Real | Iterable[Real] | None = None,
    seed: int | None = None,
    out: str | os.PathLike | None = None,
    workers: int | None = None,
    cluster: str | None = None,
    cluster_tls: ClusterTls | None = None,
    progress: bool = True,
    emit: str | Sequence[str] | None = None,
    models: dict[str, str] | None = None,
    screen: bool | None = None,
    trees: str | Sequence[str] | None = None,
    tree_steps: str | None = None,
    tree_topk: str | None = None,
    tree_tokens: str | None = None,
    tree_drafts: str | None = None,
    policies: str | Sequence[str] | None = None,
    **overrides: Any,
) -> PlanResult:
    """``specsim plan window``: the best k at each load, the crossover load and the k-by-batch
    table. ``k`` as ``--k`` (``"0..4"``, or a list of ints), ``loads`` as ``--loads`` (a list of
    numbers), ``seed`` as ``--seed``; ``screen`` True as ``--screen``, False as
    ``--exhaustive``; overrides as for ``simulate`` (``workload__duration_s=60``).
    Tables: ``sweep``, ``best_k``, ``k_by_batch``, ``k_by_batch_check``. ``emit`` and
    ``models`` as ``--emit`` (``"vllm,sglang"`` or a list) and ``--model`` (``{"target":
    "meta-llama/Llama-3.1-8B-Instruct"}``): the engines' files in ``attachments`` (``engine/``).
    ``trees`` (shapes: ``"2,2,1"`` or a list of them), ``tree_steps``, ``tree_topk``,
    ``tree_tokens`` (``"1..4"``) and ``tree_drafts`` as ``--trees``, ``--tree-*``: trees beside
    the chains, in the summary's ``trees`` block and the ``chain_or_tree`` table."""
    from specsim.planning.trees import SglangSpace, given_trees
    from specsim.planning.window.window_policies import parse_policies

    return run_planner(
        window_run,
        scenario,
        out,
        SweepOptions(workers, cluster, cluster_tls, progress),
        overrides,
        emit=engine_files.emit_request(emit, models, ("emit", "models")),
        ks=_k_values(k),
        loads=_loads(loads),
        seed=seed,
        screen=screen,
        trees=given_trees([trees] if isinstance(trees, str) else trees),
        space=SglangSpace.parse(*(_text(v) for v in (tree_steps, tree_topk, tree_tokens))),
        tree_drafts=tree_drafts,
        policies=parse_policies(policies),
    )


def plan_capacity(
    scenario: str | os.PathLike,
    *,
    target_rps: float,
    drafters: str | Sequence[str] | None = None,
    k: str | int | Iterable[int] | None = None,
    tolerance: float = 0.02,
    attainment: float = 0.99,
    seed: int | None = None,
    out: str | os.PathLike | None = None,
    workers: int | None = None,
    cluster: str | None = None,
    cluster_tls: ClusterTls | None = None,
    progress: bool = True,
    emit: str | Sequence[str] | None = None,
    models: dict[str, str] | None = None,
    profiles: str | Sequence[str] | None = None,
    tp: str | int | Iterable[int] | None = None,
    precision: str | Sequence[str] | None = None,
    hardware: str | None = None,
    target_model: str | None = None,
    draft_models: str | Sequence[str] | None = None,
    acceptance_from: str | None = None,
    draft_tp: int | None = None,
    expert_parallel: bool = False,
    policies: str | Sequence[str] | None = None,
    **overrides: Any,
) -> PlanResult:
    """``specsim plan capacity``: the rate one replica sustains within the SLO per candidate,
    and the replicas and cost ``target_rps`` needs. ``drafters`` as ``--drafter`` (default: the
    scenario's), the rest as their options (``emit`` and ``models`` as for ``plan_window``);
    ``profiles``, ``tp`` (``"2,4,8"`` or ints), ``precision``, ``hardware``, ``target_model``,
    ``draft_models``, ``acceptance_from``, ``draft_tp`` and ``expert_parallel`` as the
    deployment options; ``policies`` as ``--policies`` (``"by_batch,adaptive_steps"`` or a
    list): the window policies compared at the target, in the summary's ``policies``.
    Tables: ``capacity``, ``fleet``, ``fleet_vs_off`` (when the choice uses speculation);
    with deployments also ``deployments`` and ``pareto``; with policies ``policies``."""
    from specsim.planning.policy_compare import compared_policies

    return run_planner(
        capacity_run,
        scenario,
        out,
        SweepOptions(workers, cluster, cluster_tls, progress),
        overrides,
        emit=engine_files.emit_request(emit, models, ("emit", "models")),
        target_rps=target_rps,
        drafters=_names(drafters),
        ks=_k_values(k),
        tolerance=tolerance,
        attainment=attainment,
        seed=seed,
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
        policies=compared_policies(policies, "plan capacity"),
    )


def deployments(
    profiles, tp, precision, hardware, target_model, draft_models, acceptance_from, draft_tp, ep
):
    """The deployment options of ``plan_capacity`` and ``plan_disaggregated`` as the CLI's
    (``tp`` as ``"2,4,8"`` or ints; names as a string or a sequence)."""
    if tp is not None and not isinstance(tp, str):
        tp = ",".join(str(t) for t in ([tp] if isinstance(tp, int) else tp))
    return deployment_request(
        _names(profiles),
        tp,
        _names(precision),
        hardware,
        target_model,
        _names(draft_models),
        acceptance_from,
        draft_tp,
        ep,
    )


def drafter_swap(
    scenario: str | os.PathLike,
    *,
    drafters: Sequence[str],
    profiles: str | Sequence[str] | None = None,
    k: str | int | Iterable[int] | None = None,
    loads: str | Real | Iterable[Real] | None = None,
    seed: int | None = None,
    out: str | os.PathLike | None = None,
    workers: int | None = None,
    cluster: str | None = None,
    cluster_tls: ClusterTls | None = None,
    progress: bool = True,
    emit: str | Sequence[str] | None = None,
    models: dict[str, str] | None = None,
    policies: str | Sequence[str] | None = None,
    **overrides: Any,
) -> PlanResult:
    """``specsim report drafter-swap``: two or more drafters side by side across load, and a
    recommendation. ``profiles`` as ``--profile`` (one for all, or one per drafter); ``emit``
    and ``models`` as for ``plan_window``; ``policies`` as ``--policies``: the drafters with
    each window policy per load, in the summary's ``policies``. Tables: ``drafters``,
    ``acceptance_per_position``, ``per_load``, ``sweep``; with policies ``policies``."""
    from specsim.planning.policy_compare import compared_policies

    return run_planner(
        swap_run,
        scenario,
        out,
        SweepOptions(workers, cluster, cluster_tls, progress),
        overrides,
        emit=engine_files.emit_request(emit, models, ("emit", "models")),
        drafters=_names(drafters),
        profiles=_names(profiles),
        ks=_k_values(k),
        loads=_loads(loads),
        seed=seed,
        policies=compared_policies(policies, "report drafter-swap"),
    )


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


def _k_values(k: Any) -> list[int] | None:
    if k is None:
        return None
    if isinstance(k, str):
        return parse_k_values(k, option="k")
    values = [k] if isinstance(k, int) else list(k)
    return parse_k_values(",".join(str(v) for v in values), option="k")


def _loads(loads: Any) -> list[float] | None:
    if loads is None:
        return None
    values = [loads] if isinstance(loads, (str, Real)) else list(loads)
    return parse_loads([str(v) for v in values], option="loads")


def _names(names: str | Sequence[str] | None) -> list[str] | None:
    if names is None:
        return None
    return [names] if isinstance(names, str) else [str(n) for n in names]


def _text(value: Any) -> str | None:
    """``--tree-*`` values as the options take them (a list of ints or one int also works)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return str(value)
    return ",".join(str(int(v)) for v in value)
