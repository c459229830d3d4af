"""``plan_window``, ``plan_capacity``, ``drafter_swap``: the planner's sweeps as functions,
run as the CLI runs them (``specsim.api.plan_run``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from numbers import Real
from typing import Any

from specsim.api.plan_run import SweepOptions, capacity_run, run_planner, swap_run, window_run
from specsim.api.results import PlanResult
from specsim.planning.capacity.capacity_deploy import deployment_request
from specsim.planning.common import parse_k_values, parse_loads
from specsim.planning.emit import emit as engine_files
from specsim.planning.sweep.cluster import ClusterTls


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

    tree_options = (tree_steps, tree_topk, tree_tokens)

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
        space=SglangSpace.parse(*(_joined(v, lambda n: str(int(n))) for v in tree_options)),
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
    return deployment_request(
        _names(profiles),
        _joined(tp),
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


def _k_values(k: Any) -> list[int] | None:
    return None if k is None else parse_k_values(_joined(k), option="k")


def _loads(loads: Any) -> list[float] | None:
    if loads is None:
        return None
    values = [loads] if isinstance(loads, (str, Real)) else list(loads)
    return parse_loads([str(v) for v in values], option="loads")


def _names(names: str | Sequence[str] | None) -> list[str] | None:
    if names is None:
        return None
    return [names] if isinstance(names, str) else [str(n) for n in names]


def _joined(value: Any, item: Callable[[Any], str] = str) -> str | None:
    """A list option as the CLI's text: a string as is, one int or a sequence joined by commas
    (``item`` writes each; ``--tree-*`` values are whole numbers)."""
    if value is None or isinstance(value, str):
        return value
    return ",".join(item(v) for v in ([value] if isinstance(value, int) else value))
