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
- ``compile_*``: a fresh process's first run (``scenarios/poisson.yaml`` for 30 s) in CPU
  seconds, on numpy alone (``numpy``), compiled with an empty kernel cache (``cold``: numba
  compiles) and again with the cache that left (``warm``: a second process on the machine);
  ``compile_warm_extra_cpu_s`` is warm minus numpy, what a second process pays for the kernels
  (target <= 1). The headline figures above exclude compiling: the warm-up run compiles first;
- ``*_speedup_vs_per_iteration``: CPU time per simulated request of the per-iteration reference
  path (``fast_path=False``) over the fast path's (steady stretches as one event), measured in
  this process one after the other, for the low-load points (target >= 10) and the saturated
  replica (target >= 2); each pair of runs is checked to give the same summary. Where numba is
  installed, the fast path runs with the compiled kernels (``*_compiled_*``, the default then)
  and with numpy alone (``*_numpy_*``, ``SPECSIM_COMPILED=0``); the unlabelled speed-up is the
  default path's;

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


def cpu_run(data: dict, fast: bool, compiled: str = "auto") -> tuple[dict, float]:
    """Summary and CPU seconds of one run (``compiled``: ``SPECSIM_COMPILED`` for it)."""
    from specsim.scenario import Scenario
    from specsim.simulation import run_simulation

    saved = os.environ.get("SPECSIM_COMPILED")
    os.environ["SPECSIM_COMPILED"] = compiled
    try:
        cpu = time.process_time()
        summary = run_simulation(Scenario.model_validate(data), fast_path=fast).summary
        return summary, time.process_time() - cpu
    finally:
        if saved is None:
            del os.environ["SPECSIM_COMPILED"]
        else:
            os.environ["SPECSIM_COMPILED"] = saved


def speedup(data: dict, name: str) -> dict:
    """The fast path's speed-up per simulated request over the per-iteration path, both run
    here one after the other (the fast one first, and again after, taking the quicker): with
    the compiled kernels where numba is installed (the default then), and with numpy alone."""
    from specsim.simulation import compiled

    variants = ["1", "0"] if compiled.available() else ["0"]
    if compiled.available():
        cpu_run(data, True, "1")  # numba's import and its cached machine code: not timed
    first = {v: cpu_run(data, True, v) for v in variants}
    reference_summary, reference = cpu_run(data, False)
    figures = {f"{name}_per_iteration_cpu_s": round(reference, 3)}
    for v in variants:
        summary, fast = first[v]
        fast = min(fast, cpu_run(data, True, v)[1])
        if summary != reference_summary:
            raise SystemExit(f"{name}: the fast path's summary differs (SPECSIM_COMPILED={v})")
        label = "compiled" if v == "1" else "numpy"
        figures[f"{name}_{label}_speedup_vs_per_iteration"] = round(reference / fast, 2)
        figures[f"{name}_{label}_cpu_s"] = round(fast, 3)
    best = "compiled" if compiled.available() else "numpy"
    figures[f"{name}_speedup_vs_per_iteration"] = figures[f"{name}_{best}_speedup_vs_per_iteration"]
    return figures


def low_load(policy: str) -> dict:
    """Requests per CPU-second and CPU microseconds per iteration of one low-load run, and the
    speed-up over the per-iteration path."""
    from specsim.simulation import compiled

    data = low_load_data(policy)
    speedups = speedup(data, f"low_load_{policy}")  # compiles the kernels first, untimed
    # The path a long run takes (``auto`` would keep these 2,000 requests on numpy).
    summary, cpu = cpu_run(data, True, "1" if compiled.available() else "0")
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
start = time.process_time()
import specsim
specsim.simulate("scenarios/poisson.yaml", workload__duration_s=30)
print(time.process_time() - start)
"""


def compile_cost() -> dict:
    """CPU seconds of a fresh process's first run: numpy, compiled cold and compiled warm."""
    from specsim.simulation import compiled

    if not compiled.available():
        return {}
    figures = {}
    with tempfile.TemporaryDirectory() as cache:
        for label, setting in (("numpy", "0"), ("cold", "1"), ("warm", "1")):
            env = {**os.environ, "SPECSIM_COMPILED": setting, "SPECSIM_CACHE_DIR": cache}
            done = subprocess.run(
                [sys.executable, "-c", FIRST_RUN],
                cwd=REPO,
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            figures[f"compile_{label}_first_run_cpu_s"] = round(float(done.stdout.split()[-1]), 2)
    extra = figures["compile_warm_first_run_cpu_s"] - figures["compile_numpy_first_run_cpu_s"]
    figures["compile_warm_extra_cpu_s"] = round(extra, 2)
    return figures


def child(requests: int) -> None:
    """Run in a subprocess: simulate, then print peak RSS (MB) and the request count."""
    with tempfile.TemporaryDirectory() as tmp:
        summary, seconds, _ = simulate(requests, Path(tmp) / "requests.csv")
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"peak_mb": peak_kb / 1024, "requests": summary["requests"], "s": seconds}))


def peak_memory(requests: int) -> dict:
    """The child's figures, on the compiled path where numba is installed (at both sizes, so
    that the growth compares like with like)."""
    from specsim.simulation import compiled

    env = {**os.environ, "SPECSIM_COMPILED": "1" if compiled.available() else "0"}
    proc = subprocess.run(
        [sys.executable, __file__, "--child", str(requests)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
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
    from specsim.simulation import compiled

    if compiled.available():  # the headline on the path a long run takes, at either size
        os.environ["SPECSIM_COMPILED"] = "1"
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
