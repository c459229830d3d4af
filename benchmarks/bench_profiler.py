"""Profiler benchmark: wall time of the default CPU grid, the latency fit's held-out error (grid
timed by wall clock, and again by process CPU time as ``--clock cpu`` does), and the acceptance
scorer's throughput.

Timings are also given as ratios against one plain target decode pass (batch 1, context 128)
measured in the same process, because the machine is shared and absolute times drift; the ratios
use process CPU time on both sides, which other processes on the machine do not inflate. Uses the
built-in target and small drafter when they are installed, otherwise random-weight models of a
similar shape (the output says which).

    python benchmarks/bench_profiler.py
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
import torch

from specsim.models import load_model
from specsim.profiling.acceptance_measure import measure_acceptance
from specsim.profiling.fit import fit_latency
from specsim.profiling.specs import DrafterArg, parse_drafter
from specsim.profiling.timing import (
    DEFAULT_CPU_GRID,
    PassTimer,
    grid_points,
    time_grid,
)

# The built-ins' shapes (see specsim/models/train.py), for random-weight stand-ins.
FALLBACK = {
    "target": {
        "hidden_size": 256,
        "num_hidden_layers": 4,
        "intermediate_size": 704,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    },
    "drafter": {
        "hidden_size": 128,
        "num_hidden_layers": 2,
        "intermediate_size": 352,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
    },
}


def _models():
    try:
        return (
            load_model("specsim-target"),
            load_model("specsim-draft-small"),
            "built-in specsim-target / specsim-draft-small",
        )
    except Exception:  # the built-ins are not installed: same code path, random weights
        folder = Path(tempfile.mkdtemp())
        made = []
        for name, shape in FALLBACK.items():
            config = {
                "model_type": "llama",
                "vocab_size": 258,
                "max_position_embeddings": 2048,
                **shape,
            }
            path = folder / name / "config.json"
            path.parent.mkdir()
            path.write_text(json.dumps(config))
            made.append(load_model(str(path)))
        return made[0], made[1], "random-weight stand-ins (built-ins not installed)"


def _decode_pass_seconds(model, repeats: int = 30) -> float:
    """Median CPU time of one decode pass (process CPU time: steady on a shared machine)."""
    cache = model.new_cache(1, 256)
    tokens = torch.zeros(1, 1, dtype=torch.long)
    timer = PassTimer("cpu", warmup=3, repeats=repeats, clock="cpu")

    def reset():
        cache.lengths.fill_(128)

    def run():
        with torch.inference_mode():
            model(tokens, cache)

    return float(np.median(timer.measure(run, reset)))


def main() -> None:
    target, drafter, which = _models()
    baseline = _decode_pass_seconds(target)

    points = grid_points(DEFAULT_CPU_GRID)
    timer = PassTimer("cpu", warmup=2, repeats=7)
    t0, c0 = time.perf_counter(), time.process_time()
    run = time_grid(target, points, timer)
    grid_s, grid_cpu_s = time.perf_counter() - t0, time.process_time() - c0
    fit = fit_latency(run.samples)
    # The same grid timed by process CPU time (--clock cpu): immune to other processes.
    cpu_fit = fit_latency(time_grid(target, points, PassTimer("cpu", 2, 7, clock="cpu")).samples)

    rng = np.random.default_rng(0)
    prompts = [[int(t) for t in rng.integers(0, 256, size=48)] for _ in range(8)]
    drafters = [DrafterArg(name="small", spec="specsim-draft-small"), parse_drafter("ngram")]
    t0, c0 = time.perf_counter(), time.process_time()
    result = measure_acceptance(
        target,
        {"small": drafter},
        drafters,
        prompts,
        [1.0],
        max_new_tokens=48,
        seed=0,
        eos_id=None,
    )
    scoring_s, scoring_cpu_s = time.perf_counter() - t0, time.process_time() - c0
    tokens_per_s = result.tokens_scored / scoring_s
    after = _decode_pass_seconds(target)  # drift check: the baseline measured again

    figures = {
        "models": which,
        "grid_points": len(points),
        "grid_passes": len(points) * (timer.warmup + timer.repeats),
        "grid_wall_s": round(grid_s, 3),
        "grid_cpu_s": round(grid_cpu_s, 3),
        "grid_cpu_in_decode_passes": round(grid_cpu_s / baseline, 1),
        "fit_held_out_median_rel_error": round(fit.held_out.median_rel_error, 4),
        "fit_held_out_max_rel_error": round(fit.held_out.max_rel_error, 4),
        "fit_median_target_met": fit.held_out.median_rel_error <= 0.05,
        "cpu_clock_fit_held_out_median_rel_error": round(cpu_fit.held_out.median_rel_error, 4),
        "cpu_clock_fit_held_out_max_rel_error": round(cpu_fit.held_out.max_rel_error, 4),
        "cpu_clock_fit_median_target_met": cpu_fit.held_out.median_rel_error <= 0.05,
        "acceptance_tokens_scored": result.tokens_scored,
        "acceptance_tokens_per_s": round(tokens_per_s, 1),
        "acceptance_cpu_s_per_token_in_decode_passes": round(
            scoring_cpu_s / result.tokens_scored / baseline, 3
        ),
        "baseline_decode_pass_s": baseline,
        "baseline_drift_ratio": round(after / baseline, 3),
    }
    print(
        json.dumps(
            {
                "name": "profiler",
                "figures": figures,
                "baseline": "CPU time of one target decode pass (batch 1, context 128) in the "
                "same process",
                "ratio": figures["grid_cpu_in_decode_passes"],
            }
        )
    )


if __name__ == "__main__":
    main()
