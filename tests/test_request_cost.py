"""A request's fixed cost on its way in (``overhead.per_request_s``: HTTP, chat template and
tokenising in the API server) and the roofline's engine costs (``specsim.profiling.
engine_costs``).

- by hand: a request sent at 0 reaches the engine after the delay; its TTFT and E2E pay it, its
  passes do not; a closed-loop client's next request is sent when the answer arrives and
  reaches the engine a delay later;
- open-loop traffic is served exactly as without the delay, shifted by it;
- the per-iteration reference and the fast path give identical records; the estimate's TTFT
  and E2E carry the delay;
- bad values are one-line refusals (exit 2, nothing written); the roofline writes the engine
  costs it is given, and by default the fitted ones with where they come from;
- recovery: ``profile from-bench`` fits the delay back from runs that include a low-load one,
  and without one reports it undetermined and keeps the prior's.
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
from specsim.profiling.engine_costs import EngineCosts
from specsim.scenario import Scenario
from specsim.simulation.run import run_simulation

REPO = Path(__file__).resolve().parent.parent
H100 = REPO / "profiles" / "hardware" / "h100-sxm.yaml"
LLAMA_8B = REPO / "profiles" / "models" / "llama3.1-8b.json"
# hand_profile's target: 10 ms + 0.1 ms a token; 0.1 ms a step of overhead
PREFILL_100 = 0.010 + 100 * 1e-4 + 1e-4  # a 100-token prompt's iteration
DECODE_1 = 0.010 + 1e-4 + 1e-4  # one sequence's decode iteration


def profile_with(folder: Path, request_s: float) -> Path:
    return hand_profile(
        folder / "p.yaml", overhead={"per_step_s": 1e-4, "per_request_s": request_s}
    )


def simulate(profile: Path, workload: dict, tmp_path: Path, fast: bool = True):
    scenario = Scenario.model_validate(
        {
            "name": "request-cost",
            "seed": 3,
            "profile": str(profile),
            "workload": workload,
            "engine": {"max_batch": 8, "max_batched_tokens": 4096, "jitter": False},
        }
    )
    out = tmp_path / f"requests-{fast}.csv"
    result = run_simulation(scenario, out, fast_path=fast)
    with open(out) as f:
        rows = list(csv.DictReader(f))
    return result.summary, rows


def closed_loop(requests: int) -> dict:
    fixed = {"dist": "fixed"}
    return {
        "kind": "closed_loop",
        "concurrency": 1,
        "requests": requests,
        "prompt": {**fixed, "value": 100},
        "output": {**fixed, "value": 3},
    }


def test_a_request_pays_the_delay_in_its_ttft_and_e2e_and_no_pass_does(tmp_path):
    """One client, two requests of 100 prompt and 3 output tokens, 50 ms of delay: the first is
    sent at 0, reaches the engine at 0.05 and has its first token after its prefill iteration
    (20.1 ms); two decode iterations (10.2 ms each) finish it. The second is sent then and
    pays the same."""
    summary, rows = simulate(profile_with(tmp_path, 0.05), closed_loop(2), tmp_path)
    first_e2e = 0.05 + PREFILL_100 + 2 * DECODE_1
    assert float(rows[0]["arrival_s"]) == 0.0
    assert float(rows[0]["scheduled_s"]) == pytest.approx(0.05, abs=1e-6)
    assert float(rows[0]["first_token_s"]) == pytest.approx(0.05 + PREFILL_100, abs=1e-6)
    assert float(rows[0]["finish_s"]) == pytest.approx(first_e2e, abs=1e-6)
    assert float(rows[1]["arrival_s"]) == pytest.approx(first_e2e, abs=1e-6)
    assert float(rows[1]["finish_s"]) == pytest.approx(2 * first_e2e, abs=1e-6)
    assert summary["ttft_s"]["mean"] == pytest.approx(0.05 + PREFILL_100, abs=1e-6)
    assert summary["e2e_s"]["mean"] == pytest.approx(first_e2e, abs=1e-6)
    assert summary["duration_s"] == pytest.approx(2 * first_e2e, abs=1e-6)
    # Without the delay the same figures lose it, and the engine's iterations are the same.
    plain, _ = simulate(profile_with(tmp_path, 0.0), closed_loop(2), tmp_path)
    assert plain["ttft_s"]["mean"] == pytest.approx(PREFILL_100, abs=1e-6)
    assert plain["tpot_s"]["mean"] == pytest.approx(summary["tpot_s"]["mean"], abs=1e-9)


def test_open_loop_traffic_is_served_as_without_the_delay_shifted_by_it(tmp_path):
    """Poisson arrivals at 20/s: every request is scheduled, answered and finished 30 ms later
    than without the delay, and arrives (is sent) at the same time."""
    workload = {
        "kind": "poisson",
        "rate": 20.0,
        "requests": 60,
        "prompt": {"dist": "uniform", "low": 50, "high": 400},
        "output": {"dist": "uniform", "low": 2, "high": 40},
    }
    _, delayed = simulate(profile_with(tmp_path, 0.03), workload, tmp_path)
    _, plain = simulate(profile_with(tmp_path, 0.0), workload, tmp_path)
    assert len(delayed) == len(plain) == 60
    for late, now in zip(delayed, plain, strict=True):
        assert float(late["arrival_s"]) == pytest.approx(float(now["arrival_s"]), abs=2e-6)
        for column in ("scheduled_s", "first_token_s", "finish_s"):
            assert float(late[column]) == pytest.approx(float(now[column]) + 0.03, abs=2e-6)
        assert late["output_tokens"] == now["output_tokens"]


@pytest.mark.parametrize(
    "workload",
    [
        {
            "kind": "poisson",
            "rate": 30.0,
            "requests": 50,
            "prompt": {"dist": "uniform", "low": 50, "high": 400},
            "output": {"dist": "uniform", "low": 2, "high": 40},
        },
        closed_loop(30) | {"concurrency": 4},
        {
            "kind": "poisson",
            "rate": 30.0,
            "requests": 50,
            "max_concurrency": 3,
            "prompt": {"dist": "uniform", "low": 50, "high": 400},
            "output": {"dist": "uniform", "low": 2, "high": 40},
        },
    ],
    ids=["open-loop", "closed-loop", "capped"],
)
def test_the_fast_path_and_the_reference_agree_with_the_delay(workload, tmp_path):
    """The open loop's feed adds the delay to its times, the others' API server hands each
    request on after it: the same records either way."""
    profile = profile_with(tmp_path, 0.02)
    fast = simulate(profile, workload, tmp_path, fast=True)
    reference = simulate(profile, workload, tmp_path, fast=False)
    assert fast == reference


def test_the_estimate_carries_the_delay_in_ttft_and_e2e(tmp_path):
    from specsim.estimate import estimate

    workload = {
        "kind": "poisson",
        "rate": 2.0,
        "requests": 200,
        "prompt": {"dist": "fixed", "value": 100},
        "output": {"dist": "fixed", "value": 20},
    }
    got = {}
    for delay in (0.0, 0.04):
        scenario = Scenario.model_validate(
            {
                "name": "e",
                "seed": 0,
                "profile": str(profile_with(tmp_path, delay)),
                "workload": workload,
            }
        )
        got[delay] = estimate(scenario, load_profile(scenario.profile))
    assert got[0.04].ttft_mean_s - got[0.0].ttft_mean_s == pytest.approx(0.04, abs=1e-12)
    assert got[0.04].e2e_mean_s - got[0.0].e2e_mean_s == pytest.approx(0.04, abs=1e-12)
    assert got[0.04].tpot_mean_s == got[0.0].tpot_mean_s


@pytest.mark.parametrize("key", ["per_request_s", "per_request_engine_s"])
def test_a_negative_request_cost_in_a_profile_is_a_one_line_refusal(key, tmp_path):
    path = profile_with(tmp_path, 0.0)
    data = yaml.safe_load(path.read_text())
    data["overhead"][key] = -0.01
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecsimError) as refused:
        load_profile(path)
    message = str(refused.value)
    assert key in message and "\n" not in message


@pytest.mark.parametrize(
    "option", ["--overhead-request-s", "--overhead-step-s", "--overhead-admit-s"]
)
def test_a_negative_engine_cost_on_the_command_line_exits_2_and_writes_nothing(
    option, tmp_path, capsys
):
    from specsim.cli import main

    out = tmp_path / "p.yaml"
    argv = ["profile", "roofline", "--hardware", str(H100), "--target", str(LLAMA_8B)]
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--out", str(out), option, "-1"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert option in err[-1]
    assert not out.exists()


def test_the_roofline_writes_the_engine_costs_with_their_source(tmp_path):
    from specsim.cli import main

    out = tmp_path / "p.yaml"
    argv = ["profile", "roofline", "--hardware", str(H100), "--target", str(LLAMA_8B)]
    main([*argv, "--out", str(out), "--overhead-request-s", "0.025"])
    overhead = load_profile(out).profile.overhead
    default = EngineCosts()
    assert (overhead.per_step_s, overhead.per_sequence_s) == (default.step_s, default.sequence_s)
    assert overhead.per_request_s == 0.025
    main([*argv, "--out", str(out)])
    profile = load_profile(out).profile
    assert profile.overhead.per_request_s == default.request_s
    assert "fitted on vLLM 0.11.0 runs" in profile.provenance.notes
    assert "per_request_engine_s" not in out.read_text()  # 0 unless stated
    main([*argv, "--out", str(out), "--overhead-admit-s", "0.003"])
    profile = load_profile(out).profile
    assert profile.overhead.per_request_engine_s == 0.003
    assert "0.003 s per request admitted" in profile.provenance.notes
    assert math.isclose(EngineCosts(1e-3, 0.0, 0.0).overhead()["per_step_s"], 1e-3)


def _prior_with_engine_costs() -> dict:
    """The calibration prior given the roofline's fitted engine costs (50 ms a request on its
    way in, 120 us a sequence a step)."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    import bench_runs

    data = load_profile(bench_runs.PRIOR).profile.model_dump(mode="json", exclude_none=True)
    data["overhead"].update(per_request_s=0.05, per_sequence_s=1.2e-4)
    return data


def test_a_calibration_recovers_the_request_delay_from_a_low_load_run(tmp_path):
    """Recovery: runs simulated on the prior with a 120 ms delay (against its 50 ms), decode
    x 1.4 and prefill x 0.7 (``bench_runs.LOADS``: 2 and 20 requests/s and a closed loop of 16,
    and 5 requests/s of 256-1024-token prompts, 80 requests each; at 2 requests/s a request
    seldom queues, so its TTFT is the delay and a prefill) are fitted back: the delay within
    5 ms, decode within 2 %, prefill within 12 % (the delay and the prefill share the low-load
    TTFT, so the prefill is looser than test_from_bench's 8 % with the delay known), each
    within two of its stated posterior standard deviations. The report names the delay as
    determined; the profile carries it and keeps the per-sequence cost, which is no fitted
    term."""
    import bench_runs

    truth = {**bench_runs.TRUTH, "overhead.per_request_s": 0.12}
    # Long prompts tell the prefill from the engine's cost per admitted request (fitted for
    # vLLM's runs): short ones alone leave the prefill undetermined.
    cases = (*bench_runs.LOADS, bench_runs.Case("long-r5", 5.0, prompt=(256, 1024)))
    calibration = bench_runs.calibrate_on(tmp_path, _prior_with_engine_costs(), truth, cases)
    terms = {t["name"]: t for t in calibration.report["terms"]}
    # Short prompts: the attention factor stays at the prior (test_from_bench).
    assert terms.pop("target.attention")["determined"] is False
    # vLLM's runs: the engine's cost per admitted request is fitted too (truly 0 here).
    assert set(terms) == {
        "target.decode",
        "target.prefill",
        "overhead.per_request_s",
        "overhead.per_request_engine_s",
    }
    assert all(t["determined"] for t in terms.values()), terms
    assert calibration.report["undetermined"] == ["target.attention"]
    errors = bench_runs.log_errors(calibration.report, truth)
    del errors["target.attention"]
    assert abs(errors["overhead.per_request_s"]) <= 0.005
    assert abs(errors["target.decode"]) <= 0.02
    assert abs(errors["target.prefill"]) <= 0.12
    sd = {"target.decode": math.log(4.0), "target.prefill": math.log(4.0)}
    sd["overhead.per_request_s"] = 0.05  # seconds: one REQUEST_UNIT_S
    sd["overhead.per_request_engine_s"] = 0.01  # ENGINE_REQUEST_SPREAD_S
    assert abs(errors["overhead.per_request_engine_s"]) <= 0.001, errors
    for name, error in errors.items():
        assert abs(error) <= 2 * terms[name]["spread_ratio"] * sd[name], name
    overhead = calibration.profile.overhead
    # (the profile keeps six significant digits)
    assert overhead.per_request_s == pytest.approx(
        terms["overhead.per_request_s"]["value"], rel=1e-5
    )
    assert overhead.per_sequence_s == 1.2e-4
    assert "overhead.per_request_s 0.1" in calibration.profile.provenance.notes


def test_without_a_low_load_run_the_request_delay_is_undetermined_and_kept(tmp_path):
    """The same truth served only all at once (two runs of 200 requests, a queue seconds
    long): the delay is a few per cent of each TTFT, the posterior leaves it undetermined
    (spread above 0.5 of the prior's), the profile keeps the prior's 50 ms and says so; the
    factors are still fitted."""
    import bench_runs
    from bench_runs import Case

    truth = {**bench_runs.TRUTH, "overhead.per_request_s": 0.12}
    loaded = (Case("all-a", math.inf), Case("all-b", math.inf, prompt=(256, 1024)))
    calibration = bench_runs.calibrate_on(
        tmp_path, _prior_with_engine_costs(), truth, loaded, requests=200
    )
    terms = {t["name"]: t for t in calibration.report["terms"]}
    delay = terms["overhead.per_request_s"]
    assert not delay["determined"] and delay["spread_ratio"] > 0.5
    assert delay["value"] == delay["prior"] == 0.05
    assert "overhead.per_request_s" in calibration.report["undetermined"]
    assert terms["target.decode"]["determined"] and terms["target.prefill"]["determined"]
    assert calibration.profile.overhead.per_request_s == 0.05
    notes = calibration.profile.provenance.notes
    kept = "Kept at the prior (the runs do not determine them): target.attention, overhead"
    assert kept + ".per_request_s." in notes
