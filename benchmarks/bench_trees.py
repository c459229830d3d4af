"""Simulator speed with speculation trees against chains, at the same load.

The built-in CPU profile (``profiles/builtin-cpu.yaml``, whose ``tree_acceptance`` table holds
these trees, measured), the small drafter, exact rejection at T = 1 with i.i.d. children;
64..128-token prompts, 32..160 generated tokens, max batch 8 (the profile's measured range).
Two loads: Poisson at 4 requests/s (low load: a row or two a batch) and a closed loop of 16
clients (saturated: 8 rows).
At each load: the chain k = 3 (on its fast path, compiled where the kernels apply, as users run
it, and on the per-iteration path) and the trees 2,2,1 (10 nodes, depth 3) and 2,2,2,2 (30
nodes, depth 4), which always step per iteration.

Figures: CPU microseconds per simulated request and per engine iteration (median of
``--repeats`` runs, the variants interleaved), and, in this process, each tree's time per
request over the chain's on the fast path (what a tree costs a user's sweep) and over the chain
on the per-iteration path (the tree's own bookkeeping, path for path). The tree verifiers'
cost against the chain verifier is ``benchmarks/bench_sampler.py``'s. The last stdout line is
one JSON object; ``ratio`` is the largest tree / fast-chain time per request.

    python benchmarks/bench_trees.py [--requests N] [--repeats R]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PROFILE = REPO / "profiles" / "builtin-cpu.yaml"
LOADS = {
    "low_load": {"kind": "poisson", "rate": 4.0},
    "saturated": {"kind": "closed_loop", "concurrency": 16},
}
VARIANTS = {
    "chain_k3": ({"k": 3}, True),
    "chain_k3_per_iteration": ({"k": 3}, False),
    "tree_2,2,1": ({"tree": "2,2,1", "tree_drafts": "iid"}, True),
    "tree_2,2,2,2": ({"tree": "2,2,2,2", "tree_drafts": "iid"}, True),
}


def scenario(load: dict, speculation: dict, requests: int):
    from specsim.scenario import Scenario

    return Scenario.model_validate(
        {
            "name": "bench-trees",
            "seed": 0,
            "profile": str(PROFILE),
            "workload": {
                **load,
                "requests": requests,
                "prompt": {"dist": "uniform", "low": 64, "high": 128},
                "output": {"dist": "uniform", "low": 32, "high": 160},
            },
            "engine": {"max_batch": 8},
            "speculation": {
                "drafter": "small",
                "verifier": "rejection",
                "temperature": 1.0,
                **speculation,
            },
        }
    )


def timed(sc, fast: bool) -> tuple[float, dict]:
    from specsim.simulation import run_simulation

    cpu = time.process_time()
    summary = run_simulation(sc, fast_path=fast).summary
    return time.process_time() - cpu, summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    figures: dict[str, dict] = {}
    worst = 0.0
    for load_name, load in LOADS.items():
        scenarios = {
            name: (scenario(load, spec, args.requests), fast)
            for name, (spec, fast) in VARIANTS.items()
        }
        for sc, fast in scenarios.values():  # warm-up: imports, the profile's cache
            timed(sc, fast)
        seconds: dict[str, list[float]] = {name: [] for name in scenarios}
        summaries: dict[str, dict] = {}
        for _ in range(args.repeats):
            for name, (sc, fast) in scenarios.items():
                spent, summaries[name] = timed(sc, fast)
                seconds[name].append(spent)
        per_request = {name: statistics.median(s) / args.requests for name, s in seconds.items()}
        out: dict[str, dict] = {}
        for name, summary in summaries.items():
            median = statistics.median(seconds[name])
            out[name] = {
                "us_per_request": round(per_request[name] * 1e6, 2),
                "us_per_iteration": round(median / summary["engine_iterations"] * 1e6, 3),
                "engine_iterations": summary["engine_iterations"],
                "mean_batch": round(summary["batch_size"]["mean"], 2),
                "mean_acceptance_length": round(summary["mean_acceptance_length"], 3),
            }
            if name.startswith("tree"):
                over_fast = per_request[name] / per_request["chain_k3"]
                over_iteration = per_request[name] / per_request["chain_k3_per_iteration"]
                out[name]["vs_chain_fast_path"] = round(over_fast, 3)
                out[name]["vs_chain_per_iteration"] = round(over_iteration, 3)
                worst = max(worst, over_fast)
        figures[load_name] = out
        print(f"{load_name}: " + json.dumps(out))
    print(
        json.dumps(
            {
                "name": "bench_trees",
                "requests": args.requests,
                "repeats": args.repeats,
                "figures": figures,
                "ratio": round(worst, 3),
            }
        )
    )


if __name__ == "__main__":
    main()
