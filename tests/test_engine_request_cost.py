"""The engine's own cost per admitted request (``overhead.per_request_engine_s``: scheduling a
request, allocating its blocks, adding it to the input and sampling batches in the engine's
loop): the iteration that admits a request takes that much longer, so every request in the
batch waits for it.

- by hand: an iteration timeline with the term, on the per-iteration reference and on the
  fast path (which falls back to the reference while the term is > 0: the kernels lack it);
- a profile without the term writes no key for it (every profile keeps its bytes);
- recovery: ``profile from-bench`` fits a known term back from runs that send many short
  requests at once, and leaves it undetermined where one request at a time cannot tell it
  from the prefill.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
import yaml
from test_engine_common import hand_profile

from specsim.errors import SpecsimError
from specsim.profile import load_profile
from specsim.profiling.writer import profile_yaml
from specsim.scenario import Scenario
from specsim.simulation.run import run_simulation

ADMIT_S = 0.005
# hand_profile's target: 10 ms + 0.1 ms a token; 0.1 ms a step of overhead
PREFILL_2X100 = 0.010 + 200 * 1e-4 + 1e-4  # two 100-token prompts in one iteration
PREFILL_100 = 0.010 + 100 * 1e-4 + 1e-4
DECODE_2 = 0.010 + 2 * 1e-4 + 1e-4  # two sequences' decode iteration
DECODE_1 = 0.010 + 1e-4 + 1e-4


def profile_with(folder: Path, admit_s: float) -> Path:
    return hand_profile(
        folder / "p.yaml", overhead={"per_step_s": 1e-4, "per_request_engine_s": admit_s}
    )


def simulate(profile: Path, tmp_path: Path, fast: bool, workload=None, max_batch=2):
    fixed = {"dist": "fixed"}
    workload = workload or {
        "kind": "closed_loop",
        "concurrency": 3,
        "requests": 3,
        "prompt": {**fixed, "value": 100},
        "output": {**fixed, "value": 2},
    }
    scenario = Scenario.model_validate(
        {
            "name": "engine-request-cost",
            "seed": 3,
            "profile": str(profile),
            "workload": workload,
            "engine": {"max_batch": max_batch, "max_batched_tokens": 4096, "jitter": False},
        }
    )
    out = tmp_path / f"requests-{fast}.csv"
    result = run_simulation(scenario, out, fast_path=fast)
    with open(out) as f:
        rows = list(csv.DictReader(f))
    return result.summary, rows


@pytest.mark.parametrize("fast", [False, True], ids=["reference", "fast-path"])
def test_an_iteration_pays_for_each_request_it_admits(fast, tmp_path):
    """Three requests of 100 prompt and 2 output tokens sent at 0 to an engine of two rows,
    5 ms a request admitted: iteration 1 admits two (their prefills, 30.1 ms, + 10 ms), iteration
    2 decodes them (10.3 ms, none admitted) and they finish; iteration 3 admits the third
    (20.1 ms + 5 ms), iteration 4 decodes it (10.2 ms)."""
    _, rows = simulate(profile_with(tmp_path, ADMIT_S), tmp_path, fast)
    first = PREFILL_2X100 + 2 * ADMIT_S
    second = first + DECODE_2
    third = second + PREFILL_100 + ADMIT_S
    rows.sort(key=lambda r: float(r["finish_s"]))
    for row in rows[:2]:
        assert float(row["first_token_s"]) == pytest.approx(first, abs=1e-9)
        assert float(row["finish_s"]) == pytest.approx(second, abs=1e-9)
    assert float(rows[2]["scheduled_s"]) == pytest.approx(second, abs=1e-9)
    assert float(rows[2]["first_token_s"]) == pytest.approx(third, abs=1e-9)
    assert float(rows[2]["finish_s"]) == pytest.approx(third + DECODE_1, abs=1e-9)


def test_the_fast_path_equals_the_reference_with_the_term(tmp_path):
    """Poisson traffic that queues: the fast path (which steps the reference while the term is
    > 0) gives the reference's records, and the term slows every request down."""
    workload = {
        "kind": "poisson",
        "rate": 60.0,
        "requests": 80,
        "prompt": {"dist": "uniform", "low": 50, "high": 400},
        "output": {"dist": "uniform", "low": 1, "high": 20},
    }
    profile = profile_with(tmp_path, ADMIT_S)
    fast = simulate(profile, tmp_path, True, workload, max_batch=8)
    assert fast == simulate(profile, tmp_path, False, workload, max_batch=8)
    plain, _ = simulate(profile_with(tmp_path, 0.0), tmp_path, True, workload, max_batch=8)
    assert fast[0]["ttft_s"]["mean"] > plain["ttft_s"]["mean"] + ADMIT_S


def test_the_term_is_written_only_when_stated_and_refused_when_negative(tmp_path):
    plain = load_profile(profile_with(tmp_path, 0.0)).profile
    assert "per_request_engine_s" not in profile_yaml(plain)
    stated = load_profile(profile_with(tmp_path, ADMIT_S)).profile
    assert "per_request_engine_s: 0.005" in profile_yaml(stated)
    path = profile_with(tmp_path, 0.0)
    data = yaml.safe_load(path.read_text())
    data["overhead"]["per_request_engine_s"] = -0.01
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecsimError) as refused:
        load_profile(path)
    message = str(refused.value)
    assert "per_request_engine_s" in message and "\n" not in message


PRIOR_ADMIT_S = 0.001  # a prior that states the term (so it is fitted), 1 ms a request


def _prior() -> dict:
    import bench_runs

    data = load_profile(bench_runs.PRIOR).profile.model_dump(mode="json", exclude_none=True)
    data["overhead"].update(per_request_engine_s=PRIOR_ADMIT_S)
    return data


def test_a_calibration_recovers_the_engine_cost_from_bursts_of_short_requests(tmp_path):
    """Recovery: runs simulated with 4 ms a request admitted (the prior states 1 ms), decode x 1.4
    and prefill x 0.7, 200 requests sent at once in each (short outputs; long prompts; a cap of
    16 clients): the term is determined and fitted back within 0.4 ms, the factors within 5 %
    and 10 %, each within two of its stated posterior standard deviations."""
    import bench_runs
    from bench_runs import Case

    truth = {**bench_runs.TRUTH, "overhead.per_request_engine_s": 0.004}
    cases = (
        Case("short", math.inf, output=(2, 6)),
        Case("long", math.inf, prompt=(256, 1024)),
        Case("c16", math.inf, 16),
    )
    calibration = bench_runs.calibrate_on(tmp_path, _prior(), truth, cases, requests=200)
    terms = {t["name"]: t for t in calibration.report["terms"]}
    engine = terms["overhead.per_request_engine_s"]
    assert engine["determined"], engine
    errors = bench_runs.log_errors(calibration.report, truth)
    assert abs(errors["overhead.per_request_engine_s"]) <= 0.0004, errors
    assert abs(errors["target.decode"]) <= 0.05, errors
    assert abs(errors["target.prefill"]) <= 0.10, errors
    assert abs(errors["overhead.per_request_engine_s"]) <= 2 * engine["spread_ratio"] * 0.01
    assert calibration.profile.overhead.per_request_engine_s == pytest.approx(
        engine["value"], rel=1e-5
    )
    assert (
        "(overhead.per_request_engine_s)" in calibration.report["method"]["prior_spread"]["seconds"]
    )


def test_one_request_at_a_time_leaves_the_engine_cost_undetermined(tmp_path):
    """The same truth served one request at a time (a cap of 1): each admission delays only
    its own first token, as the API server's delay and the prefill do, so the posterior names
    the term undetermined and the profile keeps the prior's 1 ms."""
    import bench_runs
    from bench_runs import Case

    truth = {**bench_runs.TRUTH, "overhead.per_request_engine_s": 0.004}
    cases = (Case("one-a", math.inf, 1), Case("one-b", math.inf, 1, prompt=(256, 1024)))
    calibration = bench_runs.calibrate_on(tmp_path, _prior(), truth, cases, requests=60)
    terms = {t["name"]: t for t in calibration.report["terms"]}
    engine = terms["overhead.per_request_engine_s"]
    assert not engine["determined"] and engine["spread_ratio"] > 0.5, engine
    assert engine["value"] == engine["prior"] == PRIOR_ADMIT_S
    assert "overhead.per_request_engine_s" in calibration.report["undetermined"]
    assert calibration.profile.overhead.per_request_engine_s == PRIOR_ADMIT_S
