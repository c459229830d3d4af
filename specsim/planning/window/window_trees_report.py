"""The ``plan window`` report's "Chain or tree" section and terminal lines (with trees)."""

from __future__ import annotations

from operator import itemgetter
from typing import Any

from specsim.planning.report import Callout, Column, Paragraph, Section, Table, column_table
from specsim.planning.window.window_trees import CHAIN, OFF, TREE, answer_text


def _figure(side: str, key: str):
    """A load's figure ``key`` of its best ``side`` (chain, tree or off; None: no such run)."""

    def cell(item: dict[str, Any]):
        figures = item["figures"].get(side)
        return None if figures is None else figures.get(key)

    return cell


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
    columns: list[Column] = [
        (plan.axis.label, itemgetter("load")),
        ("winner", itemgetter("winner")),
        ("best setting", itemgetter("best")),
        ("best chain", itemgetter("best_chain")),
        ("chain accept. length", _figure(CHAIN, "mean_acceptance_length")),
        ("chain e2e mean (s)", _figure(CHAIN, "e2e_mean_s")),
        ("best tree", itemgetter("best_tree")),
        ("tree accept. length", _figure(TREE, "mean_acceptance_length")),
        ("tree verified / step", _figure(TREE, "verified_per_step")),
        ("tree e2e mean (s)", _figure(TREE, "e2e_mean_s")),
        ("k=0 e2e mean (s)", _figure(OFF, "e2e_mean_s")),
    ]
    text = "Per load: the best chain (k > 0), the best tree and no speculation"
    blocks.append(column_table("chain_or_tree", columns, block["per_load"], text))
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


def _sglang(knob: str):
    return lambda c: None if c["sglang"] is None else c["sglang"][knob]


CANDIDATE_COLUMNS: list[Column] = [
    ("tree", itemgetter("config")),
    ("nodes", itemgetter("nodes")),
    ("depth", itemgetter("depth")),
    ("nodes per depth", lambda c: ",".join(map(str, c["nodes_per_depth"]))),
    ("num_steps", _sglang("num_steps")),
    ("topk", _sglang("topk")),
    ("num_draft_tokens", _sglang("num_draft_tokens")),
    ("accept. length", itemgetter("mean_acceptance_length")),
    ("acceptance", itemgetter("acceptance_source")),
]
BY_BATCH_COLUMNS: list[Column] = [
    ("batch sizes", lambda r: f"{r['min_batch']}-{r['max_batch']}"),
    ("winner", itemgetter("winner")),
    ("best setting", itemgetter("best")),
    ("k=0 tok/s", lambda r: r["tokens_per_s"]["off"]),
    ("best chain", itemgetter("best_chain")),
    ("chain tok/s", lambda r: r["tokens_per_s"]["best_chain"]),
    ("best tree", itemgetter("best_tree")),
    ("tree tok/s", lambda r: r["tokens_per_s"]["best_tree"]),
]


def _candidates(block: dict[str, Any]) -> Table:
    return column_table(
        "trees",
        CANDIDATE_COLUMNS,
        block["candidates"],
        "The trees tried: their shape, SGLang's knobs where they came from them, and the "
        "profile's acceptance length (measured for this shape, or derived)",
    )


def _by_batch(batch: dict[str, Any]) -> Table:
    return column_table(
        "chain_or_tree_by_batch",
        BY_BATCH_COLUMNS,
        batch["rows"],
        "Expected tokens per second of a decode-only step, per running batch size (the last "
        "batch size of each range)",
    )


def human(plan, block: dict[str, Any]) -> list[str]:
    lines = [f"chain or tree: {answer_text(block, plan.axis.fmt)}"]
    for item in block["per_load"]:
        lines.append(f"  {plan.axis.fmt(item['load'])}: {item['best'] or '?'} ({item['winner']})")
    return lines
