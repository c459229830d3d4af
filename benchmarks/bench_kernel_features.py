"""The serving kernel's reach: CPU seconds of runs it now takes, against the same runs with the
kernel held off (the replica then steps in Python, as it did for them before the kernel knew
their rules), in one process, alternating, the quicker of ``--rounds`` each; each pair must
give the same summary. Cases:
- ``poisson apart``: ``scenarios/poisson.yaml`` (300 s) with ``engine.chunked_prefill`` false;
- ``validate-b8-tiny-k4`` and ``validate-b8-small-k2`` (closed and open loop, prefill apart,
  jitter and padded attention, on ``profiles/builtin-cpu.yaml`` less its valid ranges), at
  2,000 requests;
- ``prefix fraction``: ``scenarios/poisson.yaml`` (3,000 s) with half of each prompt cached at
  a hit rate of one half;
- ``prefix closed loop``: ``scenarios/closed_loop.yaml`` (20,000 requests), the same prefix;
- ``ranged closed loop``: that closed loop without a prefix, on its profile given a measured
  range (``outside_range: error``) on the target and the drafters that the run stays within.

``ratio`` is the first case's speed-up.

    python benchmarks/bench_kernel_features.py            # three rounds
    python benchmarks/bench_kernel_features.py --rounds 1
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import yaml

from specsim.api.overrides import override_texts
from specsim.api.simulate import prepare
from specsim.simulation import run_simulation
from specsim.simulation.compiled_serving import ServingLoop

REPO = Path(__file__).resolve().parent.parent
HALF = {"source": "fraction", "fraction": 0.5, "hit_rate": 0.5}
ROOFLINE = REPO / "profiles" / "llama3.1-8b_llama3.2-1b_h100-roofline.yaml"
RANGE = {"batch": [1, 512], "context": [0, 131072], "new_tokens": [1, 65536]}


def unranged(folder: Path) -> Path:
    """The built-in profile less its valid ranges, beside copies of the validate scenarios."""
    (folder / "profiles").mkdir()
    (folder / "scenarios").mkdir()
    for path in (REPO / "profiles").glob("builtin-cpu.*.txt"):
        shutil.copy(path, folder / "profiles" / path.name)
    profile = yaml.safe_load((REPO / "profiles" / "builtin-cpu.yaml").read_text())
    for model in [profile["target"], *profile["drafters"].values()]:
        model.get("latency", {}).pop("valid_range", None)
    (folder / "profiles" / "builtin-cpu.yaml").write_text(yaml.safe_dump(profile))
    for path in (REPO / "scenarios").glob("validate-*.yaml"):
        shutil.copy(path, folder / "scenarios" / path.name)
    return folder / "scenarios"


def ranged(folder: Path) -> Path:
    """The roofline profile with ``RANGE`` measured for the target and every drafter."""
    profile = yaml.safe_load(ROOFLINE.read_text())
    for model in [profile["target"], *profile["drafters"].values()]:
        if "latency" in model:
            model["latency"].update(valid_range=RANGE, outside_range="error")
    path = folder / ROOFLINE.name
    path.write_text(yaml.safe_dump(profile))
    return path


def cases(folder: Path) -> dict:
    """Each case: its scenario, its overrides, and a short run's to load the kernels first."""
    scenarios, poisson = unranged(folder), REPO / "scenarios" / "poisson.yaml"
    closed = REPO / "scenarios" / "closed_loop.yaml"
    apart = {"engine__chunked_prefill": False}
    validate = {
        name: (scenarios / f"{name}.yaml", {"workload__requests": 2000}, {"workload__requests": 50})
        for name in ("validate-b8-tiny-k4", "validate-b8-small-k2")
    }
    long, short = {"workload__requests": 20_000}, {"workload__requests": 50}
    profile = {"profile": str(ranged(folder))}
    return {
        "poisson apart": (poisson, apart, {**apart, "workload__duration_s": 10.0}),
        **validate,
        "prefix fraction": (
            poisson,
            {"workload__prefix": HALF, "workload__duration_s": 3000.0},
            {"workload__prefix": HALF, "workload__duration_s": 10.0},
        ),
        "prefix closed loop": (
            closed,
            {"workload__prefix": HALF, **long},
            {"workload__prefix": HALF, **short},
        ),
        "ranged closed loop": (closed, {**profile, **long}, {**profile, **short}),
    }


def cpu_run(path: Path, kernel: bool, **overrides) -> tuple[float, dict]:
    """CPU seconds of the simulation alone (the scenario and profile parsed before)."""
    scenario = prepare(path, override_texts(overrides), False)[0]
    build = ServingLoop.build
    if not kernel:
        ServingLoop.build = classmethod(lambda cls, *args, **kwargs: None)
    try:
        start = time.process_time()
        summary = run_simulation(scenario).summary
        return time.process_time() - start, summary
    finally:
        ServingLoop.build = build


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    rounds = parser.parse_args().rounds
    figures = {}
    with tempfile.TemporaryDirectory() as folder:
        for name, (path, overrides, warm_up) in cases(Path(folder)).items():
            cpu_run(path, True, **warm_up)
            seconds = {True: [], False: []}
            summaries = []
            for _ in range(rounds):
                for kernel in (False, True):
                    spent, summary = cpu_run(path, kernel, **overrides)
                    seconds[kernel].append(spent)
                    summaries.append(summary)
            assert all(s == summaries[0] for s in summaries), f"{name}: the summaries differ"
            before, after = min(seconds[False]), min(seconds[True])
            figures[name] = {
                "cpu_s_without_kernel": round(before, 3),
                "cpu_s": round(after, 3),
                "speedup": round(before / after, 2),
            }
    result = {
        "name": "kernel_features",
        "figures": figures,
        "baseline": "the same runs with the serving kernel held off, same process",
        "ratio": figures["poisson apart"]["speedup"],
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
