"""The parts of profile from-bench: acceptance from counters and scalars, the rebuilt
workload, the simulated figures' definitions, the fitted terms and the figures' weights."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from bench_runs import PRIOR, Case, write_runs

from specsim.calibration.acceptance import (
    acceptance_entry,
    constant_rate,
    parse_scalar,
    windows_from_runs,
)
from specsim.calibration.simulate import figure_weight, run_metrics, unfitted_reason
from specsim.calibration.terms import apply, terms_for
from specsim.calibration.workload import EngineDefaults, replay, request_lengths, send_times
from specsim.costs import StepCosts
from specsim.costs.step import PassTotals
from specsim.errors import SpecsimError
from specsim.profile import LoadedProfile, load_profile
from specsim.serving.detect import read_bench_files
from specsim.serving.runs import BenchRun, Lengths, SpecCounters, Traffic
from specsim.simulation.records import read_records

DATA = Path(__file__).parent / "data" / "bench"


def run_of(traffic: Traffic, lengths: Lengths, n: int = 4, speculation=None, **kw) -> BenchRun:
    return BenchRun(
        source="r.json",
        sha256="ab" * 32,
        index=0,
        format="vllm-bench",
        engine="vllm",
        engine_version=None,
        model="m",
        label=None,
        traffic=traffic,
        lengths=lengths,
        duration_s=10.0,
        completed=n,
        metrics={"ttft_s.mean": 0.1},
        itl_per_token=False,
        speculation=speculation,
        **kw,
    )


def spec_run(drafts: int, unconditional: list[float]) -> BenchRun:
    accepted = round(sum(unconditional) * drafts)  # vLLM: the accepted prefix, position by position
    counters = SpecCounters(
        k=len(unconditional),
        num_drafts=drafts,
        draft_tokens=drafts * len(unconditional),
        accepted_tokens=accepted,
        per_position=tuple(unconditional),
        acceptance_length=1 + accepted / drafts,
    )
    return run_of(Traffic(1.0), Lengths(10, 10), speculation=counters)


# -- acceptance ----------------------------------------------------------------------------------


def test_counted_runs_of_one_window_are_pooled_and_made_conditional():
    # 100 steps with positions accepted in 60, 30, 15; 300 steps with 210, 126, 63.
    windows = windows_from_runs(
        [spec_run(100, [0.6, 0.3, 0.15]), spec_run(300, [0.7, 0.42, 0.21])], None
    )
    entry, about = acceptance_entry("d", "rejection", 1.0, windows, None)
    # Pooled: 270, 156, 78 of 400 steps, unconditional 0.675, 0.39, 0.195.
    assert entry["per_position"] == pytest.approx([0.675, 0.39 / 0.675, 0.195 / 0.39])
    assert entry["mean_acceptance_length"] == pytest.approx(
        {1: 1.675, 2: 1.675 + 0.39, 3: 1 + (105 + 399) / 400}
    )
    assert about["filled_from_chain"] == [1, 2] and about["from_scalar"] == []
    assert entry["tokens_scored"] == 1200 and entry["source"] == "calibrated"


def test_the_scalar_rule_solves_a_constant_conditional_rate():
    assert constant_rate(1.7, 1) == pytest.approx(0.7)
    a = constant_rate(2.1, 3)
    assert a + a**2 + a**3 == pytest.approx(1.1, abs=1e-12)
    assert (constant_rate(1.0, 4), constant_rate(5.0, 4)) == (0.0, 1.0)
    length = parse_scalar("ngram:3=2.1", "--acceptance-length", ["ngram"])
    rate = parse_scalar("ngram:3=0.4", "--acceptance-rate", ["ngram"])
    assert (length.drafter, length.k, length.length) == ("ngram", 3, 2.1)
    assert rate.length == pytest.approx(1 + 3 * 0.4)  # L = 1 + k R


def test_a_scalar_run_gets_the_rule_and_a_narrower_counted_window_keeps_its_length():
    sglang = run_of(
        Traffic(1.0),
        Lengths(10, 10),
        speculation=SpecCounters(k=4, acceptance_length=2.5, scalar_only=True),
    )
    windows = windows_from_runs([sglang], None)
    entry, about = acceptance_entry("d", "rejection", 1.0, windows, {"proposal_rate": 0.3})
    a = constant_rate(2.5, 4)
    assert entry["per_position"] == pytest.approx([a] * 4)
    assert entry["mean_acceptance_length"][4] == 2.5 and about["from_scalar"] == [4]
    assert entry["proposal_rate"] == 0.3 and about["kept_from_prior"] == ["proposal_rate"]
    windows = windows_from_runs([sglang, spec_run(100, [0.6])], None)
    entry, about = acceptance_entry("d", "rejection", 1.0, windows, None)
    assert entry["per_position"] == [0.6]  # the only window counted per position
    # k = 2, 3 from the chain of 0.6 (its last rate repeated): 1 + 0.6 + 0.36 (+ 0.216).
    assert entry["mean_acceptance_length"] == pytest.approx({1: 1.6, 2: 1.96, 3: 2.176, 4: 2.5})
    assert about["filled_from_chain"] == [2, 3] and about["from_scalar"] == [4]


# -- the rebuilt workload ------------------------------------------------------------------------


def test_send_times_follow_the_rate_the_cap_and_the_saved_times():
    rng = np.random.default_rng(0)
    saved = Lengths(10, 10, start_times_s=(0.0, 0.5, 0.7, 2.0))
    times, how = send_times(run_of(Traffic(math.inf), saved), rng)
    assert times.tolist() == [0.0] * 4 and how == "all at once (infinite rate)"
    # A closed loop: the saved times follow the real server, the loop is replayed instead.
    times, how = send_times(run_of(Traffic(math.inf, max_concurrency=2), saved), rng)
    assert times.tolist() == [0.0] * 4 and how == "a closed loop of 2 clients"
    times, how = send_times(run_of(Traffic(3.0, max_concurrency=2), saved), rng)
    assert times.tolist() == [0.0, 0.5, 0.7, 2.0] and how == "the run's send times"


def _with_duration(data: dict, duration: float) -> dict:
    """A vLLM result with another duration, its throughputs to match."""
    total = data["total_input_tokens"] + data["total_output_tokens"]
    return {
        **data,
        "duration": duration,
        "request_throughput": data["completed"] / duration,
        "output_throughput": data["total_output_tokens"] / duration,
        "total_token_throughput": total / duration,
    }


def test_the_lead_in_is_read_from_the_duration_and_the_arrays(tmp_path):
    """A run served by a known profile whose first send came 0.5 s after the benchmark started
    (vLLM's first send waits one gap): the reader finds the wait from the duration, and the
    replay's throughputs are the run's, the wait counted."""
    import json

    from specsim.calibration.simulate import Evaluator

    (path,) = write_runs(tmp_path / "runs", [Case("r4", 4.0)], requests=30, seed=5)
    data = json.loads(Path(path).read_text())
    span = float(np.max(np.add(data["start_times"], data["latencies"])) - min(data["start_times"]))
    late = tmp_path / "late.json"
    late.write_text(json.dumps(_with_duration(data, data["duration"] + 0.5)))
    (run,) = read_bench_files([late])
    assert run.lengths.lead_in_s == pytest.approx(0.5 + data["duration"] - span, abs=1e-9)
    assert run.lengths.lead_in_s == pytest.approx(0.5, abs=1e-5)  # the records keep 1 us
    truth = tmp_path / "runs" / "truth.yaml"
    replayed = replay(run, tmp_path / "trace.csv", None, EngineDefaults())
    evaluator = Evaluator(load_profile(truth).profile, str(truth), [replayed], [], tmp_path)
    simulated = evaluator.metrics(np.zeros(0), 0)
    for key in ("throughput_tokens_per_s", "request_throughput"):
        assert simulated[key] == pytest.approx(run.metrics[key], rel=1e-4), key
    # A duration shorter than the requests' own span disagrees with the file's arrays.
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(_with_duration(data, span - 0.1)))
    with pytest.raises(SpecsimError, match="longer than the run's duration"):
        read_bench_files([bad])


@pytest.mark.parametrize("burstiness", [1.0, 4.0])
def test_a_drawn_schedule_has_the_rate_the_span_and_the_burstiness(burstiness):
    n, rate = 20_000, 10.0
    run = run_of(Traffic(rate, burstiness), Lengths(10, 10), n=n)
    times, how = send_times(run, np.random.default_rng(0))
    gaps = np.diff(times)
    # Spans n / rate but for its first gap (the schedule starts at its first send).
    assert times[0] == 0 and n / rate - times[-1] == pytest.approx(1 / rate, rel=0.1, abs=1.0)
    # cv 1 / sqrt(burstiness); over 20,000 gaps the sample cv's standard error is below 0.01,
    # so 0.03 is 3 of them, and a Poisson schedule given for burstiness 4 (cv 1, not 0.5) fails.
    assert np.std(gaps) / np.mean(gaps) == pytest.approx(1 / math.sqrt(burstiness), abs=0.03)
    assert how.startswith("Poisson" if burstiness == 1 else "gamma, cv 0.5")


def test_lengths_are_exact_uniform_over_the_stated_range_or_fixed_at_the_means():
    rng = np.random.default_rng(1)
    exact = Lengths(2, 3, input_lens=(1, 2, 3, 2), output_lens=(4, 3, 2, 3))
    prompts, outputs, how = request_lengths(run_of(Traffic(1.0), exact), rng)
    assert prompts.tolist() == [1, 2, 3, 2] and outputs.tolist() == [4, 3, 2, 3]
    assert how == "prompt: the run's own, per request; output: the run's own, per request"
    ranged = Lengths(768, 192.4, input_range=(512, 1024))
    prompts, outputs, how = request_lengths(run_of(Traffic(1.0), ranged, n=500), rng)
    assert prompts.min() >= 512 and prompts.max() <= 1024 and np.ptp(prompts) > 400
    assert set(outputs.tolist()) == {192}
    assert how == "prompt: uniform over [512, 1024]; output: fixed at the mean, 192"


def test_an_sglang_closed_loop_is_replayed_with_its_cap_range_and_running_requests(tmp_path):
    run = read_bench_files([DATA / "sglang_two_runs.jsonl"])[0]
    rebuilt = replay(run, tmp_path / "t.csv", None, EngineDefaults(256, 4096), base_seed=0)
    assert rebuilt.describe()["arrivals"] == "a closed loop of 16 clients"
    assert rebuilt.engine == {"max_batch": 48, "max_batched_tokens": 4096}  # server_info's
    assert rebuilt.spread_known
    scenario = rebuilt.scenario(str(PRIOR))
    assert scenario.workload.kind == "trace" and scenario.workload.max_concurrency == 16
    rows = np.loadtxt(tmp_path / "t.csv", delimiter=",", skiprows=1)
    assert rows.shape == (200, 3) and np.all(rows[:, 0] == 0)
    assert rows[:, 1].min() >= 512 and rows[:, 1].max() <= 1024  # random_range_ratio 0.5
    # The same file gives the same trace (a seed fixed by its content and the run's place).
    again = replay(run, tmp_path / "u.csv", None, EngineDefaults(), base_seed=0)
    assert (tmp_path / "u.csv").read_bytes() == (tmp_path / "t.csv").read_bytes()
    assert (
        again.seed
        == rebuilt.seed
        != replay(replace(run, index=1), tmp_path / "v.csv", None, EngineDefaults()).seed
    )


# -- the simulated figures -----------------------------------------------------------------------


def test_simulated_figures_are_computed_as_the_vllm_reader_computes_them(tmp_path):
    (path,) = write_runs(tmp_path, [Case("k2", 6.0, k=2)], requests=30, seed=4)
    run = read_bench_files([path])[0]
    records = read_records(tmp_path / "k2.csv")
    keys = [k for k, v in run.metrics.items() if unfitted_reason(k, v, spread_known=True) is None]
    assert "itl_s.p99" not in keys and {"itl_s.mean", "ttft_s.p90", "tpot_s.p50"} <= set(keys)
    figures = run_metrics(records, run.duration_s, keys, per_token=False)
    # The writer's ms, read back into seconds, round to 1e-12 relative at most.
    assert figures == pytest.approx({k: run.metrics[k] for k in keys}, rel=1e-9)


def test_figure_weights_are_a_means_sampling_error_over_the_percentiles():
    assert figure_weight("ttft_s.mean") == figure_weight("request_throughput") == 1.0
    assert figure_weight("ttft_s.p50") == pytest.approx(1 / 1.2533, rel=1e-4)
    assert figure_weight("tpot_s.p90") == pytest.approx(1 / 1.7094, rel=1e-4)
    assert figure_weight("e2e_s.p99") == pytest.approx(1 / 3.7332, rel=1e-4)


# -- the fitted terms ----------------------------------------------------------------------------


def test_the_terms_at_their_prior_values_cost_what_the_prior_costs():
    prior = load_profile(PRIOR)
    for drafter in ("small", "ngram"):
        terms = terms_for(prior.profile, drafter)
        names = [t.name for t in terms]
        assert (f"drafters.{drafter}.latency" in names) == (drafter == "small")
        same = LoadedProfile(apply(prior.profile, terms, [t.theta0 for t in terms]), PRIOR)
        for k, rows, tokens in ((0, 1, 1), (3, 8, 32), (5, 40, 240)):
            decode = PassTotals(rows, tokens, 500.0 * rows, 600.0 * rows)
            prefill = PassTotals(1, 300, 0.0, 45_150.0)
            assert StepCosts(same, drafter).iteration_parts(k, decode, prefill) == StepCosts(
                prior, drafter
            ).iteration_parts(k, decode, prefill)


def _line_evaluator(targets):
    """A stand-in for the simulator: one term, each run's figure off by theta - its target."""
    from types import SimpleNamespace

    term = SimpleNamespace(theta0=0.0, prior_sd=1.0, bounds=(-2.0, 2.0), model="target")
    runs = [SimpleNamespace(speculation=None) for _ in targets]

    def weighted_errors(theta, run):
        return np.array([theta[0] - targets[run]])

    return SimpleNamespace(terms=[term], replays=runs, weighted_errors=weighted_errors)


def test_a_held_out_fit_never_sees_the_run_it_predicts():
    # The held-out fit of run 0 must be the same, bit for bit, whatever run 0 measured: started
    # from the full fit (which saw run 0) it carries run 0's figures into its own prediction.
    from specsim.calibration.fit import calibrate

    first = calibrate(_line_evaluator([0.3, 0.1, 0.2]))
    moved = calibrate(_line_evaluator([-0.5, 0.1, 0.2]))
    assert first.determined == moved.determined == [0]
    assert first.theta[0] != moved.theta[0]
    assert first.held_out[0].tobytes() == moved.held_out[0].tobytes()
    assert first.held_out[1].tobytes() != moved.held_out[1].tobytes()
