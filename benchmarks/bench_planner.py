"""Planner sweep throughput: 3 drafters x 9 values of k x 9 loads, 2,000 requests per simulation.

Measures, in one process on this machine:

- the wall time of the full 243-simulation drafter-swap sweep on a local pool of 2 workers
  (target: under 15 s on 2 cores), and its speed-up over running the same simulations one after
  another (estimated from a stratified sample of them run serially in this process);
- the fast path's speed-up over the per-iteration reference path on that sample, both run
  serially here one after the other (``SPECSIM_ENGINE=reference``; target >= 5), and the sweep's
  wall time estimated for the per-iteration path from it (the fast path's kernels come from
  numba's on-disk cache, in every worker);
- the speed-up of the Dask path with 2 worker processes over 1 (``LocalCluster``), on the same
  24 simulations;
- the planner's own overhead: the same sweep rerun with every point already on disk (keys,
  reading results), which is all the sweep engine adds to the simulations themselves;
- the same sweep screened (``specsim.planning.sweep.screen``, as ``plan window --screen`` screens
  each drafter's grid: k = 0 always simulated): its wall time, how many it simulated, and whether
  its best k per drafter and load is the exhaustive sweep's;
- the README tour's ``plan window`` command at ``--workers 1`` (``TOUR``), a fresh process, in CPU
  seconds against a fixed pure-Python reference loop run the same way (``REFERENCE_LOOP``: a
  SimPy single-server queue, the simulator's kind of Python without specsim), each run
  ``TOUR_RUNS`` times alternately; and the tour's CPU in parts (simulations, report, the rest:
  imports, inputs, the CLI), timed inside one more run (``TIMED_TOUR``).

The third drafter is a benchmark fixture: a copy of the 1B drafter with acceptance raised by 0.05
per position, so that the sweep has three drafters on the shipped profile. The last stdout line is
the JSON record ``benchmarks/run.py`` reads.

    python benchmarks/bench_planner.py            # the full measurement (several minutes)
    python benchmarks/bench_planner.py --quick    # 200 requests per simulation, for a smoke run
    python benchmarks/bench_planner.py --tour     # the README tour against the reference loop only
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import yaml

REPO = Path(__file__).resolve().parent.parent
PROFILE = REPO / "profiles" / "llama3.1-8b_llama3.2-1b_h100-roofline.yaml"
LOADS = [1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 10.0, 12.0, 14.0]
DRAFTERS = ["llama3.2-1b", "ngram", "llama3.2-1b-tuned"]
SERIAL_SAMPLE = 12
DASK_POINTS = 24
TOUR = [
    "plan",
    "window",
    "scenarios/poisson.yaml",
    "--k",
    "0..4",
    "--loads",
    "2",
    "6",
    "10",
    "14",
    "--workers",
    "1",
]
TOUR_RUNS = 3
# A fixed amount of interpreted work (a few CPU seconds): the machine's speed at the
# simulator's kind of Python, so that the tour's ratio to it holds across machines and load.
REFERENCE_LOOP = """
import random, simpy
rng, env, server, waits = random.Random(0), simpy.Environment(), None, []
server = simpy.Resource(env, capacity=1)
def customer(env):
    arrived = env.now
    with server.request() as turn:
        yield turn
        waits.append(env.now - arrived)
        yield env.timeout(rng.expovariate(1.0))
def arrivals(env):
    for _ in range(150_000):
        yield env.timeout(rng.expovariate(0.9))
        env.process(customer(env))
env.process(arrivals(env))
env.run()
"""
# The tour's command with the process time of its simulations and of its report summed as they
# run, written as JSON to argv[1]. Timed in place, not under a profiler: a profiler's own cost
# is higher per call in interpreted code, so it inflates the report against the compiled kernels.
TIMED_TOUR = """
import json, runpy, sys, time
import specsim.planning.report as report
import specsim.simulation as simulation
spent = {"simulations": 0.0, "report": 0.0}
def timed(part, function):
    def run(*args, **kwargs):
        started = time.process_time()
        try:
            return function(*args, **kwargs)
        finally:
            spent[part] += time.process_time() - started
    return run
simulation.run_simulation = timed("simulations", simulation.run_simulation)
report.write_report = timed("report", report.write_report)
parts, sys.argv = sys.argv[1], ["specsim", *sys.argv[2:]]
try:
    runpy.run_module("specsim", run_name="__main__", alter_sys=True)
finally:
    with open(parts, "w") as file:
        json.dump(spent, file)
"""


def write_inputs(folder: Path, requests: int) -> Path:
    profile = yaml.safe_load(PROFILE.read_text())
    profile["drafters"]["llama3.2-1b-tuned"] = dict(profile["drafters"]["llama3.2-1b"])
    tuned = []
    for entry in profile["acceptance"]:
        if entry["drafter"] == "llama3.2-1b":
            copy = dict(entry, drafter="llama3.2-1b-tuned")
            copy["per_position"] = [min(0.95, a + 0.05) for a in entry["per_position"]]
            copy.pop("mean_acceptance_length", None)
            tuned.append(copy)
    profile["acceptance"] += tuned
    (folder / "profile.yaml").write_text(yaml.safe_dump(profile, sort_keys=False))
    scenario = {
        "name": "bench-planner",
        "seed": 1,
        "profile": "profile.yaml",
        "workload": {
            "kind": "poisson",
            "rate": 4.0,
            "requests": requests,
            "prompt": {"dist": "lognormal", "median": 1000, "sigma": 0.8, "low": 16, "high": 8192},
            "output": {"dist": "lognormal", "median": 130, "sigma": 0.9, "low": 4, "high": 1024},
        },
        "engine": {"max_batch": 256},
        "speculation": {"drafter": "llama3.2-1b", "k": 4, "verifier": "rejection"},
        "slo": {"ttft_s": 1.0, "tpot_s": 0.05},
    }
    path = folder / "scenario.yaml"
    path.write_text(yaml.safe_dump(scenario, sort_keys=False))
    return path


def summary_of(path: Path) -> dict:
    """A point file's summary (its ``cpu_s`` is measured, so it differs between runs)."""
    return json.loads(path.read_text())["summary"]


def point_files(folder: Path) -> list[Path]:
    """The per-point result files a sweep wrote, relative to its folder (not its log)."""
    return sorted(
        p.relative_to(folder)
        for p in folder.rglob("*.json")
        if p.is_file() and p.name != "sweep.json"
    )


def timed_sweep(out: Path, points, **options) -> tuple[float, int]:
    seconds, results = timed_results(out, points, **options)
    return seconds, sum(not r.ok for r in results)


def timed_results(out: Path, points, **options) -> tuple[float, list]:
    from specsim.planning.sweep.sweeper import Sweeper

    started = time.perf_counter()
    with Sweeper(out, {"command": "bench"}, progress=False, **options) as sweeper:
        results = sweeper.run(points)
    return time.perf_counter() - started, results


def best_k(results, use_slo: bool) -> dict:
    """The planner's best k per (drafter, load), from the results that ran."""
    from specsim.planning.common import choose

    groups: dict = {}
    for r in results:
        if r is not None and r.ok:
            key = (r.tags["drafter"], r.tags["load"])
            groups.setdefault(key, []).append((r.tags["config"], r.summary))
    return {key: choose(items, use_slo) for key, items in sorted(groups.items())}


def timed_screen(out: Path, points, use_slo: bool) -> tuple[float, object]:
    """The same sweep screened as ``plan window --screen`` screens each drafter's grid."""
    from specsim.planning.sweep.screen import screen_grid
    from specsim.planning.sweep.sweeper import Sweeper

    started = time.perf_counter()
    with Sweeper(out, {"command": "bench"}, progress=False, workers=2) as sweeper:
        outcome = screen_grid(
            points,
            group=lambda p: (p.tags["drafter"], p.tags["load"]),
            label=lambda p: p.tags["config"],
            use_slo=use_slo,
            sweeper=sweeper,
            always=lambda p: p.tags["config"] == "k=0",
        )
    return time.perf_counter() - started, outcome


def child_cpu_s(argv: list[str], out: Path | None = None) -> float:
    """CPU seconds (user and system) of one child process running ``argv`` in the repository."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, cwd=REPO, check=True, capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def tour(folder: Path) -> dict:
    """The README tour's ``plan window`` (a fresh folder per run, so it simulates every point)
    against the reference loop, alternately; then its CPU in parts, from one more run."""
    tour_s, reference_s = [], []
    for run in range(TOUR_RUNS):
        out = folder / f"tour{run}"
        tour_s.append(child_cpu_s([sys.executable, "-m", "specsim", *TOUR, "--out", str(out)]))
        reference_s.append(child_cpu_s([sys.executable, "-c", REFERENCE_LOOP]))
    parts = tour_parts(folder / "tour-timed")
    ratios = [t / r for t, r in zip(tour_s, reference_s, strict=True)]
    total = sum(parts.values())
    return {
        "tour_cpu_s": [round(t, 2) for t in tour_s],
        "reference_loop_cpu_s": [round(r, 2) for r in reference_s],
        "tour_over_reference": [round(r, 3) for r in ratios],
        "tour_over_reference_median": round(statistics.median(ratios), 3),
        "tour_target_ratio": 1.4,
        "tour_parts_cpu_s": {name: round(cpu, 2) for name, cpu in parts.items()},
        **{f"tour_{name}_share": round(cpu / total, 3) for name, cpu in parts.items()},
    }


def tour_parts(out: Path) -> dict:
    """CPU seconds of one tour run in parts: its simulations, its report (figures and tables
    written), and the rest (imports, reading inputs, the CLI)."""
    spent = out.with_suffix(".json")
    total = child_cpu_s([sys.executable, "-c", TIMED_TOUR, str(spent), *TOUR, "--out", str(out)])
    parts = json.loads(spent.read_text())
    return {**parts, "rest": total - sum(parts.values())}


@contextmanager
def environment(**values: str):
    """Set environment variables for the block (sweep workers in this process read them)."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value


def main(argv: list[str]) -> dict:
    if "--tour" in argv:
        with tempfile.TemporaryDirectory(prefix="bench-tour-") as tmp:
            return {"name": "planner-tour", "figures": tour(Path(tmp))}
    from dask.distributed import LocalCluster

    from specsim.planning.swap import swap

    requests = 200 if "--quick" in argv else 2000
    with tempfile.TemporaryDirectory(prefix="bench-planner-") as tmp:
        folder = Path(tmp)
        scenario = write_inputs(folder, requests)
        plan = swap.prepare(str(scenario), [], DRAFTERS, None, list(range(9)), LOADS, None)
        points = [p for d in plan.drafters for p in swap._tagged(d)]
        assert len(points) == 243, len(points)

        # Baseline: a stratified sample of the same simulations, one after another, here.
        sample = points[:: len(points) // SERIAL_SAMPLE][:SERIAL_SAMPLE]
        timed_sweep(folder / "warm-up", sample[:2], workers=1)  # loading the kernels: untimed
        serial_s, _ = timed_sweep(folder / "serial", sample, workers=1)
        serial_estimate = serial_s / len(sample) * len(points)
        # The same sample on the per-iteration path (workers=1 runs in this process).
        with environment(SPECSIM_ENGINE="reference"):
            reference_s, _ = timed_sweep(folder / "reference", sample, workers=1)
        files = point_files(folder / "serial")
        same = len(files) == len(sample) and all(
            summary_of(folder / "serial" / p) == summary_of(folder / "reference" / p) for p in files
        )

        wall, results = timed_results(folder / "pool", points, workers=2)
        failed = sum(not r.ok for r in results)
        # The planner's own cost: the same sweep again, every point read back from disk.
        cached_s, _ = timed_sweep(folder / "pool", points, workers=2)
        # Screened: estimated first, only the k that can win simulated (a fresh folder).
        use_slo = plan.first.use_slo
        screened_s, screened = timed_screen(folder / "screened", points, use_slo)
        screened_same = best_k(screened.results, use_slo) == best_k(results, use_slo)

        subset = points[:: len(points) // DASK_POINTS][:DASK_POINTS]
        dask_wall = {}
        for workers in (1, 2):
            with LocalCluster(
                n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None
            ) as cluster:
                dask_wall[workers], _ = timed_sweep(
                    folder / f"dask{workers}", subset, cluster=cluster.scheduler_address
                )
        tour_figures = tour(folder)
    dask_speedup = dask_wall[1] / dask_wall[2]
    return {
        "name": "planner",
        "figures": {
            "simulations": len(points),
            "requests_per_simulation": requests,
            "pool_workers": 2,
            "sweep_wall_s": round(wall, 2),
            "target_wall_s": 15.0,
            "sample_serial_s": round(serial_s, 2),
            "sample_per_iteration_s": round(reference_s, 2),
            "speedup_vs_per_iteration": round(reference_s / serial_s, 2),
            "per_iteration_sweep_estimate_s": round(wall * reference_s / serial_s, 2),
            "sample_results_identical": same,
            "simulations_per_s": round(len(points) / wall, 3),
            "serial_estimate_s": round(serial_estimate, 2),
            "pool_speedup_vs_serial": round(serial_estimate / wall, 3),
            "failed_points": failed,
            "resume_all_cached_s": round(cached_s, 3),
            "screened_sweep_wall_s": round(screened_s, 2),
            "screened_simulated": screened.simulated,
            "screened_pruned": len(screened.pruned),
            "screened_best_k_equal_exhaustive": screened_same,
            "dask_points": len(subset),
            "dask_1_worker_s": round(dask_wall[1], 2),
            "dask_2_workers_s": round(dask_wall[2], 2),
            "cpus": len(os.sched_getaffinity(0)),
            **tour_figures,
        },
        "baseline": f"Dask LocalCluster with 1 worker on the same {len(subset)} simulations",
        "ratio": round(dask_speedup, 3),
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])), flush=True)
