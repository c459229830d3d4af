"""specsim's runs written in vLLM's bench result format, and read back by the vLLM reader."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from specsim.serving.detect import read_bench_files
from specsim.serving.runs import Traffic
from specsim.serving.vllm import bench_result

# Three requests: the first emits 5 tokens in prefill + 2 steps (2 drafts accepted), the second
# 4 tokens in prefill + 3 steps (none accepted), the third a single token.
RECORDS = {
    "arrival_s": np.array([0.0, 1.0, 2.0]),
    "first_token_s": np.array([0.5, 1.2, 2.1]),
    "finish_s": np.array([1.5, 1.8, 2.1]),
    "prompt_tokens": np.array([10, 20, 30]),
    "output_tokens": np.array([5, 4, 1]),
    "steps": np.array([2, 3, 0]),
    "drafted": np.array([6, 9, 0]),
    "accepted": np.array([2, 0, 0]),
}
# 5 steps with drafts, 2 accepted (both in one step): 1 + 2 / 5; positions 1, 2 in 1 of 5 steps.
SUMMARY = {
    "duration_s": 2.5,
    "mean_acceptance_length": 1.4,
    "per_position_acceptance": [0.2, 0.2, 0.0],
}
TRAFFIC = Traffic(1.2, 1.0, None, 3)


def ms(value):
    return pytest.approx(value * 1000, rel=1e-12)


def test_the_result_holds_vllm_figures_worked_out_by_hand():
    result = bench_result(RECORDS, SUMMARY, TRAFFIC, "m")
    assert (result["request_rate"], result["burstiness"], result["max_concurrency"]) == (
        1.2,
        1.0,
        None,
    )
    assert (result["completed"], result["failed"], result["num_prompts"]) == (3, 0, 3)
    assert (result["total_input_tokens"], result["total_output_tokens"]) == (60, 10)
    assert result["request_throughput"] == pytest.approx(1.2)  # 3 / 2.5
    assert result["output_throughput"] == pytest.approx(4.0)  # 10 / 2.5
    assert result["total_token_throughput"] == pytest.approx(28.0)
    # TTFT 0.5, 0.2, 0.1: p90 at rank 1.8 of the sorted three = 0.2 + 0.8 x 0.3.
    assert (result["mean_ttft_ms"], result["median_ttft_ms"]) == (ms(0.8 / 3), ms(0.2))
    assert (result["p90_ttft_ms"], result["p99_ttft_ms"]) == (ms(0.44), ms(0.494))
    # TPOT over the two requests with 2+ tokens: (1.5 - 0.5) / 4 and (1.8 - 1.2) / 3.
    assert (result["mean_tpot_ms"], result["median_tpot_ms"]) == (ms(0.225), ms(0.225))
    # ITL: 2 gaps of 1.0 / 2 and 3 of 0.6 / 3 (one per step); p90 at rank 3.6 of 5.
    assert (result["mean_itl_ms"], result["median_itl_ms"], result["p90_itl_ms"]) == (
        ms(1.6 / 5),
        ms(0.2),
        ms(0.5),
    )
    # E2E 1.5, 0.8, 0.1: p90 at rank 1.8 = 0.8 + 0.8 x 0.7.
    assert (result["mean_e2el_ms"], result["p90_e2el_ms"]) == (ms(0.8), ms(1.36))
    assert result["std_e2el_ms"] == ms(float(np.std([1.5, 0.8, 0.1])))
    # drafts = 2 accepted / (1.4 - 1) = 5; per position 1, 1, 0 of 5; 2 of 15 drafted = 13.3 %.
    assert result["spec_decode_num_drafts"] == 5 and result["spec_decode_draft_tokens"] == 15
    assert result["spec_decode_accepted_tokens"] == 2
    assert result["spec_decode_acceptance_length"] == pytest.approx(1.4)
    assert result["spec_decode_acceptance_rate"] == pytest.approx(200 / 15)
    assert result["spec_decode_per_position_acceptance_rates"] == [0.2, 0.2, 0.0]
    # vLLM 0.33 keeps these two arrays without --save-detailed, and drops the others.
    assert (
        result["latencies"] == pytest.approx([1.5, 0.8, 0.1]) and result["queue_times"] == [0.0] * 3
    )
    assert not {"ttfts", "itls", "input_lens", "errors", "date", "generated_texts"} & set(result)


def test_detailed_arrays_and_an_infinite_rate():
    result = bench_result(
        RECORDS,
        SUMMARY,
        Traffic(math.inf, 1.0, 2, 3),
        "m",
        save_detailed=True,
        date="20260101-000000",
    )
    assert (result["request_rate"], result["max_concurrency"], result["date"]) == (
        "inf",
        2,
        "20260101-000000",
    )
    assert result["itls"] == [pytest.approx([0.5, 0.5]), pytest.approx([0.2, 0.2, 0.2]), []]
    assert result["input_lens"] == [10, 20, 30] and result["output_lens"] == [5, 4, 1]
    assert result["start_times"] == [0.0, 1.0, 2.0] and result["errors"] == ["", "", ""]


def test_a_run_without_drafts_has_no_spec_decode_keys():
    plain = {**RECORDS, "drafted": np.zeros(3, dtype=int), "accepted": np.zeros(3, dtype=int)}
    result = bench_result(plain, {**SUMMARY, "per_position_acceptance": []}, TRAFFIC, "m")
    assert not any(key.startswith("spec_decode") for key in result)


def test_the_same_run_writes_the_same_bytes():
    first = json.dumps(bench_result(RECORDS, SUMMARY, TRAFFIC, "m", save_detailed=True))
    assert first == json.dumps(bench_result(RECORDS, SUMMARY, TRAFFIC, "m", save_detailed=True))


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    """A simulated speculative run: 400 requests at 30/s, k = 3 (seed 2)."""
    from specsim.scenario import Scenario
    from specsim.simulation import run_simulation
    from specsim.simulation.records import read_records

    data = Path(__file__).parent / "data"
    scenario = Scenario.model_validate(
        {
            "seed": 2,
            "profile": "sim_profile.yaml",
            "workload": {
                "kind": "poisson",
                "rate": 30.0,
                "requests": 400,
                "prompt": {"dist": "uniform", "low": 50, "high": 500},
                "output": {"dist": "uniform", "low": 5, "high": 100},
            },
            "speculation": {"drafter": "c05", "k": 3},
        }
    ).with_source(data / "scenario.yaml")
    path = tmp_path_factory.mktemp("sim") / "requests.csv"
    summary = run_simulation(scenario, records_path=path).summary
    return read_records(path), summary, tmp_path_factory.mktemp("bench")


@pytest.mark.parametrize("detailed", [False, True])
def test_written_by_the_writer_read_by_the_reader_equal_metrics(simulated, detailed):
    from specsim.metrics import exact_summary, request_latencies

    records, summary, folder = simulated
    path = folder / f"result-{detailed}.json"
    result = bench_result(
        records, summary, Traffic(30.0, 1.0, None, 400), "sim-model", save_detailed=detailed
    )
    path.write_text(json.dumps(result), encoding="utf-8")
    (run,) = read_bench_files([path])
    assert (run.engine, run.model, run.completed, run.traffic.request_rate) == (
        "vllm",
        "sim-model",
        400,
        30.0,
    )
    # The reference: specsim's own exact (np.percentile) statistics of the same records.
    expected = {name: exact_summary(values) for name, values in request_latencies(records).items()}
    decode = records["finish_s"] - records["first_token_s"]
    gaps = np.repeat(decode / np.maximum(records["steps"], 1), records["steps"])
    expected["itl_s"] = exact_summary(gaps)
    for name in ("ttft_s", "tpot_s", "e2e_s", "itl_s"):
        for statistic in ("mean", "p50", "p90", "p99"):
            key = f"{name}.{statistic}"
            assert run.metrics[key] == pytest.approx(expected[name][statistic], rel=1e-9), key
    tokens = int(records["output_tokens"].sum())
    assert run.metrics["throughput_tokens_per_s"] == pytest.approx(
        tokens / summary["duration_s"], rel=1e-12
    )
    assert run.lengths.output_mean == pytest.approx(tokens / 400, rel=1e-12)
    assert (run.lengths.output_lens is not None) == detailed
    spec = run.speculation
    assert spec.draft_tokens == int(records["drafted"].sum()) and spec.k == 3
    # The summary's figures carry 6 significant digits: the counts agree to that precision.
    assert spec.accepted_tokens == pytest.approx(int(records["accepted"].sum()), rel=1e-5, abs=3)
    assert spec.acceptance_length == pytest.approx(summary["mean_acceptance_length"], rel=1e-5)
    assert spec.per_position == pytest.approx(
        summary["per_position_acceptance"], abs=1 / spec.num_drafts
    )


def test_evenly_spaced_sends_are_written_inf_and_read_back(tmp_path):
    # vLLM writes an infinite rate as "inf"; JSON has no infinity, so the burstiness of evenly
    # spaced sends (a fixed-rate workload) is written the same way.
    data = bench_result(RECORDS, SUMMARY, Traffic(1.2, math.inf, None, 3), "m")
    assert data["burstiness"] == "inf"
    path = tmp_path / "even.json"
    path.write_text(json.dumps(data, allow_nan=False))
    (run,) = read_bench_files([path])
    assert run.traffic.burstiness == math.inf
