"""Screened sweep throughput: about 5,000 configurations ranked by the closed-form estimate, only
those that can win simulated, on a local pool of 2 workers.

The configurations: at each of 55 arrival rates (0.16 to 8.8 req/s, from idle to where the
busiest 10 s of the run near the replica's limit), speculation off and, for each of five
drafters, k = 1..8 and the adaptive policy, each at two batch limits (64, 256): 55 x 92 = 5,060.
The drafters are the three of ``bench_planner`` (the 1B drafter, n-gram lookup, the 1B with
acceptance raised by 0.05) and two more fixtures of the same kind, the 1B with acceptance
lowered by 0.1 and raised by 0.1. A load's winner is the planner's choice among its
configurations (``common.choose``: mean end-to-end latency, the scenario setting no SLO). Each
simulation serves 500 requests.

Measures, in one process on this machine:

- the screened sweep's wall time (target: 60 s on 2 cores), its estimates' and simulations'
  shares, how many configurations it simulated and pruned;
- every configuration of three of the loads (276) simulated exhaustively, and whether the
  screened sweep's winners at those loads are the exhaustive ones (they must be);
- the ratio: the exhaustive sweep's time per configuration, extrapolated to all 5,060, over the
  screened sweep's wall time.

    python benchmarks/bench_screen.py            # the full measurement (a few minutes)
    python benchmarks/bench_screen.py --quick    # 5 loads, 200 requests: a smoke run
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_planner import DRAFTERS, write_inputs

LOADS = [round(0.16 * i, 6) for i in range(1, 56)]
QUICK_LOADS = [1.0, 3.0, 5.0, 7.0, 9.0]
CHECKED_LOADS = [0.8, 4.8, 8.8]  # every configuration simulated at these
QUICK_CHECKED = [1.0, 5.0, 9.0]
MAX_BATCH = [64, 256]
# Fixtures beside bench_planner's: the 1B drafter with every per-position rate shifted.
SHIFTED = {"llama3.2-1b-weak": -0.1, "llama3.2-1b-strong": 0.1}
ALL_DRAFTERS = [*DRAFTERS, *SHIFTED]


def write_screen_inputs(folder: Path, requests: int) -> Path:
    """bench_planner's scenario and profile, with the two shifted drafters added."""
    import yaml

    scenario = write_inputs(folder, requests)
    path = folder / "profile.yaml"
    profile = yaml.safe_load(path.read_text())
    for name, shift in SHIFTED.items():
        profile["drafters"][name] = dict(profile["drafters"]["llama3.2-1b"])
        for entry in list(profile["acceptance"]):
            if entry["drafter"] == "llama3.2-1b":
                copy = dict(entry, drafter=name)
                copy["per_position"] = [
                    min(0.97, max(0.05, a + shift)) for a in entry["per_position"]
                ]
                copy.pop("mean_acceptance_length", None)
                profile["acceptance"].append(copy)
    path.write_text(yaml.safe_dump(profile, sort_keys=False))
    return scenario


WORKERS = 2


def configurations() -> list[tuple[str, list[str]]]:
    """(label, overrides) of one load's configurations."""
    configs = []
    for batch in MAX_BATCH:
        engine = [f"engine.max_batch={batch}"]
        configs.append((f"off b{batch}", [*engine, "speculation.k=0"]))
        for drafter in ALL_DRAFTERS:
            spec = [f"speculation.drafter={drafter}"]
            for k in range(1, 9):
                fixed = [*spec, f"speculation.k={k}", "speculation.policy=fixed"]
                configs.append((f"{drafter} k={k} b{batch}", [*engine, *fixed]))
            adaptive = [*spec, "speculation.k=8", "speculation.policy=adaptive"]
            configs.append((f"{drafter} adaptive b{batch}", [*engine, *adaptive]))
    return configs


def points(scenario: Path, loads: list[float]):
    from specsim.planning.sweep.points import SweepPoint

    return [
        SweepPoint.make(
            scenario, ["slo=null", f"workload.rate={load!r}", *extra], load=load, config=label
        )
        for load in loads
        for label, extra in configurations()
    ]


def winners(results) -> dict[float, str]:
    from specsim.planning.common import choose

    groups: dict[float, list] = {}
    for result in results:
        if result is not None and result.ok:
            groups.setdefault(result.tags["load"], []).append(
                (result.tags["config"], result.summary)
            )
    return {load: choose(items, use_slo=False) for load, items in sorted(groups.items())}


def main(argv: list[str]) -> dict:
    from specsim.planning.sweep.screen import screen_grid
    from specsim.planning.sweep.sweeper import Sweeper

    quick = "--quick" in argv
    loads = QUICK_LOADS if quick else LOADS
    requests = 200 if quick else 500
    with tempfile.TemporaryDirectory(prefix="bench-screen-") as tmp:
        folder = Path(tmp)
        scenario = write_screen_inputs(folder, requests)
        grid = points(scenario, loads)

        started = time.perf_counter()
        with Sweeper(
            folder / "screened", {"command": "bench"}, progress=False, workers=WORKERS
        ) as sweeper:
            screened = screen_grid(
                grid,
                group=lambda p: p.tags["load"],
                label=lambda p: p.tags["config"],
                use_slo=False,
                sweeper=sweeper,
            )
            simulate_s = sweeper.stats.seconds
        screened_s = time.perf_counter() - started

        check = QUICK_CHECKED if quick else CHECKED_LOADS
        checked = [p for p in grid if p.tags["load"] in check]
        started = time.perf_counter()
        with Sweeper(
            folder / "exhaustive", {"command": "bench"}, progress=False, workers=WORKERS
        ) as sweeper:
            exhaustive = sweeper.run(checked)
        exhaustive_s = time.perf_counter() - started

    found = winners(screened.results)
    truth = winners(exhaustive)
    same = all(found.get(load) == best for load, best in truth.items())
    per_config = exhaustive_s / len(checked)
    return {
        "name": "screen",
        "figures": {
            "configurations": len(grid),
            "loads": len(loads),
            "requests_per_simulation": requests,
            "pool_workers": WORKERS,
            "screened_wall_s": round(screened_s, 2),
            "target_wall_s": 60.0,
            "screened_simulation_s": round(simulate_s, 2),
            "screened_estimate_and_rest_s": round(screened_s - simulate_s, 2),
            "simulated": screened.simulated,
            "pruned": len(screened.pruned),
            "estimate_failures": screened.estimate_failures,
            "checked_configurations": len(checked),
            "checked_exhaustive_s": round(exhaustive_s, 2),
            "checked_winners": {str(load): best for load, best in truth.items()},
            "screened_winners_equal_exhaustive": same,
            "exhaustive_estimate_s": round(per_config * len(grid), 1),
            "cpus": len(os.sched_getaffinity(0)),
        },
        "baseline": "every configuration simulated, extrapolated from the checked loads' time "
        "per configuration",
        "ratio": round(per_config * len(grid) / screened_s, 2),
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])), flush=True)
