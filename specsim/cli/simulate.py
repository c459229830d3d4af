"""Simulate a scenario: traffic through continuously-batched replicas with speculative decoding.

Writes DIR/requests.csv (one row per request) and DIR/summary.json, atomically.

  specsim simulate scenarios/chat.yaml --out runs/chat
  specsim simulate scenarios/poisson.yaml --out runs/p --set workload.rate=8 --set speculation.k=2
  specsim simulate scenarios/chat.yaml --out runs/chat --compare-baseline   # adds the k = 0 run
"""

from __future__ import annotations

import argparse
from typing import Any

from specsim.cli.common import add_json, add_out, add_set, emit


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("scenario", metavar="SCENARIO", help="scenario YAML file")
    add_out(parser)
    add_set(parser)
    add_json(parser)
    parser.add_argument(
        "--compare-baseline",
        action="store_true",
        help="also run the same scenario with speculation off (k = 0) and report the speedups",
    )


def human_summary(summary: dict[str, Any], path: str) -> str:
    sc = summary["scenario"]
    spec = f"drafter {sc['drafter']}, k={sc['k']}, {sc['verifier']}" if sc["drafter"] else "off"
    spec += _tree_text(sc)
    lines = [
        f"{sc['name']}: {summary['requests']} requests in {summary['duration_s']:.1f} s "
        f"simulated on {sc['replicas']} replica(s) ({sc['profile_name']}); speculation {spec}",
        f"  throughput {summary['throughput_tokens_per_s']:.0f} tok/s{_steady_text(summary)}, "
        "goodput "
        f"{summary['goodput_requests_per_s']:.2f} req/s, "
        f"${summary['cost_usd_per_million_tokens']:.3f} per 1M output tokens",
    ]
    for key, label in (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("e2e_s", "E2E")):
        m = summary[key]
        lines.append(
            f"  {label:<5} mean {m['mean'] * 1e3:8.1f} ms  p50 {m['p50'] * 1e3:8.1f}  "
            f"p90 {m['p90'] * 1e3:8.1f}  p99 {m['p99'] * 1e3:8.1f}"
        )
    if sc["drafter"]:
        lines.append(
            f"  acceptance length {summary['mean_acceptance_length']:.2f}, draft acceptance rate "
            f"{summary['draft_acceptance_rate']:.2f}, wasted FLOPs "
            f"{summary['flops_wasted_fraction'] * 100:.1f}%"
        )
    lines.append(
        f"  batch mean {summary['batch_size']['mean']:.1f} (max {summary['batch_size']['max']}), "
        f"KV cache {summary['kv_cache_utilisation']['mean'] * 100:.0f}% used, "
        f"{summary['preemptions']} preemptions"
    )
    if summary.get("profile_derived"):
        lines.append(f"  profile derived: {summary['profile_derived']}")
    if len(summary["pools"]) > 1:
        for name, pool in summary["pools"].items():
            lines.append(
                f"  pool {name}: {pool['requests']} requests, drafter {pool['drafter']}, "
                f"k={pool['k']}{_tree_text(pool)}, TPOT p50 {pool['tpot_s']['p50'] * 1e3:.1f} ms, "
                f"E2E p99 {pool['e2e_s']['p99']:.2f} s"
            )
    if "speedup_vs_baseline" in summary:
        lines.extend(baseline_lines(summary))
    if summary["lossy"]:
        lines.append(f"  WARNING: {summary['lossy_note']}")
    lines.append(f"  wrote {path}/requests.csv and {path}/summary.json")
    return "\n".join(lines)


def _tree_text(settings: dict[str, Any]) -> str:
    """', tree 2,2,1 (10 nodes; 2,4,4 per depth; iid, measured)' for a tree pool (a tree that
    is not full: 'tree of 5 nodes'); nothing for a chain."""
    from specsim.tree import TreeShape

    tree = settings.get("tree")
    if not tree:
        return ""
    widths = ",".join(map(str, tree["nodes_per_depth"]))
    branching = TreeShape.from_paths(tree["paths"]).full_branching
    name = "tree of" if branching is None else f"tree {','.join(map(str, branching))} ("
    nodes = f"{tree['nodes']} nodes; {widths} per depth; {tree['drafts']}, {tree['source']}"
    return f", {name} {nodes})" if branching is None else f", {name}{nodes})"


def _steady_text(summary: dict[str, Any]) -> str:
    steady = summary.get("throughput_tokens_per_s_steady")
    if steady is None:
        return ""
    start, end = summary["steady_window_s"]
    return f" ({steady:.0f} tok/s steady, every client active from {start:.1f} to {end:.1f} s)"


def baseline_lines(summary: dict[str, Any]) -> list[str]:
    """The speed-ups over speculation off, then every compared metric that got worse."""
    from specsim.comparison import Change

    sp = summary["speedup_vs_baseline"]
    lines = [
        f"  vs speculation off (means): TTFT {sp['ttft_mean']:.2f}x, TPOT {sp['tpot_mean']:.2f}x, "
        f"E2E {sp['e2e_mean']:.2f}x, throughput {sp['throughput']:.2f}x, cost "
        f"{sp['cost']:.2f}x (>1 = speculation better)"
    ]
    worse = summary["regressions_vs_baseline"]
    compared = len(summary["compared_vs_baseline"])
    if not worse:
        lines.append(f"  worse with speculation: none of the {compared} compared metrics")
        return lines
    lines.append(f"  worse with speculation ({len(worse)} of {compared} compared metrics):")
    for item in worse:
        change = Change(**item)
        lines.append(
            f"    {change.words()} ({_value_text(change.metric, change.value)} against "
            f"{_value_text(change.metric, change.baseline)})"
        )
    return lines


def _value_text(metric: str, value: float) -> str:
    from specsim.api.simulate import SPEEDUP_KEYS

    if metric.split(".")[0] in SPEEDUP_KEYS:
        return f"{value * 1e3:.1f} ms"
    if metric == "throughput_tokens_per_s":
        return f"{value:.0f} tok/s"
    if metric == "goodput_requests_per_s":
        return f"{value:.2f} req/s"
    return f"${value:.3f}"


def run(args: argparse.Namespace) -> int:
    from specsim.api.simulate import prepare, simulate_into
    from specsim.fileio import atomic_output_dir

    scenario, baseline = prepare(args.scenario, args.overrides, args.compare_baseline)
    with atomic_output_dir(args.out) as staging:
        summary = simulate_into(staging, scenario, baseline)
    emit(args, summary, human_summary(summary, args.out))
    return 0
