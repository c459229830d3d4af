"""The engine's own cost per admitted request (``overhead.per_request_engine_s``: scheduling a
request, allocating its blocks, adding it to the input and sampling batches in the engine's
loop): the iteration that admits a request takes that much longer, so every request in the
batch waits for it.

- by hand: an iteration timeline with the term, on the per-iteration reference and on the
  fast path;
- the compiled serving kernel charges it as the reference does (a lone replica, a fleet and a
  split fleet, whose decode replicas pay it for each request that joins with its KV cache, as
  vLLM's scheduler adds and schedules it as a new request);
- a profile without the term writes no key for it (every profile keeps its bytes);
- recovery: ``profile from-bench`` fits a known term back from runs that send many short
  requests at once, and leaves it undetermined where one request at a time cannot tell it
  from the prefill.
"""

from __future__ import annotations

import csv
import math
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from test_engine_common import hand_profile

from specsim.profile import load_profile
from specsim.profiling.writer import profile_yaml
from specsim.scenario import Scenario
from specsim.simulation.compiled_layout import ADMISSIONS, CHARGED
from specsim.simulation.compiled_serving import ServingLoop
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


# Identity with the reference, the term > 0, where the kernel runs most iterations: a lone
# replica, a fleet and a split fleet, admitting new and preempted requests (and on a decode
# replica, joins), in iterations with decoding rows and in prompts' iterations apart.
ENGINE_COST = 0.001
LONE = {
    "lone, preemption": {
        "engine": {"max_batch": 32, "kv_capacity_tokens": 1800},
        "workload": {"rate": 20.0},
    },
    "lone, prefill apart": {"engine": {"max_batch": 32, "chunked_prefill": False}},
}
FLEET = {
    "two replicas, saturated, prefill apart": {
        "engine": {"max_batch": 16, "kv_capacity_tokens": 1500, "chunked_prefill": False},
        "fleet": {"replicas": 2, "router": "least_outstanding"},
        "workload": {"rate": 40.0, "requests": 400},
    },
}
SPLIT = {
    "1P1D, saturated decode pool, preemption": {
        "engine": {"max_batch": 32, "kv_capacity_tokens": 2500},
        "workload": {"rate": 60.0, "output": {"dist": "uniform", "low": 1, "high": 120}},
    },
    "2P3D, prefill apart": {
        "split": {"prefill": {"replicas": 2}, "decode": {"replicas": 3}},
        "engine": {"max_batch": 32, "chunked_prefill": False},
        "workload": {"rate": 40.0},
    },
}


@pytest.fixture(scope="module")
def costly(tmp_path_factory) -> Path:
    """The simulator's test profile with passes that cost more with tokens and context, the
    target's hidden size (heads move it), and the engine's cost per admitted request."""
    from test_sim_identity import DATA

    profile = yaml.safe_load((DATA / "sim_profile.yaml").read_text())
    profile["target"]["hidden_size"] = 1024
    profile["target"]["latency"]["fit"].update(
        per_batched_token_s=3.0e-5, knee_tokens=48, per_kv_token_s=4.0e-8, per_attention_pair_s=1e-9
    )
    profile["overhead"] = {
        "per_step_s": 3.0e-4,
        "per_sequence_s": 2.0e-6,
        "per_request_engine_s": ENGINE_COST,
    }
    folder = tmp_path_factory.mktemp("profile")
    (folder / "sim_profile.yaml").write_text(yaml.safe_dump(profile))
    (folder / "sim_sequences.txt").write_text((DATA / "sim_sequences.txt").read_text())
    return folder


def lone_share(scenario, monkeypatch) -> float:
    from test_sim_compiled_serving import kernel_iterations

    inside, total, _ = kernel_iterations(scenario, monkeypatch)
    return inside / total


@pytest.mark.parametrize("name", [*LONE, *FLEET, *SPLIT])
def test_the_kernel_charges_the_term_as_the_reference(name, costly, tmp_path, monkeypatch):
    """The fast path runs the kernel (>= 80 % of iterations, in each pool of a split fleet)
    and gives the reference's records, engine statistics, summary and requests.csv."""
    import test_disagg_kernel as disagg
    import test_sim_identity as identity
    from test_sim_fleet_serving import kernel_share

    if name in SPLIT:
        scenario = disagg.make(SPLIT[name], costly)
        counts = disagg.iterations(scenario, tmp_path, monkeypatch)
        assert disagg.share(counts, "prefill") >= 0.8 and disagg.share(counts, "decode") >= 0.8
    elif name in FLEET:
        scenario = identity.make(FLEET[name], costly)
        assert kernel_share(scenario, tmp_path, monkeypatch) >= 0.8
    else:
        scenario = identity.make(LONE[name], costly)
        assert lone_share(scenario, monkeypatch) >= 0.8
    fast = identity.assert_identical(scenario, tmp_path, monkeypatch)
    if "preemption" in name or "saturated" in name:
        pools = fast["summary"].get("pools", {"": fast["summary"]})
        assert sum(pool["preemptions"] for pool in pools.values()) > 0


@pytest.mark.filterwarnings("ignore::specsim.profile.OutOfRangeWarning")
def test_a_call_that_stops_after_admitting_leaves_their_cost_to_python(tmp_path, monkeypatch):
    """A context above the profile's measured range (extrapolated, warned once): the kernel
    admits a request, stops before the iteration and Python runs it; that iteration still
    pays for the admission the kernel made (``Replica.charged_admissions``)."""
    import test_sim_identity as identity
    from test_sim_compiled_serving import ranged

    folder = ranged(tmp_path / "p", "extrapolate", {"context": [0, 380]})
    data = yaml.safe_load((folder / "sim_profile.yaml").read_text())
    data["overhead"] = {"per_step_s": 3.0e-4, "per_request_engine_s": ENGINE_COST}
    (folder / "sim_profile.yaml").write_text(yaml.safe_dump(data))
    scenario = identity.make({"workload": {"rate": 60.0}}, folder)
    assert lone_share(scenario, monkeypatch) >= 0.5
    unpack, carried = ServingLoop._unpack, []

    def counted(self, replica):
        carried.append(self.ct[ADMISSIONS] - self.ct[CHARGED])
        unpack(self, replica)

    with monkeypatch.context() as patch:
        patch.setattr(ServingLoop, "_unpack", counted)
        identity.assert_identical(scenario, tmp_path, monkeypatch)
    assert max(carried) > 0  # a call stopped after admitting


def test_the_term_slows_every_request(costly, tmp_path, monkeypatch):
    """The same traffic without the term: each request's first token comes earlier."""
    import test_sim_identity as identity

    scenario = identity.make(LONE["lone, preemption"], costly)
    with_term = identity.observe(scenario, tmp_path / "a.csv", True, monkeypatch)["summary"]
    data = yaml.safe_load((costly / "sim_profile.yaml").read_text())
    data["overhead"]["per_request_engine_s"] = 0.0
    (tmp_path / "sim_profile.yaml").write_text(yaml.safe_dump(data))
    (tmp_path / "sim_sequences.txt").write_text((costly / "sim_sequences.txt").read_text())
    plain = identity.observe(
        identity.make(LONE["lone, preemption"], tmp_path), tmp_path / "b.csv", True, monkeypatch
    )
    assert with_term["ttft_s"]["mean"] > plain["summary"]["ttft_s"]["mean"] + ENGINE_COST


@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "prefill apart"])
def test_the_estimate_prices_the_term_as_the_simulation_does(chunked, tmp_path):
    """``specsim estimate``: each prompt's admission adds the term to the iteration that
    carries it, so TTFT grows by about the term (and a little more as iterations stretch) and
    TPOT too, as in the simulation of the same traffic."""
    from specsim.estimate import estimate

    workload = {
        "kind": "poisson",
        "rate": 8.0,
        "requests": 400,
        "prompt": {"dist": "fixed", "value": 100},
        "output": {"dist": "fixed", "value": 20},
    }
    engine = {"max_batch": 8, "chunked_prefill": chunked, "jitter": False}
    got, simulated = {}, {}
    for cost in (0.0, ADMIT_S):
        folder = tmp_path / str(cost)
        folder.mkdir()
        scenario = Scenario.model_validate(
            {
                "name": "e",
                "seed": 0,
                "profile": str(profile_with(folder, cost)),
                "workload": workload,
                "engine": engine,
            }
        )
        got[cost] = estimate(scenario, load_profile(scenario.profile))
        simulated[cost] = run_simulation(scenario, folder / "r.csv").summary
    ttft = got[ADMIT_S].ttft_mean_s - got[0.0].ttft_mean_s
    sim_ttft = simulated[ADMIT_S]["ttft_s"]["mean"] - simulated[0.0]["ttft_s"]["mean"]
    assert ADMIT_S <= ttft == pytest.approx(sim_ttft, rel=0.25), (ttft, sim_ttft)
    assert got[ADMIT_S].tpot_mean_s > got[0.0].tpot_mean_s


def test_the_term_is_written_only_when_stated(tmp_path):
    """(A negative one is refused: test_request_cost.)"""
    plain = load_profile(profile_with(tmp_path, 0.0)).profile
    assert "per_request_engine_s" not in profile_yaml(plain)
    stated = load_profile(profile_with(tmp_path, ADMIT_S)).profile
    assert "per_request_engine_s: 0.005" in profile_yaml(stated)


@pytest.mark.parametrize("name", ["vllm_v33_plain.json", "sglang_two_runs.jsonl"])
def test_the_runs_engine_says_whether_the_term_is_fitted(name, tmp_path):
    """The prior states no engine cost: vLLM's runs fit it from 0 (its loop pays work per
    request it admits: ``Engine.request_work``), SGLang's keep the prior's 0; the report and
    the profile's provenance say which and why."""
    import bench_runs

    from specsim.calibration.from_bench import BenchOptions, calibrate_from_bench

    files = (str(Path(bench_runs.PRIOR).parent / name),)
    out = tmp_path / "fit.yaml"
    options = BenchOptions(files, str(bench_runs.PRIOR), out, "fit", bench_runs.DRAFTER)
    options = replace(options, held_out=False, accept_poor_fit=True)
    calibration = calibrate_from_bench(options)
    names = [t["name"] for t in calibration.report["terms"]]
    why = calibration.report["engine_request_cost"]
    if name.startswith("vllm"):
        assert "overhead.per_request_engine_s" in names
        assert why.startswith("fitted from 0") and "allocate_slots" in why
    else:
        assert "overhead.per_request_engine_s" not in names
        assert why.startswith("kept at the prior's 0: sglang")
        assert calibration.profile.overhead.per_request_engine_s == 0.0
    assert f"Engine cost per admitted request: {why}." in calibration.profile.provenance.notes


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
