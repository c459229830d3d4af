"""Where the simulator's time goes: cProfile of one of ``bench_simulator.py``'s scenarios.

    python benchmarks/profile_simulator.py low        # low load, fixed k = 4, 2,000 requests
    python benchmarks/profile_simulator.py adaptive   # low load, adaptive window
    python benchmarks/profile_simulator.py saturated  # batch 64, 4,000 requests

One warm run first (imports, the profile file, numba's cached kernels), then the profiled run;
prints CPU seconds, requests and iterations, then the top functions by own time.
"""

from __future__ import annotations

import cProfile
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_simulator


def main(argv: list[str]) -> None:
    from specsim.scenario import Scenario
    from specsim.simulation import run_simulation

    which = argv[0] if argv else "low"
    scenarios = {
        "low": lambda: bench_simulator.low_load_data("fixed"),
        "adaptive": lambda: bench_simulator.low_load_data("adaptive"),
        "saturated": lambda: bench_simulator.scenario_data(4000),
    }
    if which not in scenarios:
        raise SystemExit(f"unknown scenario {which!r}; fix: one of {', '.join(scenarios)}")
    scenario = Scenario.model_validate(scenarios[which]())
    fast = "--reference" not in argv
    run_simulation(scenario, fast_path=fast)
    profile = cProfile.Profile()
    cpu = time.process_time()
    profile.enable()
    summary = run_simulation(scenario, fast_path=fast).summary
    profile.disable()
    cpu = time.process_time() - cpu
    print(
        f"{which}: {cpu:.3f} CPU s profiled, {summary['requests']} requests, "
        f"{summary['engine_iterations']} iterations"
    )
    pstats.Stats(profile).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main(sys.argv[1:])
