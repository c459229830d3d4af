"""The ``plan window`` report's "Chain or tree" section and terminal lines (with trees)."""

from __future__ import annotations

from typing import Any

from specsim.planning.report import Callout, Paragraph, Section, Table
from specsim.planning.window.window_trees import CHAIN, OFF, TREE, answer_text


def _figure(item: dict[str, Any], side: str, key: str):
    figures = item["figures"].get(side)
    return None if figures is None else figures.get(key)


def section(plan, block: dict[str, Any]) -> Section:
    """The answer, one row per load, the trees tried, and the by-batch-size view."""
    fmt = plan.axis.fmt
    blocks: list = [
        Paragraph(
            f"**Chain or tree:** {answer_text(block, fmt)} Trees drafted "
            f"{block['drafts']}; each is simulated at every load beside every chain k "
            "(ties go to the chain)."
        )
    ]
    rows = []
    for item in block["per_load"]:
        rows.append(
            [
                item["load"],
                item["winner"],
                item["best"],
                item["best_chain"],
                _figure(item, CHAIN, "mean_acceptance_length"),
                _figure(item, CHAIN, "e2e_mean_s"),
                item["best_tree"],
                _figure(item, TREE, "mean_acceptance_length"),
                _figure(item, TREE, "verified_per_step"),
                _figure(item, TREE, "e2e_mean_s"),
                _figure(item, OFF, "e2e_mean_s"),
            ]
        )
    blocks.append(
        Table(
            "chain_or_tree",
            [
                plan.axis.label,
                "winner",
                "best setting",
                "best chain",
                "chain accept. length",
                "chain e2e mean (s)",
                "best tree",
                "tree accept. length",
                "tree verified / step",
                "tree e2e mean (s)",
                "k=0 e2e mean (s)",
            ],
            rows,
            "Per load: the best chain (k > 0), the best tree and no speculation",
        )
    )
    blocks += [Paragraph(f"{fmt(item['load'])}: {item['reason']}.") for item in block["per_load"]]
    blocks.append(_candidates(block))
    batch = block["by_batch_size"]
    if batch["rows"]:
        blocks.append(
            Paragraph(
                "Per batch size, as SGLang's bench_speculative reports (acceptance length / step "
                "time), from the step costs alone at "
                f"{batch['context_tokens_per_sequence']:g} context tokens per sequence: no "
                "queueing, prompt chunks or KV limit, so the loads above decide."
            )
        )
        blocks.append(_by_batch(batch))
    if block["skipped"]:
        blocks.append(Callout("Not run: " + "; ".join(block["skipped"]) + ".", kind="note"))
    if block["screening"]:
        blocks.append(Callout(block["screening"] + ".", kind="note"))
    return Section("Chain or tree", blocks)


def _candidates(block: dict[str, Any]) -> Table:
    rows = []
    for c in block["candidates"]:
        sglang = c["sglang"]
        rows.append(
            [
                c["config"],
                c["nodes"],
                c["depth"],
                ",".join(map(str, c["nodes_per_depth"])),
                None if sglang is None else sglang["num_steps"],
                None if sglang is None else sglang["topk"],
                None if sglang is None else sglang["num_draft_tokens"],
                c["mean_acceptance_length"],
                c["acceptance_source"],
            ]
        )
    return Table(
        "trees",
        [
            "tree",
            "nodes",
            "depth",
            "nodes per depth",
            "num_steps",
            "topk",
            "num_draft_tokens",
            "accept. length",
            "acceptance",
        ],
        rows,
        "The trees tried: their shape, SGLang's knobs where they came from them, and the "
        "profile's acceptance length (measured for this shape, or derived)",
    )


def _by_batch(batch: dict[str, Any]) -> Table:
    rows = [
        [
            f"{r['min_batch']}-{r['max_batch']}",
            r["winner"],
            r["best"],
            r["tokens_per_s"]["off"],
            r["best_chain"],
            r["tokens_per_s"]["best_chain"],
            r["best_tree"],
            r["tokens_per_s"]["best_tree"],
        ]
        for r in batch["rows"]
    ]
    return Table(
        "chain_or_tree_by_batch",
        [
            "batch sizes",
            "winner",
            "best setting",
            "k=0 tok/s",
            "best chain",
            "chain tok/s",
            "best tree",
            "tree tok/s",
        ],
        rows,
        "Expected tokens per second of a decode-only step, per running batch size (the last "
        "batch size of each range)",
    )


def human(plan, block: dict[str, Any]) -> list[str]:
    lines = [f"chain or tree: {answer_text(block, plan.axis.fmt)}"]
    for item in block["per_load"]:
        lines.append(f"  {plan.axis.fmt(item['load'])}: {item['best'] or '?'} ({item['winner']})")
    return lines
