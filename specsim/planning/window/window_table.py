"""The k-by-batch-size table of ``plan window``: how it is derived, and whether it is worth using.

A table picks k before every engine iteration from the running batch, with the drafter always
deployed. So it is derived per batch size, not per load: for each running batch b it takes the
k (of those swept) whose decode step emits the most expected tokens per second, from the
engine's own cost function and acceptance model (``GoodputWindow.scores``, what the adaptive
policy maximises on a decode-only batch) at the context a running sequence held in the sweep.

Reading it off the best static k per load instead fails in two ways. Static k = 0 deploys no
drafter, which a table's k = 0 row cannot do (the drafter keeps its memory, prefills every prompt
and runs a KV-sync pass per step). And the batch a load runs at depends on the k it runs at, so
a k = 0 row at large batches (the slowest window there with the drafter deployed) slows the
engine, grows the batch and holds it in that row.

The table's own simulation is then set against the best static choice at every load
(``judge``). Loads from the crossover on, where k = 0 without a drafter wins, are not a table's
to win: the honest answer there is to turn speculation off.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from specsim.planning.common import GOODPUT_TIE, metric
from specsim.planning.sweep.points import SweepPoint

# ``window``'s plan types, which import this module: named here, not imported (no cycle).
LoadResult = Any
WindowPlan = Any

# Mean end-to-end latencies less than 2 % apart count as equal: redrawing only the acceptance
# and jitter streams of the same traffic moves the mean by about 1 %
# (docs/notes/2026-12-01-k-by-batch.md).
E2E_TIE = 0.02

RECOMMENDED = "recommended"
NOT_RECOMMENDED = "not recommended"
BY_BATCH = "by_batch"  # the table's policy, and its run's config in a plan's grid


def context_per_sequence(summaries: Sequence[Mapping[str, Any] | None]) -> float | None:
    """Mean KV tokens per running sequence over the runs given (ratio of their sums).

    From each run's KV-cache use and batch size; a run without them counts as its mean prompt
    plus half its mean output.
    """
    tokens = sequences = 0.0
    for summary in summaries:
        batch = metric(summary, "batch_size")
        used = metric(summary, "kv_cache_utilisation")
        capacity = metric(summary, "kv_capacity_tokens")
        if batch and used is not None and capacity:
            tokens += used * capacity
            sequences += batch
            continue
        requests = metric(summary, "requests")
        prompt, output = metric(summary, "prompt_tokens"), metric(summary, "output_tokens")
        if requests and prompt is not None and output is not None:
            tokens += (prompt + output / 2.0) / requests
            sequences += 1.0
    return float(f"{tokens / sequences:.6g}") if sequences else None  # as summaries round


def best_window_by_batch(
    profile, speculation, ks: Sequence[int], max_batch: int, context: float
) -> list[dict[str, int]]:
    """Rows ``{max_batch, k}`` covering batch sizes 1..max_batch, equal neighbours merged.

    Each batch size takes the k in ``ks`` with the most expected tokens per second of a
    decode-only step of that many sequences at ``context`` tokens each, the drafter deployed
    (ties go to the smaller k).
    """
    from specsim.costs import StepCosts
    from specsim.simulation.acceptance import build_acceptance
    from specsim.simulation.policy import GoodputWindow

    top = max(ks)
    entry = profile.acceptance(speculation.drafter, speculation.verifier, speculation.temperature)
    acceptance = build_acceptance(
        profile,
        entry,
        speculation.acceptance,
        top,
        speculation.acceptance_rate,
        speculation.heterogeneity,
    )
    window = GoodputWindow(top)
    window.attach(StepCosts(profile, speculation.drafter), acceptance)
    rows: list[dict[str, int]] = []
    for size in range(1, max_batch + 1):
        # Every row far from its end, so each drafts the full window.
        remaining = np.full(size, top + 2.0)
        contexts = np.full(size, context)
        scores = window.scores(size, size * context, remaining, contexts, None, 0.0)
        k = max(ks, key=lambda k: (scores[k], -k))
        if rows and rows[-1]["k"] == k:
            rows[-1]["max_batch"] = size
        else:
            rows.append({"max_batch": size, "k": int(k)})
    return rows


def k_by_batch(plan: WindowPlan, loads: list[LoadResult]) -> tuple[list[dict[str, int]], dict]:
    """The table's rows (empty when there is none to offer) and how they were derived.

    Derived per running batch size from the step costs with the drafter deployed, at the context
    a running sequence held in the best static runs of the loads where speculation pays.
    """
    paying = [entry.best for entry in loads if entry.best_k]
    context = context_per_sequence(paying)
    derivation: dict[str, Any] = {"context_tokens_per_sequence": context, "no_table_reason": None}
    if max(plan.ks) == 0:
        derivation["no_table_reason"] = "only k = 0 was swept"
    elif all(entry.best_k is None for entry in loads):
        derivation["no_table_reason"] = "no load has a result (its simulations failed)"
    elif not paying or context is None:
        derivation["no_table_reason"] = (
            "speculation does not pay at any load swept: k = 0 (no drafter) is best at every one"
        )
    if derivation["no_table_reason"]:
        return [], derivation
    spec, max_batch = plan.scenario.speculation, plan.scenario.engine.max_batch
    rows = best_window_by_batch(plan.profile, spec, plan.ks, max_batch, context)
    if all(row["k"] == 0 for row in rows):
        derivation["no_table_reason"] = (
            "with the drafter deployed no window beats k = 0 at any batch size"
        )
        return [], derivation
    return rows, derivation


def by_batch_points(plan: WindowPlan, rows: list[dict[str, int]]) -> list[SweepPoint]:
    """Run the derived table at every load (nothing to check when it is k = 0 throughout)."""
    if not rows or all(row["k"] == 0 for row in rows):
        return []
    extra = [*plan.policy_overrides("by_batch"), f"speculation.k_by_batch={table_text(rows)}"]
    return [plan.point(load, BY_BATCH, extra) for load in plan.loads]


def table_text(rows: Sequence[Mapping[str, int]]) -> str:
    """A k-by-batch table as ``--set speculation.k_by_batch=`` takes it."""
    return "[" + ", ".join(f"{{max_batch: {r['max_batch']}, k: {r['k']}}}" for r in rows) + "]"


def vllm_ranges(rows: list[dict[str, int]]) -> list[list[int]]:
    """The same table as vLLM's ``num_speculative_tokens_per_batch_size``: [start, end, k]."""
    ranges, start = [], 1
    for row in rows:
        ranges.append([start, row["max_batch"], row["k"]])
        start = row["max_batch"] + 1
    return ranges


# -- the verdict ----------------------------------------------------------------------------------


def figures(summary: Mapping[str, Any] | None) -> dict[str, float | None] | None:
    """The metrics the comparison shows, from one run's summary (None for a failed run)."""
    if summary is None:
        return None
    return {
        "goodput_requests_per_s": metric(summary, "goodput_requests_per_s"),
        "slo_attainment": metric(summary, "slo_attainment"),
        "throughput_tokens_per_s": metric(summary, "throughput_tokens_per_s"),
        "e2e_mean_s": metric(summary, "e2e_s", "mean"),
        "e2e_p99_s": metric(summary, "e2e_s", "p99"),
        "ttft_p99_s": metric(summary, "ttft_s", "p99"),
        "tpot_p99_s": metric(summary, "tpot_s", "p99"),
    }


def table_verdict(table: Mapping[str, Any] | None, static: Mapping[str, Any], use_slo: bool) -> str:
    """``better``, ``equal`` or ``worse`` for the table against a static run; ``failed``.

    The planner's rule (``common.choose``) with a tie band on both criteria: goodput first
    (with an SLO, ``GOODPUT_TIE`` of the served rate), then mean end-to-end latency (``E2E_TIE``).
    """
    if table is None:
        return "failed"
    if use_slo:
        goodput = [metric(s, "goodput_requests_per_s") or 0.0 for s in (table, static)]
        served = [metric(s, "throughput_requests_per_s") or 0.0 for s in (table, static)]
        band = GOODPUT_TIE * max(*served, *goodput)
        if goodput[0] < goodput[1] - band:
            return "worse"
        if goodput[0] > goodput[1] + band:
            return "better"
    mine, theirs = metric(table, "e2e_s", "mean"), metric(static, "e2e_s", "mean")
    if mine is None or theirs is None:
        return "failed" if mine is None else "better"
    if mine > theirs * (1.0 + E2E_TIE):
        return "worse"
    if mine < theirs * (1.0 - E2E_TIE):
        return "better"
    return "equal"


@dataclass
class LoadCheck:
    """One load: the best static choice and the table's own run there."""

    load: float
    label: str  # the load as the report writes it, e.g. "10 req/s"
    best_k: int | None
    best: Mapping[str, Any] | None
    table: Mapping[str, Any] | None
    offered_rps: float | None = None


def judge(
    checks: list[LoadCheck],
    rows: list[dict[str, int]],
    crossover: Mapping[str, float | None],
    use_slo: bool,
    no_table_reason: str | None = None,
) -> dict[str, Any]:
    """The ``k_by_batch`` verdict: recommended or not, why, and the per-load comparison.

    Loads from ``crossover["load"]`` on are not judged (k = 0 without a drafter wins there and no
    table can do that); the table is recommended when its run matches or beats the best static
    choice at every other load.
    """
    start = crossover.get("load")
    off_above = crossover.get("last_paying") if start is not None else None
    per_load = []
    for check in checks:
        # A load without a static result has nothing to be judged against.
        has_static = bool(rows) and check.best is not None
        judged = has_static and (start is None or check.load < start)
        outcome = table_verdict(check.table, check.best, use_slo) if has_static else None
        best = figures(check.best)
        per_load.append(
            {
                "load": check.load,
                "offered_rps": check.offered_rps,
                "judged": judged,
                "outcome": outcome,
                "table": figures(check.table) if rows else None,
                "best_static": None if best is None else {"k": check.best_k, **best},
            }
        )
    verdict, reason = _verdict(checks, per_load, rows, off_above, no_table_reason)
    return {
        "verdict": verdict,
        "reason": reason,
        "speculation_off_above_load": off_above,
        "per_load": per_load,
    }


def _verdict(checks, per_load, rows, off_above, no_table_reason) -> tuple[str, str]:
    if not rows:
        return NOT_RECOMMENDED, no_table_reason or "there is no table to run"
    labels = {check.load: check.label for check in checks}
    judged = [(c, item) for c, item in zip(checks, per_load, strict=True) if item["judged"]]
    above = f"; above {labels[off_above]} turn speculation off" if off_above is not None else ""
    if not judged:
        return NOT_RECOMMENDED, "no load below the crossover has a static result to compare"
    losses = [(c, item) for c, item in judged if item["outcome"] in ("worse", "failed")]
    if losses:
        check, item = losses[0]
        more = f" (and at {len(losses) - 1} more)" if len(losses) > 1 else ""
        if item["outcome"] == "failed":
            return NOT_RECOMMENDED, f"its simulation at {check.label} failed{more}{above}"
        return (
            NOT_RECOMMENDED,
            f"it loses to static k = {check.best_k}{' (no drafter)' if check.best_k == 0 else ''} "
            f"at {check.label}{more}: "
            f"{_versus(item)}; run the best static k per load instead{above}",
        )
    scope = f"up to {labels[off_above]}" if off_above is not None else "swept"
    wins = [c.label for c, item in judged if item["outcome"] == "better"]
    if wins:
        text = f"it beats the best static k at {', '.join(wins)} and matches it at every other "
        text += f"load {scope}"
    else:
        text = f"it matches the best static k at every load {scope}"
        static = sorted({c.best_k for c, _ in judged})
        if len(static) == 1:
            text += f" (a fixed k = {static[0]} does as well)"
        else:
            text += f" (where the best static k ranges from {static[0]} to {static[-1]})"
    return RECOMMENDED, text + above


def _versus(item: Mapping[str, Any]) -> str:
    """``goodput 9.78 vs 9.89 req/s, mean E2E 2.47 vs 2.17 s`` (the table first)."""
    table, best = item["table"], item["best_static"]
    parts = []
    for key, name, unit in (
        ("goodput_requests_per_s", "goodput", "req/s"),
        ("e2e_mean_s", "mean E2E", "s"),
    ):
        if table.get(key) is not None and best.get(key) is not None:
            parts.append(f"{name} {table[key]:.3g} vs {best[key]:.3g} {unit}")
    return ", ".join(parts)
