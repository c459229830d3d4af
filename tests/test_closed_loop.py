"""calibrate -> predict -> compare on the CPU: the built-in engine's runs, written as vllm bench
serve writes its results, fitted by profile from-bench and predicted by validate --bench.

A small version of ``benchmarks/bench_calibration.py`` (which speculates, at more loads): 8
requests a load (seed 1), speculation off, two Poisson rates to fit and a closed loop of 2
clients held out. The prior is the shipped measured profile with its decode passes made 4 x
too slow, so the fit has far to go: its decode factor must land below 0.7 (the truth is 0.25)
and the calibrated profile must predict the held-out run's mean E2E closer than the prior
(which is 4 x too slow: more than +50 %).

No figure depends on this machine's speed: the engine runs on the reference clock (CPU time
rescaled, pass by pass, to the speed of the machine that measured the shipped profile, by its
``provenance.speed_reference``), so the truth is 0.25 on any CPU. The fixture runs twice, once
as this machine is and once with every model pass made 3 x slower (a busy loop of twice the
pass's own CPU time, which the reference probes see too), standing for a slower CPU, which
the plain CPU clock would fail.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import time
from pathlib import Path

import numpy as np
import pytest
from test_engine_common import drafter_map, model_spec, prompts_path

from specsim.calibration.terms import apply, terms_for
from specsim.cli import main
from specsim.models.transformer import DecoderModel
from specsim.profile import load_profile
from specsim.profiling.writer import build_profile, write_profile
from specsim.scenario import Scenario
from specsim.serving.bench_commands import BenchLoad
from specsim.validation.closed_loop import engine_bench

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "profiles" / "builtin-cpu.yaml"
SLOWER = {"target.decode": 4.0}
FIT = [BenchLoad("rate-4", 4.0, None, 8), BenchLoad("rate-16", 16.0, None, 8)]
HELD_OUT = [BenchLoad("concurrency-2", math.inf, 2, 8)]


def slow_prior(folder: Path) -> Path:
    """The shipped profile with its passes 4 x slower (its sequence files left out)."""
    profile = load_profile(SHIPPED).profile
    terms = terms_for(profile, None)
    theta = [math.log(SLOWER.get(t.name, 1.0)) if t.kind == "factor" else 0.0 for t in terms]
    data = apply(profile, terms, theta).model_dump(mode="json", exclude_none=True)
    for entry in data["acceptance"]:
        entry.pop("sequences", None)
    data["name"] = "builtin-cpu-slow"
    path = folder / "slow.yaml"
    write_profile(build_profile(data, str(path)), path)
    return path


def scenario_file(folder: Path, profile: Path) -> Path:
    data = {
        "name": "loop",
        "seed": 1,
        "profile": str(profile),
        "workload": {
            "kind": "poisson",
            "rate": 1.0,
            "requests": 8,
            "prompt": {"dist": "uniform", "low": 16, "high": 48},
            "output": {"dist": "uniform", "low": 4, "high": 12},
        },
        "engine": {"max_batch": 4, "chunked_prefill": False, "padded_attention": True},
    }
    path = folder / f"scenario-{profile.stem}.yaml"
    path.write_text(json.dumps(data))
    return path


def cli(*argv: str) -> tuple[int, dict]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main([*argv, "--json"])
    return code, json.loads(out.getvalue())


@contextlib.contextmanager
def slower_passes(factor: float):
    """Every model pass takes ``factor`` times its CPU time, as on a slower machine."""
    forward = DecoderModel.forward

    def slow(self, *args, **kwargs):
        start = time.process_time()
        out = forward(self, *args, **kwargs)
        until = start + factor * (time.process_time() - start)
        while time.process_time() < until:
            pass
        return out

    DecoderModel.forward = slow
    try:
        yield
    finally:
        DecoderModel.forward = forward


@pytest.fixture(scope="module", params=[1.0, 3.0], ids=["this-machine", "3x-slower-machine"])
def loop(request, tmp_path_factory):
    with slower_passes(request.param) if request.param != 1.0 else contextlib.nullcontext():
        return run_loop(tmp_path_factory.mktemp("loop"))


def run_loop(folder: Path):
    prior = slow_prior(folder)
    base = Scenario.model_validate(json.loads(scenario_file(folder, prior).read_text()))
    options = {"target": model_spec("specsim-target"), "drafters": drafter_map()}
    options["prompts"] = prompts_path()
    fit = engine_bench(base, FIT, folder / "fit", clock="reference", **options)
    held = engine_bench(base, HELD_OUT, folder / "held", clock="reference", **options)
    calibrated = folder / "calibrated.yaml"
    argv = ["profile", "from-bench", *map(str, fit), "--into", str(prior)]
    # Written whatever its held-out error (the quality gate's verdict), which the tests judge.
    code, report = cli(*argv, "--accept-poor-fit", "--out", str(calibrated))
    assert code == 0
    predictions = {}
    for name, profile in (("prior", prior), ("calibrated", calibrated)):
        argv = ["validate", "--bench", str(folder / "held")]
        argv += [str(scenario_file(folder, profile)), "--replications", "4"]
        code, predictions[name] = cli(*argv, "--out", str(folder / f"check-{name}"))
        assert code in (0, 1)
    return fit, held, report, predictions


def test_the_engine_runs_are_read_as_vllm_results_and_fitted(loop):
    fit, _, report, _ = loop
    assert [run["file"] for run in report["runs"]] == [str(f) for f in fit]
    assert {(run["engine"], run["model"]) for run in report["runs"]} == {
        ("vllm", model_spec("specsim-target"))
    }
    assert all(run["workload"]["arrivals"] == "the run's send times" for run in report["runs"])
    terms = {t["name"]: t for t in report["terms"]}
    # The prior is 4 x too slow: the fit moves the decode factor most of the way back.
    assert terms["target.decode"]["determined"]
    assert terms["target.decode"]["value"] < 0.7
    held = report["held_out"]
    assert held is not None and np.isfinite(held["median_abs_error"])
    assert held["figures"] == report["fit"]["figures"] > 0


def test_the_calibrated_profile_predicts_the_held_out_run_better_than_the_prior(loop):
    _, held, _, predictions = loop
    rows = {}
    for name, summary in predictions.items():
        (run,) = summary["runs"]
        assert run["file"] == str(held[0])
        assert run["workload"]["arrivals"] == "a closed loop of 2 clients"
        rows[name] = {row["metric"]: row for row in run["rows"]}
        assert all(np.isfinite(row["relative_error"]) for row in run["rows"])
    assert rows["prior"]["e2e_s.mean"]["relative_error"] > 0.5  # 4 x too slow: far too long
    calibrated, prior = rows["calibrated"]["e2e_s.mean"], rows["prior"]["e2e_s.mean"]
    assert abs(calibrated["relative_error"]) < abs(prior["relative_error"])
