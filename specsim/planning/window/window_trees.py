"""``plan window --trees`` / ``--tree-*``: chain or tree, and which shape, per load and per
batch size.

Per load, the simulations decide: the best tree (``common.choose``) wins only where it beats
the best chain k (``window.analyse``; k = 0 is no speculation, no drafter) beyond the tie bands
``window_table.table_verdict`` applies (what redrawing the random streams moves), else the
simpler chain is kept. The verdict gives the reason in the two figures a tree trades: the
acceptance length it gains over the best chain (tokens per step) against the verification
width it pays (positions per step), with the latency that results.

Per batch size, as SGLang's ``bench_speculative`` reports a setting (``speed = acc_length /
step_time`` at each batch size), from the step costs and the acceptance models alone: the
expected tokens per second of a decode-only step of b sequences at the context a running
sequence held in the sweep, for no speculation, each chain k and each tree. It is the
steady-state view, not a simulation: it knows no queueing, no prompt chunks and no KV limit,
and says so.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from specsim.planning.common import choose, metric
from specsim.planning.trees import (
    TreeCandidate,
    acceptance_rates,
    merge,
    sglang_candidates,
)
from specsim.planning.window.window_table import context_per_sequence

# ``window``'s plan types, which import this module: named here, not imported (no cycle).
WindowPlan = Any

TREE, CHAIN, OFF = "tree", "chain", "off"
FROM_CHAIN = (
    "the profile measures no tree of this drafter, verifier and drafting, so every tree's "
    "acceptance is derived from the chain's per-position rates with siblings accepting "
    "nothing: each tree is its rank-0 chain plus nodes it verifies and never accepts, so no "
    "tree is chosen (a simulated difference in acceptance length from the chain's is the two "
    "acceptance models' bookkeeping, not a gain); profile trees (specsim profile measure "
    "--tree) to compare them"
)


def chain_survival(profile, speculation, k: int, drafter: str | None = None) -> np.ndarray:
    """P(the first i drafts of a chain step are all accepted), i = 1..k, from the rates the
    simulator chains for the scenario's acceptance model (``drafter``: the scenario's if None)."""
    from specsim.simulation.acceptance import extend_rates, window_rates

    drafter = drafter or speculation.drafter
    entry = profile.acceptance(drafter, speculation.verifier, speculation.temperature)
    if speculation.acceptance == "iid":
        rate = speculation.acceptance_rate
        conditional = np.full(k, entry.per_position[0] if rate is None else rate)
    else:
        conditional = extend_rates(window_rates(entry), k)
    return np.cumprod(conditional)


def chain_acceptance_length(profile, speculation, k: int) -> float:
    """1 + the expected accepted drafts of a chain step of k drafts (the simulator's rates)."""
    return 1.0 + float(chain_survival(profile, speculation, k).sum()) if k else 1.0


def tree_acceptance_length(profile, speculation, candidate: TreeCandidate, drafts: str):
    """The tree's mean acceptance length and whether the profile measured it or derived it."""
    entry = profile.profile.tree_acceptance_for(
        speculation.drafter, speculation.verifier, speculation.temperature, candidate.shape, drafts
    )
    return entry.mean_acceptance_length, entry.source


def kind_of(config: str | None) -> str | None:
    if config is None:
        return None
    if config == "k=0":
        return OFF
    return CHAIN if config.startswith("k=") else TREE


def _verified(plan, config: str) -> int:
    """Positions a row verifies per step: k + 1 for a chain, nodes + 1 for a tree."""
    if config.startswith("k="):
        return int(config[2:]) + 1
    return plan.tree_by_config[config].shape.num_nodes + 1


def per_load(plan, loads) -> list[dict[str, Any]]:
    """Per load: the best chain (k > 0), the best tree, the winner and why."""
    out = []
    for entry in loads:
        chains = [(f"k={k}", entry.summary(f"k={k}")) for k in plan.ks if k > 0]
        trees = [(c.config, entry.summary(c.config)) for c in plan.trees]
        best_chain = choose(chains, plan.use_slo) if chains else None
        best_tree = choose(trees, plan.use_slo)
        winner = entry.best_config
        out.append(
            {
                "load": entry.load,
                "offered_rps": plan.offered_rps(entry.load),
                "winner": kind_of(winner),
                "best": winner,
                "best_chain": best_chain,
                "best_tree": best_tree,
                "figures": {
                    name: _figures(plan, entry, config)
                    for name, config in (
                        (OFF, "k=0" if 0 in plan.ks else None),
                        (CHAIN, best_chain),
                        (TREE, best_tree),
                    )
                },
                "reason": reason(plan, entry, winner, best_chain, best_tree),
            }
        )
    return out


def _figures(plan, entry, config: str | None) -> dict[str, Any] | None:
    summary = None if config is None else entry.summary(config)
    if summary is None:
        return None
    return {
        "config": config,
        "mean_acceptance_length": metric(summary, "mean_acceptance_length"),
        "verified_per_step": _verified(plan, config),
        "tpot_mean_s": metric(summary, "tpot_s", "mean"),
        "e2e_mean_s": metric(summary, "e2e_s", "mean"),
        "goodput_requests_per_s": metric(summary, "goodput_requests_per_s"),
        "flops_wasted_fraction": metric(summary, "flops_wasted_fraction"),
    }


def _side(plan, entry, config: str) -> str:
    s = entry.summary(config)
    length = metric(s, "mean_acceptance_length")
    text = f"{config}: acceptance length {length:.3g}, " if length is not None else f"{config}: "
    text += f"{_verified(plan, config)} verified positions per step"
    tpot = metric(s, "tpot_s", "mean")
    return text + (f", mean TPOT {tpot * 1e3:.3g} ms" if tpot is not None else "")


def _outcome(plan, entry, config: str) -> str:
    s = entry.summary(config)
    parts = []
    if plan.use_slo and metric(s, "goodput_requests_per_s") is not None:
        parts.append(f"goodput {metric(s, 'goodput_requests_per_s'):.4g} req/s")
    if metric(s, "e2e_s", "mean") is not None:
        parts.append(f"mean E2E {metric(s, 'e2e_s', 'mean'):.4g} s")
    return f"{config} " + ", ".join(parts)


def reason(plan, entry, winner, best_chain, best_tree) -> str:
    """One sentence: what the winner gains and what the loser pays."""
    if winner is None:
        return "no result at this load (its simulations failed)"
    if best_tree is None:
        return "no tree has a result at this load"
    if plan.trees_from_chain:
        return f"{kind_of(winner)} {winner} is chosen and trees are not: {FROM_CHAIN}"
    tree = _side(plan, entry, best_tree)
    chain = _side(plan, entry, best_chain) if best_chain else None
    versus = f"{tree}" + (f"; against {chain}" if chain else "")
    if kind_of(winner) == TREE:
        gained = ""
        if best_chain:
            a = metric(entry.summary(best_tree), "mean_acceptance_length")
            b = metric(entry.summary(best_chain), "mean_acceptance_length")
            if a is not None and b is not None:
                gained = f"it accepts {a - b:+.3g} tokens per step more than the best chain, "
                gained += "which pays for its wider verification: "
        rival = best_chain or "k=0"
        return (
            f"tree {best_tree} wins: {gained}{versus} "
            f"({_outcome(plan, entry, best_tree)} vs {_outcome(plan, entry, rival)})"
        )
    if kind_of(winner) != TREE and _tied(plan, entry, best_tree, winner):
        return (
            f"{kind_of(winner)} {winner} is kept: the best tree is within the tie bands of it "
            f"(2 % on mean E2E, 1 % of the served rate on goodput), too close to pay for the "
            f"tree's extra verification: {versus} ({_outcome(plan, entry, best_tree)} vs "
            f"{_outcome(plan, entry, winner)})"
        )
    if kind_of(winner) == CHAIN:
        return (
            f"chain {winner} wins: the best tree's extra acceptance does not pay for its "
            f"verification width: {versus} ({_outcome(plan, entry, winner)} vs "
            f"{_outcome(plan, entry, best_tree)})"
        )
    rivals = [c for c in (best_chain, best_tree) if c]
    return (
        "no speculation (k = 0, no drafter) wins: both lose to it: "
        + "; ".join(_outcome(plan, entry, c) for c in ["k=0", *rivals])
        + f" ({versus})"
    )


def _tied(plan, entry, tree: str, chain: str) -> bool:
    from specsim.planning.window.window_table import table_verdict

    return table_verdict(entry.summary(tree), entry.summary(chain), plan.use_slo) == "equal"


def by_batch(plan, loads) -> dict[str, Any]:
    """Per batch size 1..max_batch: expected tokens per second of each setting (module)."""
    from specsim.costs import StepCosts
    from specsim.costs.tree import TreeRows
    from specsim.tree import TreeShape

    spec, profile = plan.scenario.speculation, plan.profile
    summaries = [entry.summary(entry.best_config) for entry in loads if entry.best_config]
    context = context_per_sequence(summaries)
    if context is None:
        return {"context_tokens_per_sequence": None, "rows": [], "reason": "no load has a result"}
    settings: list[tuple[str, Any, int, TreeShape | None, float]] = []
    for k in plan.ks:
        length = chain_acceptance_length(profile, spec, k)
        costs = StepCosts(profile, spec.drafter if k else None)
        settings.append((f"k={k}", costs, k, TreeShape.chain(k) if k else None, length))
    for candidate in plan.trees:
        length, _ = tree_acceptance_length(profile, spec, candidate, plan.tree_drafts)
        costs = StepCosts(profile, spec.drafter, candidate.shape)
        settings.append((candidate.config, costs, candidate.shape.depth, candidate.shape, length))
    sizes = list(range(1, plan.scenario.engine.max_batch + 1))
    speeds: dict[str, list[float]] = {}
    for config, costs, k, shape, length in settings:
        row = []
        for size in sizes:
            contexts = np.full(size, context)
            if shape is None:
                new, pairs = float(size), float(size) * (context + 1.0)
            else:
                new, pairs = TreeRows(shape).totals(np.full(size, float(k)), contexts)
            seconds = costs.decode_iteration_s(k, size, new, size * context, pairs)
            row.append(float(f"{size * length / seconds:.6g}"))  # as summaries round
        speeds[config] = row
    rows: list[dict[str, Any]] = []
    for i, size in enumerate(sizes):
        best = max(speeds, key=lambda c: speeds[c][i])  # the first of equals: chains, smaller k
        chain = max(
            (c for c in speeds if c.startswith("k=") and c != "k=0"),
            default=None,
            key=lambda c: speeds[c][i],
        )
        tree = max((c.config for c in plan.trees), key=lambda c: speeds[c][i])
        item = {
            "max_batch": size,
            "best": best,
            "winner": kind_of(best),
            "tokens_per_s": {"off": speeds.get("k=0", [None] * len(sizes))[i]},
        }
        item["tokens_per_s"]["best_chain"] = None if chain is None else speeds[chain][i]
        item["tokens_per_s"]["best_tree"] = speeds[tree][i]
        item["best_chain"], item["best_tree"] = chain, tree
        if rows and rows[-1]["best"] == best:
            rows[-1]["max_batch"] = size
            rows[-1]["tokens_per_s"] = item["tokens_per_s"]
        else:
            rows.append({**item, "min_batch": size})
    return {"context_tokens_per_sequence": context, "rows": rows, "reason": None}


def json_block(plan, loads) -> dict[str, Any]:
    """summary.json's ``trees`` block."""
    spec = plan.scenario.speculation
    candidates = []
    for candidate in plan.trees:
        length, source = tree_acceptance_length(plan.profile, spec, candidate, plan.tree_drafts)
        candidates.append(
            {
                **candidate.json(),
                "mean_acceptance_length": float(f"{length:.6g}"),  # as summaries round
                "acceptance_source": source,
            }
        )
    per = per_load(plan, loads)
    counts = {kind: [p["load"] for p in per if p["winner"] == kind] for kind in (TREE, CHAIN, OFF)}
    return {
        "drafts": plan.tree_drafts,
        "trees_derived_from_chain": plan.trees_from_chain,
        "candidates": candidates,
        "skipped": list(plan.tree_skipped),
        "per_load": per,
        "trees_win_at": counts[TREE],
        "chains_win_at": counts[CHAIN],
        "speculation_off_wins_at": counts[OFF],
        "by_batch_size": by_batch(plan, loads),
        "screening": "tree points are never screened: the closed-form estimate prices chains "
        "only, so every tree is simulated and none prunes a chain"
        if plan.screen
        else None,
    }


def answer_text(block: dict[str, Any], fmt) -> str:
    """The answer in one sentence, ``fmt`` writing a load."""
    parts = []
    for key, word in (
        ("trees_win_at", "a tree wins"),
        ("chains_win_at", "a chain wins"),
        ("speculation_off_wins_at", "no speculation wins (chains and trees both lose)"),
    ):
        if block[key]:
            parts.append(f"{word} at {', '.join(fmt(x) for x in block[key])}")
    text = "; ".join(parts) + "." if parts else "No load has a result."
    if block["trees_derived_from_chain"]:
        text += f" No tree can be chosen: {FROM_CHAIN}."
    return text


def add_trees(plan: WindowPlan, given, space, drafts: str | None) -> None:
    """The trees beside the chains, each checked by loading it as a point would (one-line
    errors naming the option)."""
    from specsim.costs import StepCosts
    from specsim.errors import SpecsimError
    from specsim.scenario import load_scenario

    spec = plan.scenario.speculation
    plan.tree_drafts = drafts or spec.tree_drafts
    kind = plan.profile.drafter(spec.drafter).kind
    if kind not in ("draft_model", "heads"):
        raise SpecsimError(
            f"drafter {spec.drafter!r} is {kind}: trees are drafted by draft models and "
            "decoding heads only",
            key="--trees",
            fix="choose such a drafter (--set speculation.drafter=NAME) or drop the tree options",
        )
    searched: list[TreeCandidate] = []
    rates, measured = acceptance_rates(plan.profile, spec, plan.tree_drafts)
    if space is not None:
        searched, plan.tree_skipped = sglang_candidates(space, rates)
    plan.trees = merge(given, searched)
    plan.trees_from_chain = not measured
    if not plan.trees:
        raise SpecsimError(
            "the tree options leave no tree to try (every one is a chain: "
            + "; ".join(plan.tree_skipped[:3])
            + ")",
            key="--tree-topk",
            fix="give a topk above 1 and draft tokens above steps + 1",
        )
    for candidate in plan.trees:
        try:
            load_scenario(
                plan.scenario_path, [*plan.base_overrides, *plan.tree_overrides(candidate)]
            )
            plan.profile.profile.tree_acceptance_for(
                spec.drafter, spec.verifier, spec.temperature, candidate.shape, plan.tree_drafts
            )
            costs = StepCosts(plan.profile, spec.drafter, candidate.shape)
            latency = plan.profile.profile.target.latency
            if latency is not None and latency.outside_range == "error" and latency.valid_range:
                width = candidate.shape.num_nodes + 1.0
                costs.check_ranges(1, 0.0, width, width)
        except SpecsimError as exc:
            raise SpecsimError(
                f"tree {candidate.config} cannot run: {exc.message}",
                key="--trees" if candidate.sglang is None else "--tree-tokens",
                fix=exc.fix or "give a smaller tree",
            ) from None
