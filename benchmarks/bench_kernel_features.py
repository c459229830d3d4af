"""The serving kernel's reach: CPU seconds of runs it now takes, against the same runs with the
kernel held off for them (the paths that ran them before: stretches and the decode loop).

Figures, each a ratio of CPU seconds of two runs made in this process one after the other,
alternating (the quicker of ``REPEATS`` each), with the two runs' summaries checked equal:
- ``prefix_fraction_*``: ``scenarios/poisson.yaml`` (3,000 s of it) with half of each prompt
  cached at a hit rate of one half (a lone replica on an open loop);
- ``prefix_closed_loop_*``: ``scenarios/closed_loop.yaml`` (20,000 requests) with the same
  prefix;
- ``ranged_closed_loop_*``: that closed loop without a prefix, on its profile given a measured
  range (``outside_range: error``) on the target and the drafter that the run stays within.

    python benchmarks/bench_kernel_features.py
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
REPEATS = 5
HALF = {"source": "fraction", "fraction": 0.5, "hit_rate": 0.5}
PROFILE = REPO / "profiles" / "llama3.1-8b_llama3.2-1b_h100-roofline.yaml"
RANGE = {"batch": [1, 512], "context": [0, 131072], "new_tokens": [1, 65536]}
LONG = {"workload__requests": 20_000}
CASES = {
    "prefix_fraction": ("poisson.yaml", {"workload__prefix": HALF, "workload__duration_s": 3000}),
    "prefix_closed_loop": ("closed_loop.yaml", {"workload__prefix": HALF, **LONG}),
    "ranged_closed_loop": ("closed_loop.yaml", LONG),  # and the ranged profile (``main``)
}


def ranged_profile(folder: Path) -> Path:
    """``PROFILE`` with ``RANGE`` measured for the target and every drafter."""
    profile = yaml.safe_load(PROFILE.read_text())
    for model in [profile["target"], *profile["drafters"].values()]:
        if "latency" in model:
            model["latency"].update(valid_range=RANGE, outside_range="error")
    path = folder / PROFILE.name
    path.write_text(yaml.safe_dump(profile))
    return path


def cpu_run(name: str, overrides: dict, kernel: bool) -> tuple[dict, float]:
    """Summary and CPU seconds of one run, the serving kernel on or held off."""
    import specsim
    from specsim.simulation.compiled_serving import ServingLoop

    build = ServingLoop.build
    if not kernel:
        ServingLoop.build = classmethod(lambda cls, *args, **kwargs: None)
    try:
        cpu = time.process_time()
        summary = specsim.simulate(str(REPO / "scenarios" / name), **overrides).summary
        return summary, time.process_time() - cpu
    finally:
        ServingLoop.build = build


def measure(case: str) -> dict:
    name, overrides = CASES[case]
    cpu_run(name, overrides, True)  # the kernels' first call: not timed
    on, off = [], []
    for _ in range(REPEATS):
        summary, seconds = cpu_run(name, overrides, True)
        on.append(seconds)
        held_off, seconds = cpu_run(name, overrides, False)
        off.append(seconds)
        if summary != held_off:
            raise SystemExit(f"{case}: the kernel's summary differs from the other paths'")
    return {
        f"{case}_cpu_s": round(min(on), 3),
        f"{case}_without_kernel_cpu_s": round(min(off), 3),
        f"{case}_speedup": round(min(off) / min(on), 2),
    }


def main() -> None:
    figures = {}
    with tempfile.TemporaryDirectory() as folder:
        CASES["ranged_closed_loop"] = (
            "closed_loop.yaml",
            {**LONG, "profile": str(ranged_profile(Path(folder)))},
        )
        for case in CASES:
            figures.update(measure(case))
    print(
        json.dumps(
            {
                "name": "kernel_features",
                "figures": figures,
                "baseline": "the same runs with the serving kernel held off, same process",
                "ratio": figures["prefix_fraction_speedup"],
            }
        )
    )


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    main()
