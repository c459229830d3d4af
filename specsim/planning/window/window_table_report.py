"""The k-by-batch table's part of the ``plan window`` report: its verdict in words, the check
against static k at every load, and the serving-config file."""

from __future__ import annotations

import json
import textwrap
from typing import Any

from specsim.planning.report import Column, Paragraph, Table, column_table
from specsim.planning.window.window import WindowPlan
from specsim.planning.window.window_table import RECOMMENDED, vllm_ranges


def verdict_text(table: dict[str, Any]) -> str:
    """The verdict in one sentence, as the report, the terminal and the YAML file say it."""
    if not table["rows"]:
        return f"No k-by-batch table: {table['reason']}."
    if table["verdict"] == RECOMMENDED:
        return f"The k-by-batch table is recommended: {table['reason']}."
    return f"The k-by-batch table is not recommended: {table['reason']}."


def off_text(plan: WindowPlan, outcome: dict[str, Any]) -> str | None:
    """The advice to turn speculation off above X, when k = 0 wins at every load above X."""
    cross = outcome["crossover"]
    axis = plan.axis
    if cross["load"] is None:
        return None
    if cross["last_paying"] is None:
        return (
            "**Turn speculation off**: k = 0 with no drafter deployed is best at every load swept."
        )
    return (
        f"**Turn speculation off above {axis.fmt(cross['last_paying'])}**: from "
        f"{axis.fmt(cross['load'])} on, k = 0 with no drafter deployed is best at every load "
        f"swept (speculation still pays at {axis.fmt(cross['last_paying'])}; the switch lies "
        "between). No k-by-batch table can do that: a table keeps the drafter deployed, and its "
        "k = 0 rows still pay for the drafter's memory, its prefill of every prompt and its "
        "KV-sync pass."
    )


def table_section(plan: WindowPlan, outcome: dict[str, Any], summary: dict[str, Any]) -> list:
    table = summary["k_by_batch"]
    rows: list[dict[str, int]] = outcome["rows"]
    blocks: list = [
        Paragraph(
            "For each running batch size, the k whose decode step emits the most expected tokens "
            "per second with the drafter deployed, from the profile's step costs and acceptance "
            "(the adaptive policy's rule on a decode-only batch) at "
            + (
                f"{table['context_tokens_per_sequence']:.0f} context tokens per sequence (the "
                "mean a running sequence held in the best static runs where speculation pays). "
                if table["context_tokens_per_sequence"] is not None
                else "the sweep's context. "
            )
            + "It is not read off the best k per load: the batch a load runs at depends on the "
            "k it runs, and static k = 0 deploys no drafter, which no row of a table can do. "
            "The table is then simulated at every load and set against the best static k there."
        ),
        Paragraph(verdict_text(table)),
    ]
    if rows:
        blocks.append(
            Table(
                "k_by_batch",
                ["batch from", "batch to", "k"],
                [[r[0], r[1], r[2]] for r in vllm_ranges(rows)],
                "Window size by running batch size",
            )
        )
        blocks.append(check_table(plan, table))
    return blocks


def check_table(plan: WindowPlan, table: dict[str, Any]) -> Table:
    def of(side: str, key: str):  # "table" (its run) or "best_static" (the best static k)
        return lambda item: (item[side] or {}).get(key)

    columns: list[Column] = [
        (plan.axis.label, lambda item: item["load"]),
        ("best static k", of("best_static", "k")),
        ("static goodput (req/s)", of("best_static", "goodput_requests_per_s")),
        ("table goodput (req/s)", of("table", "goodput_requests_per_s")),
        ("static e2e mean (s)", of("best_static", "e2e_mean_s")),
        ("table e2e mean (s)", of("table", "e2e_mean_s")),
        ("static TPOT p99 (s)", of("best_static", "tpot_p99_s")),
        ("table TPOT p99 (s)", of("table", "tpot_p99_s")),
        ("table vs static", lambda item: item["outcome"]),
        ("judged", lambda item: "yes" if item["judged"] else "no (speculation off wins)"),
    ]
    return column_table(
        "k_by_batch_check",
        columns,
        table["per_load"],
        "The table's own simulation against the best static k at each load",
    )


def serving_config(plan: WindowPlan, rows: list[dict[str, int]], table: dict[str, Any]) -> str:
    """The k-by-batch table as a YAML file with both engine forms, its verdict on top."""
    spec = plan.scenario.speculation
    verdict = textwrap.wrap(verdict_text(table), 94)
    lines = [*[f"# {line}" for line in verdict]]
    if not rows:
        lines += ["specsim:", "  speculation:", "    k: 0", "vllm: {speculative_config: null}"]
        return "\n".join(lines) + "\n"
    vllm = {
        "num_speculative_tokens": max(r["k"] for r in rows),
        "num_speculative_tokens_per_batch_size": vllm_ranges(rows),
    }
    lines += [
        f"# k by running batch size for drafter {spec.drafter} ({spec.verifier} verifier),",
        f"# derived by 'specsim plan window' from scenario {plan.scenario.name!r}.",
        "# specsim scenario form (under speculation:):",
        "specsim:",
        "  speculation:",
        "    policy: by_batch",
        "    k_by_batch:",
        *[f"    - {{max_batch: {r['max_batch']}, k: {r['k']}}}" for r in rows],
        "# vLLM --speculative-config fields (add method and model); ranges are",
        "# [first batch size, last batch size, k]:",
        f"vllm: {{speculative_config: {json.dumps(vllm)}}}",
    ]
    return "\n".join(lines) + "\n"
