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

SPEEDUP_KEYS = ("ttft_s", "tpot_s", "e2e_s")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("scenario", help="scenario YAML file")
    add_out(parser)
    add_set(parser)
    add_json(parser)
    parser.add_argument(
        "--compare-baseline",
        action="store_true",
        help="also run the same scenario with speculation off (k = 0) and report the speedups",
    )


def speedups(spec: dict[str, Any], base: dict[str, Any]) -> dict[str, float]:
    """Baseline over speculative latency (>1 = speculation faster); throughput the other way."""
    out: dict[str, float] = {}
    for key in SPEEDUP_KEYS:
        for stat in ("mean", "p50", "p99"):
            s, b = spec[key][stat], base[key][stat]
            out[f"{key[:-2]}_{stat}"] = b / s if s > 0 else 0.0
    s, b = spec["throughput_tokens_per_s"], base["throughput_tokens_per_s"]
    out["throughput"] = s / b if b > 0 else 0.0
    s, b = spec["cost_usd_per_million_tokens"], base["cost_usd_per_million_tokens"]
    out["cost"] = b / s if s > 0 else 0.0
    return out


def human_summary(summary: dict[str, Any], path: str) -> str:
    sc = summary["scenario"]
    spec = f"drafter {sc['drafter']}, k={sc['k']}, {sc['verifier']}" if sc["drafter"] else "off"
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
    if len(summary["pools"]) > 1:
        for name, pool in summary["pools"].items():
            lines.append(
                f"  pool {name}: {pool['requests']} requests, drafter {pool['drafter']}, "
                f"k={pool['k']}, TPOT p50 {pool['tpot_s']['p50'] * 1e3:.1f} ms, "
                f"E2E p99 {pool['e2e_s']['p99']:.2f} s"
            )
    if "speedup_vs_baseline" in summary:
        lines.extend(baseline_lines(summary))
    if summary["lossy"]:
        lines.append(f"  WARNING: {summary['lossy_note']}")
    lines.append(f"  wrote {path}/requests.csv and {path}/summary.json")
    return "\n".join(lines)


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
    if metric.split(".")[0] in SPEEDUP_KEYS:
        return f"{value * 1e3:.1f} ms"
    if metric == "throughput_tokens_per_s":
        return f"{value:.0f} tok/s"
    if metric == "goodput_requests_per_s":
        return f"{value:.2f} req/s"
    return f"${value:.3f}"


def warn_beyond_measured_k(scenario) -> None:
    """Warn where a pool's k reaches past the positions the profile measured acceptance for.

    The simulator then repeats the last measured rate (a guess); the planner refuses such k.
    """
    import warnings

    from specsim.planning.common import answerable_k
    from specsim.profile import load_profile

    profile = load_profile(scenario.resolve(scenario.profile))
    for pool in scenario.fleet.pools or [None]:
        spec = scenario.pool_speculation(pool)
        if not spec.enabled:
            continue
        limit = answerable_k(profile, spec)
        if spec.max_k > limit:
            where = f"pool {pool.name}: " if pool is not None else ""
            warnings.warn(
                f"{where}k = {spec.max_k} is beyond the {limit} positions the profile measured "
                f"acceptance for (drafter {spec.drafter!r}); the positions past {limit} repeat "
                "its last rate, a guess: profile more positions, or use acceptance: iid or "
                "sequences",
                stacklevel=2,
            )


def run(args: argparse.Namespace) -> int:
    from specsim.comparison import compare, regressions_json
    from specsim.fileio import atomic_output_dir, dump_json, write_text_atomic
    from specsim.metrics import round_floats
    from specsim.scenario import load_scenario
    from specsim.simulation import run_simulation

    scenario = load_scenario(args.scenario, args.overrides)
    warn_beyond_measured_k(scenario)
    baseline_scenario = None
    if args.compare_baseline:
        baseline_scenario = load_scenario(
            args.scenario, [*args.overrides, "speculation.k=0", "speculation.policy=fixed"]
        )
        for pool in baseline_scenario.fleet.pools:
            pool.speculation.k = 0
            pool.speculation.policy = "fixed"
    with atomic_output_dir(args.out) as staging:
        result = run_simulation(scenario, records_path=staging / "requests.csv")
        summary = dict(result.summary)
        if baseline_scenario is not None:
            base = run_simulation(baseline_scenario).summary
            summary["baseline"] = {k: v for k, v in base.items() if k != "pools"}
            summary["speedup_vs_baseline"] = {
                k: round(v, 4) for k, v in speedups(summary, base).items()
            }
            changes = compare(summary, base)
            summary["compared_vs_baseline"] = [c.metric for c in changes]
            summary["regressions_vs_baseline"] = round_floats(regressions_json(changes))
        write_text_atomic(staging / "summary.json", dump_json(summary))
    emit(args, summary, human_summary(summary, args.out))
    return 0
