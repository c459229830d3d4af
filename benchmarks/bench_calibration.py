"""calibrate -> predict -> compare, closed on this machine: the built-in engine's benchmark runs,
written as ``vllm bench serve --save-result --save-detailed`` writes its own, fitted by
``profile from-bench`` and predicted at loads the fit never saw by ``validate --bench``.

The deployment is ``scenarios/validate-b8-small-k2.yaml`` (the built-in target with the small
drafter at k = 2, at most 8 sequences, 96-token prompts, 32..128 generated tokens) served at
Poisson rates of 2, 4 and 6 requests/s (fitted) and 8 (held out), and by closed loops of 1, 4
and 8 clients (held out), ``--requests`` requests a load (default 48). The prior is the shipped
``profiles/builtin-cpu.yaml`` (measured once, on another day: the calibration fits it to this
machine now). Each held-out run is predicted twice, by the prior and by the calibrated
profile, and compared figure by figure under validate's thresholds.

The last stdout line is one JSON object: ``name``, ``figures`` (the fitted terms; the fit's own
error and its leave-one-run-out error over the fitted rates, as the calibration report gives
them; per held-out run each thresholded figure's relative error, calibrated and prior; their
medians), ``baseline`` (the built-in engine's measurements, in the same process) and ``ratio``
(the largest calibrated |error| / threshold over the held-out runs: <= 1 means every threshold
is met). The calibration's leave-one-out refits start from the prior, so they never see the
run they predict; the held-out runs here are never fitted at all.

    OMP_NUM_THREADS=1 python benchmarks/bench_calibration.py [--requests N]
        [--clock reference|cpu|wall] [--keep DIR] [--examples DIR]

The engine is timed as ``specsim validate --clock reference`` times it by default: CPU time
rescaled pass by pass to the speed of the machine that measured the prior, so that a shared
machine's drift during the runs is taken out and the fit is left with what the prior got
wrong.

``--keep DIR`` keeps every file (the runs, the calibrated profile, the validations);
``--examples DIR`` writes the runs as the shipped examples are (``DIR/fit/``, ``DIR/held-out/``).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
SCENARIO = REPO / "scenarios" / "validate-b8-small-k2.yaml"
PRIOR = REPO / "profiles" / "builtin-cpu.yaml"
FIT_RATES = (2.0, 4.0, 6.0)
HELD_OUT_RATES = (8.0,)
CONCURRENCIES = (1, 4, 8)


def loads(requests: int):
    from specsim.serving.bench_commands import BenchLoad

    fit = [BenchLoad(f"rate-{r:g}", r, None, requests) for r in FIT_RATES]
    held = [BenchLoad(f"rate-{r:g}", r, None, requests) for r in HELD_OUT_RATES]
    held += [BenchLoad(f"concurrency-{c}", math.inf, c, requests) for c in CONCURRENCIES]
    return fit, held


def calibrate(files: list[Path], out: Path) -> dict:
    from specsim.calibration.from_bench import BenchOptions, calibrate_from_bench
    from specsim.fileio import dump_json
    from specsim.profiling.writer import write_profile

    options = BenchOptions(
        tuple(str(f) for f in files),
        str(PRIOR),
        out,
        "builtin-cpu-calibrated",
        drafter="small",
        command="benchmarks/bench_calibration.py",
    )
    result = calibrate_from_bench(options)
    write_profile(result.profile, out, {result.report_name: dump_json(result.report)})
    return result.report


def predict(scenario, folder: Path, profile: Path, out: Path) -> dict[str, dict]:
    """Per held-out run: each thresholded figure's relative error, and the verdict."""
    from specsim.validation.bench_report import write_bench_validation

    result = write_bench_validation(scenario, folder, str(profile), 20, out)
    return {
        r.run.label: {
            "errors": {
                row.metric: round(row.relative_error, 4)
                for row in r.comparison.rows
                if row.threshold is not None and row.relative_error is not None
            },
            "passed": r.comparison.passed,
        }
        for r in result.runs
    }


def medians(predicted: dict[str, dict]) -> dict[str, float]:
    metrics = sorted({m for run in predicted.values() for m in run["errors"]})
    return {
        m: round(float(np.median([abs(run["errors"][m]) for run in predicted.values()])), 4)
        for m in metrics
    }


def write_examples(fit: list[Path], held: list[Path], folder: Path) -> None:
    """``fit/``, ``held-out/`` (the Poisson rate: the tour's example, which the calibrated
    profile predicts within every threshold) and ``closed-loop/`` (what it does not: see the
    folder's README)."""
    rates = [file for file in held if file.stem.startswith("rate-")]
    loops = [file for file in held if file not in rates]
    for name, files in (("fit", fit), ("held-out", rates), ("closed-loop", loops)):
        (folder / name).mkdir(parents=True, exist_ok=True)
        for file in files:
            shutil.copy(file, folder / name / file.name)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--clock", choices=["wall", "cpu", "reference"], default="reference")
    parser.add_argument("--keep", metavar="DIR")
    parser.add_argument("--examples", metavar="DIR")
    args = parser.parse_args()

    from specsim.scenario import load_scenario
    from specsim.validation.closed_loop import engine_bench
    from specsim.validation.compare import THRESHOLDS

    scenario = load_scenario(SCENARIO)
    fit_loads, held_loads = loads(args.requests)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="specsim-calibration-") as tmp:
        work = Path(args.keep) if args.keep else Path(tmp)
        fit = engine_bench(scenario, fit_loads, work / "runs" / "fit", clock=args.clock)
        held = engine_bench(scenario, held_loads, work / "runs" / "held-out", clock=args.clock)
        engine_s = time.monotonic() - t0
        report = calibrate(fit, work / "calibrated.yaml")
        calibrated = predict(
            scenario, work / "runs" / "held-out", work / "calibrated.yaml", work / "check"
        )
        prior = predict(scenario, work / "runs" / "held-out", PRIOR, work / "check-prior")
        if args.examples:
            write_examples(fit, held, Path(args.examples))
    worst = max(
        abs(error) / THRESHOLDS[metric]
        for run in calibrated.values()
        for metric, error in run["errors"].items()
    )
    figures = {
        "terms": {
            t["name"]: {"value": round(t["value"], 6), "determined": t["determined"]}
            for t in report["terms"]
        },
        "fit_median_abs_error": round(report["fit"]["median_abs_error"], 4),
        "leave_one_rate_out_median_abs_error": round(report["held_out"]["median_abs_error"], 4),
        "leave_one_rate_out_max_abs_error": round(report["held_out"]["max_abs_error"], 4),
        "held_out": {
            label: {"calibrated": calibrated[label], "prior": prior[label]} for label in calibrated
        },
        "held_out_median_abs_error": {
            "calibrated": medians(calibrated),
            "prior": medians(prior),
        },
        "requests_per_load": args.requests,
        "engine_s": round(engine_s, 1),
        "wall_s": round(time.monotonic() - t0, 1),
    }
    output = {
        "name": "calibration",
        "figures": figures,
        "baseline": "the built-in engine's runs (vLLM result format), same process "
        f"(clock: {args.clock}); fitted at {', '.join(f'{r:g}' for r in FIT_RATES)} requests/s",
        "ratio": round(worst, 3),
        "thresholds": THRESHOLDS,
    }
    print(json.dumps(output))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
