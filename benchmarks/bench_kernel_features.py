"""The serving kernel on prefill apart, jitter and padded attention: CPU seconds with and
without it, in one process, alternating.

"Without" holds the kernel off where it used to refuse (prefill not chunked, iteration jitter,
padded attention), so those replicas run as before: stretches, the compiled decode loop and
per-iteration Python. Each pair must give the same summary; ``ratio`` is the first case's
speed-up. Cases:
- ``poisson apart``: ``scenarios/poisson.yaml`` (300 s) with ``engine.chunked_prefill`` false;
- ``validate-b8-tiny-k4`` and ``validate-b8-small-k2`` (closed and open loop, all three
  features, on ``profiles/builtin-cpu.yaml`` less its valid ranges, which the kernel leaves to
  Python), at 2,000 requests.

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
from specsim.simulation import compiled_serving, run_simulation

REPO = Path(__file__).resolve().parent.parent


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


def old_refusals(original):
    """``decode_tables`` as the kernel's conditions were: no prefill apart, jitter or padding."""

    def refusing(replica):
        if not replica.chunked or replica.jitter is not None or replica.padded:
            return None
        return original(replica)

    return refusing


def cpu_run(path, kernel: bool, **overrides) -> tuple[float, dict]:
    """CPU seconds of the simulation alone (the scenario and profile parsed before)."""
    scenario = prepare(path, override_texts(overrides), False)[0]
    original = compiled_serving.decode_tables
    if not kernel:
        compiled_serving.decode_tables = old_refusals(original)
    try:
        start = time.process_time()
        summary = run_simulation(scenario).summary
        return time.process_time() - start, summary
    finally:
        compiled_serving.decode_tables = original


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    rounds = parser.parse_args().rounds
    with tempfile.TemporaryDirectory() as folder:
        scenarios = unranged(Path(folder))
        cases = {  # each: its file, its overrides, a short run's to load the kernels first
            "poisson apart": (
                REPO / "scenarios" / "poisson.yaml",
                {"engine__chunked_prefill": False},
                {"engine__chunked_prefill": False, "workload__duration_s": 10.0},
            ),
            **{
                name: (
                    scenarios / f"{name}.yaml",
                    {"workload__requests": 2000},
                    {"workload__requests": 50},
                )
                for name in ("validate-b8-tiny-k4", "validate-b8-small-k2")
            },
        }
        figures = {}
        for name, (path, overrides, warm_up) in cases.items():
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
                "cpu_s_before": round(before, 3),
                "cpu_s_after": round(after, 3),
                "speedup": round(before / after, 2),
            }
    result = {
        "name": "kernel_features",
        "figures": figures,
        "baseline": "the same runs with the kernel held off where it used to refuse",
        "ratio": figures["poisson apart"]["speedup"],
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
