"""Simulator speed and memory: a saturated replica (max batch 64, k = 4, chat-like lengths).

Figures:
- ``requests_per_s``: simulated requests per wall-clock second on one core, compiling excluded
  (target >= 20,000); ``requests_per_cpu_s`` the same per CPU-second;
- ``simulated_s_per_wall_s``: simulated seconds per wall second;
- ``us_per_iteration``: wall microseconds per engine iteration;
- ``peak_rss_mb_100k`` / ``peak_rss_mb_1m``: peak resident memory of a child process that
  simulates 100,000 and 1,000,000 requests, streaming records to disk; ``memory_growth`` is their
  ratio (flat = close to 1);
- ``low_load_*``: the planner's typical point at low load (Poisson at 2 requests/s into a
  256-slot engine, 2,000 requests, mean batch about 2): requests per CPU-second and CPU
  microseconds per engine iteration for fixed k = 4 and for the adaptive window policy. Here an
  iteration emits a few tokens, so its fixed cost decides the speed;
- ``compile_*``: in a fresh process (after a run on the reference path, which imports and
  parses everything else), the first fast run of ``scenarios/poisson.yaml`` (30 s of it) less a
  second identical one, in CPU seconds: what loading the kernels costs, with an empty
  kernel cache (``cold``: numba compiles) and again with the cache that left (``warm``: a
  second process on the machine; target <= 1). The headline figures above exclude it: the
  warm-up run loads the kernels first;
- ``fleet_us_per_request_*`` and ``fleet_64_over_1``: CPU microseconds per simulated request of
  a fleet of 1, 8 and 64 replicas behind the least-outstanding router, each replica at 2
  requests/s (300 requests per replica), and the ratio of 64 to 1 (target <= 1.3);
- ``*_speedup_vs_per_iteration``: CPU time per simulated request of the per-iteration reference
  path (``fast_path=False``) over the fast path's, measured in this process one after the
  other, for the low-load points (target >= 10) and the saturated replica (target >= 2); each
  pair of runs is checked to give the same summary;

Timing is noisy on a shared machine, so every ratio is of two runs made in the same process one
after the other; ``ratio`` is the low-load fixed-k speed-up over the per-iteration path, and
``baseline_us_per_iteration`` one iteration of a plain numpy loop (five numpy calls on
batch-sized arrays: the floor of any per-iteration vectorised engine).

    python benchmarks/bench_simulator.py            # full (about two minutes)
    python benchmarks/bench_simulator.py --quick    # smaller request counts
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
PROFILE = REPO / "profiles" / "llama3.1-8b_llama3.2-1b_h100-roofline.yaml"


def scenario_data(requests: int) -> dict:
    return {
        "name": "bench-saturated",
        "seed": 1,
        "profile": str(PROFILE),
        "workload": {
            "kind": "closed_loop",
            "concurrency": 80,  # more clients than batch slots: the replica never idles
            "requests": requests,
            "prompt": {"dist": "lognormal", "median": 1000, "sigma": 0.8, "low": 16, "high": 8192},
            "output": {"dist": "lognormal", "median": 130, "sigma": 0.9, "low": 4, "high": 1024},
        },
        "engine": {"max_batch": 64},
        "speculation": {"drafter": "llama3.2-1b", "k": 4},
    }


def simulate(requests: int, records: Path | None, fast: bool = True) -> tuple[dict, float, float]:
    """Summary, wall seconds and CPU seconds of one run."""
    from specsim.scenario import Scenario
    from specsim.simulation import run_simulation

    scenario = Scenario.model_validate(scenario_data(requests))
    wall, cpu = time.perf_counter(), time.process_time()
    summary = run_simulation(scenario, records_path=records, fast_path=fast).summary
    return summary, time.perf_counter() - wall, time.process_time() - cpu


def low_load_data(policy: str) -> dict:
    data = scenario_data(2_000)
    data["name"] = f"bench-low-load-{policy}"
    data["workload"] = {**data["workload"], "kind": "poisson", "rate": 2.0}
    del data["workload"]["concurrency"]
    data["engine"] = {"max_batch": 256}
    data["speculation"] = {"drafter": "llama3.2-1b", "k": 4, "policy": policy}
    return data


def cpu_run(data: dict, fast: bool) -> tuple[dict, float]:
    """Summary and CPU seconds of one run."""
    from specsim.scenario import Scenario
    from specsim.simulation import run_simulation

    cpu = time.process_time()
    summary = run_simulation(Scenario.model_validate(data), fast_path=fast).summary
    return summary, time.process_time() - cpu


def speedup(data: dict, name: str) -> dict:
    """The fast path's speed-up per simulated request over the per-iteration path, both run
    here one after the other (the fast one first, and again after, taking the quicker)."""
    cpu_run(data, True)  # the kernels' first call: not timed
    summary, fast = cpu_run(data, True)
    reference_summary, reference = cpu_run(data, False)
    fast = min(fast, cpu_run(data, True)[1])
    if summary != reference_summary:
        raise SystemExit(f"{name}: the fast path's summary differs from the reference's")
    return {
        f"{name}_per_iteration_cpu_s": round(reference, 3),
        f"{name}_cpu_s": round(fast, 3),
        f"{name}_speedup_vs_per_iteration": round(reference / fast, 2),
    }


def fleet_data(replicas: int) -> dict:
    data = low_load_data("fixed")
    data["name"] = f"bench-fleet-{replicas}"
    data["workload"] = {**data["workload"], "rate": 2.0 * replicas, "requests": 300 * replicas}
    data["fleet"] = {"replicas": replicas, "router": "least_outstanding"}
    return data


def fleet() -> dict:
    """CPU microseconds per simulated request by fleet size, at the same load per replica."""
    figures = {}
    for replicas in (1, 8, 64):
        summary, cpu = cpu_run(fleet_data(replicas), True)
        figures[f"fleet_us_per_request_{replicas}"] = round(cpu / summary["requests"] * 1e6, 1)
    figures["fleet_64_over_1"] = round(
        figures["fleet_us_per_request_64"] / figures["fleet_us_per_request_1"], 2
    )
    return figures


def low_load(policy: str) -> dict:
    """Requests per CPU-second and CPU microseconds per iteration of one low-load run, and the
    speed-up over the per-iteration path."""
    data = low_load_data(policy)
    speedups = speedup(data, f"low_load_{policy}")  # loads the kernels first, untimed
    summary, cpu = cpu_run(data, True)
    iterations = summary["engine_iterations"]
    return {
        f"low_load_{policy}_requests_per_cpu_s": round(summary["requests"] / cpu),
        f"low_load_{policy}_us_per_iteration": round(cpu / iterations * 1e6, 1),
        f"low_load_{policy}_mean_batch": summary["batch_size"]["mean"],
        **speedups,
    }


def numpy_loop(iterations: int) -> float:
    """Wall seconds for the same number of iterations of five numpy calls on 64-element arrays."""
    rng = np.random.default_rng(0)
    a = np.full(64, 100.0)
    b = np.full(64, 3.0)
    start = time.perf_counter()
    for _ in range(iterations):
        w = rng.random(64)
        c = np.minimum(a, b)
        c += w
        a += c
        float(a.dot(b))
    return time.perf_counter() - start


FIRST_RUN = """
import os, time
import specsim
runs = []
for engine in ("reference", "fast", "fast"):  # the reference first: imports, profile parsing
    os.environ["SPECSIM_ENGINE"] = engine
    start = time.process_time()
    specsim.simulate("scenarios/poisson.yaml", workload__duration_s=30)
    runs.append(time.process_time() - start)
print(runs[1], runs[2])
"""


def compile_cost() -> dict:
    """CPU seconds a fresh process's first run pays beyond its second: cold and warm cache."""
    figures = {}
    with tempfile.TemporaryDirectory() as cache:
        for label in ("cold", "warm"):
            env = {**os.environ, "SPECSIM_CACHE_DIR": cache}
            done = subprocess.run(
                [sys.executable, "-c", FIRST_RUN],
                cwd=REPO,
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            first, second = map(float, done.stdout.split()[-2:])
            figures[f"compile_{label}_extra_cpu_s"] = round(first - second, 2)
    return figures


def child(requests: int) -> None:
    """Run in a subprocess: simulate, then print peak RSS (MB) and the request count."""
    with tempfile.TemporaryDirectory() as tmp:
        summary, seconds, _ = simulate(requests, Path(tmp) / "requests.csv")
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"peak_mb": peak_kb / 1024, "requests": summary["requests"], "s": seconds}))


def peak_memory(requests: int) -> dict:
    """The child's figures."""
    proc = subprocess.run(
        [sys.executable, __file__, "--child", str(requests)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str]) -> None:
    if argv[:1] == ["--child"]:
        child(int(argv[1]))
        return
    quick = "--quick" in argv
    small, large = (10_000, 100_000) if quick else (100_000, 1_000_000)
    # First, while this process is small: Linux keeps a process's peak resident memory across
    # exec, so a child started later would report this one's (numba's compiler included).
    mem_small = peak_memory(small)
    mem_large = peak_memory(large)
    timed_requests = 20_000 if quick else 100_000
    compiling = compile_cost()
    # Warm-up: imports, profile parsing and the kernels (compiled or loaded from the cache),
    # so that the timed run below measures simulating alone.
    simulate(2_000, None)
    summary, seconds, cpu_seconds = simulate(timed_requests, None)
    iterations = summary["engine_iterations"]
    baseline = min(numpy_loop(iterations) for _ in range(2))
    low = {**low_load("fixed"), **low_load("adaptive")}
    saturated = speedup(scenario_data(timed_requests // 5), "saturated")
    figures = {
        "requests_per_s": round(summary["requests"] / seconds),
        # CPU time of this process: what one otherwise idle core would take (the shared
        # machine's contention inflates wall time).
        "requests_per_cpu_s": round(summary["requests"] / cpu_seconds),
        "simulated_s_per_wall_s": round(summary["duration_s"] / seconds, 1),
        "us_per_iteration": round(seconds / iterations * 1e6, 1),
        "baseline_us_per_iteration": round(baseline / iterations * 1e6, 1),
        "engine_iterations": iterations,
        "mean_batch": summary["batch_size"]["mean"],
        f"peak_rss_mb_{small // 1000}k": round(mem_small["peak_mb"], 1),
        f"peak_rss_mb_{large // 1000}k": round(mem_large["peak_mb"], 1),
        "memory_growth": round(mem_large["peak_mb"] / mem_small["peak_mb"], 3),
        "requests_per_s_in_memory_run": round(mem_large["requests"] / mem_large["s"]),
        "us_per_iteration_over_numpy_loop": round(seconds / baseline, 2),
        **compiling,
        **fleet(),
        **low,
        **saturated,
    }
    print(
        json.dumps(
            {
                "name": "simulator",
                "figures": figures,
                "baseline": "the per-iteration reference path (fast_path=False), low load, "
                "fixed k, same process",
                "ratio": figures["low_load_fixed_speedup_vs_per_iteration"],
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1:])
