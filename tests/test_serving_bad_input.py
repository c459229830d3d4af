"""Bad benchmark files: one line naming the file, the key and the fix (a SpecsimError, which the
CLI turns into exit code 2). The readers are tested directly: no command reads these files yet.

Each case spoils one thing in a copy of a good fixture (tests/data/bench/).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from specsim.errors import SpecsimError
from specsim.serving.detect import read_bench_files
from specsim.serving.runs import BenchRun, Lengths, Traffic, check_pace

DATA = Path(__file__).parent / "data" / "bench"


def _vllm(name="vllm_v33_spec.json") -> dict:
    return json.loads((DATA / name).read_text())


def _sglang() -> list[dict]:
    return [json.loads(line) for line in (DATA / "sglang_two_runs.jsonl").read_text().splitlines()]


def _refused(tmp_path, content, *names: str, file="bad.json") -> str:
    """Read a file holding ``content``: refused in one line naming the file and ``names``."""
    path = tmp_path / file
    if isinstance(content, dict):
        content = json.dumps(content)
    elif isinstance(content, list):
        content = "\n".join(json.dumps(item) for item in content)
    path.write_text(content, encoding="utf-8")
    with pytest.raises(SpecsimError) as caught:
        read_bench_files([path])
    line = caught.value.one_line()
    assert "\n" not in line and file in line and "fix:" in line, line
    for name in names:
        assert name in line, line
    return line


def _edited(data: dict, **changes) -> dict:
    out = dict(data)
    for key, value in changes.items():
        if value is None:
            del out[key]
        else:
            out[key] = value
    return out


# -- formats ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "names"),
    [
        ("hello, world\n", ["not a benchmark result of a known format"]),
        ('{"benchmarks": [{"type_": "generative_benchmark"}]}', ["neither a vLLM result"]),
        ("", ["file is empty"]),
        ('{"model_id": "m", "duration": 1.0', ["invalid JSON", "line 1"]),
        ("[1, 2]", ["not a benchmark result"]),
        ('{"model_id": "m", "duration": 1}\n[1]', ["expected a JSON object", "line 2"]),
        ((DATA / "vllm_metrics.txt").read_text(), ["a /metrics scrape", "profile calibrate"]),
    ],
    ids=["text", "guidellm-json", "empty", "truncated-json", "json-list", "jsonl-list", "scrape"],
)
def test_a_file_of_an_unknown_format_is_refused(tmp_path, content, names):
    _refused(tmp_path, content, *names)


def test_one_file_with_both_tools_results_is_refused(tmp_path):
    _refused(tmp_path, [_vllm(), _sglang()[0]], "both vLLM's and SGLang's")


# -- missing or impossible values ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "names"),
    [
        ({"duration": None}, ["duration", "missing"]),
        ({"total_output_tokens": None}, ["total_output_tokens", "missing"]),
        ({"output_throughput": None}, ["output_throughput", "missing"]),
        ({"mean_ttft_ms": float("nan")}, ["mean_ttft_ms", "not a finite number"]),
        ({"p99_tpot_ms": float("inf")}, ["p99_tpot_ms", "not a finite number"]),
        ({"mean_itl_ms": -1.0}, ["mean_itl_ms", "negative"]),
        ({"duration": -12.5}, ["duration", "negative"]),
        ({"request_rate": "fast"}, ["request_rate", "not a number"]),
        ({"request_rate": 0}, ["request_rate", "is 0"]),
        ({"completed": 39.5}, ["completed", "whole number"]),
        ({"completed": 0}, ["completed", "completed nothing"]),
        ({"num_prompts": 30}, ["num_prompts", "of 30 sent"]),
        ({"model_id": 7}, ["model_id", "expected text"]),
        ({"latencies": [1.0] * 39}, ["latencies", "39 entries"]),
        ({"ramp_up_strategy": "linear"}, ["ramp_up_strategy", "fixed --request-rate"]),
        ({"p101_ttft_ms": 1.0}, ["p101_ttft_ms", "above 100"]),
    ],
)
def test_vllm_missing_or_impossible_values_are_refused(tmp_path, changes, names):
    _refused(tmp_path, _edited(_vllm(), **changes), *names)


def test_vllm_without_any_latency_aggregate_is_refused(tmp_path):
    data = {k: v for k, v in _vllm().items() if not k.endswith("_ms")}
    _refused(tmp_path, data, "no latency aggregates", "tokenizer")


@pytest.mark.parametrize(
    ("changes", "names"),
    [
        ({"spec_decode_num_drafts": None}, ["spec_decode_num_drafts", "without its counters"]),
        ({"spec_decode_acceptance_rate": 0.5}, ["spec_decode_acceptance_rate", "percent"]),
        ({"spec_decode_acceptance_length": 1.5}, ["spec_decode_acceptance_length", "1 + accepted"]),
        (
            {"spec_decode_per_position_acceptance_rates": [0.75, 2 / 3, 0.5]},  # conditional
            ["spec_decode_per_position_acceptance_rates", "prefix rates"],
        ),
        ({"spec_decode_accepted_tokens": 7000}, ["spec_decode_draft_tokens", "more accepted"]),
        ({"spec_decode_num_drafts": 0}, ["spec_decode_num_drafts", "no drafts"]),
    ],
)
def test_vllm_speculative_counters_that_disagree_or_are_missing_are_refused(
    tmp_path, changes, names
):
    _refused(tmp_path, _edited(_vllm(), **changes), *names)


def test_vllm_figures_that_disagree_with_the_file_itself_are_refused(tmp_path):
    _refused(tmp_path, _edited(_vllm(), output_throughput=500.0), "output_throughput", "5120")
    _refused(tmp_path, _edited(_vllm(), request_throughput=3.0), "request_throughput")
    detailed = _vllm("vllm_v33_detailed.json")
    _refused(tmp_path, _edited(detailed, mean_ttft_ms=120.0), "ttft_s.mean", "per-request arrays")
    _refused(tmp_path, _edited(detailed, total_input_tokens=600), "input_lens", "600")
    _refused(tmp_path, _edited(detailed, errors=[""] * 5), "errors", "5 rows")
    _refused(tmp_path, _edited(detailed, median_ttft_ms=110.0, p50_ttft_ms=111.0), "p50_ttft_ms")


def test_vllm_2024_e2el_without_arrays_is_dropped_not_guessed(tmp_path):
    data = _vllm("vllm_2024_script.json")
    for key in ("ttfts", "itls", "errors", "input_lens", "output_lens", "generated_texts"):
        del data[key]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(data))
    (run,) = read_bench_files([path])
    assert "e2e_s.mean" not in run.metrics and "e2e_s.p50" not in run.metrics
    assert run.metrics["e2e_s.p99"] == pytest.approx(2.948, rel=1e-12)
    assert any("left out" in note for note in run.notes)


def test_vllm_2024_e2el_that_already_agrees_with_the_arrays_is_kept(tmp_path):
    data = _vllm("vllm_2024_script.json")  # a fixed copy of the script: mean and median right
    data["mean_e2el_ms"], data["median_e2el_ms"] = data["median_e2el_ms"], data["mean_e2el_ms"]
    path = tmp_path / "fixed.json"
    path.write_text(json.dumps(data))
    (run,) = read_bench_files([path])
    assert (run.metrics["e2e_s.mean"], run.metrics["e2e_s.p50"]) == pytest.approx((1.577, 1.152))
    assert not any("swapped" in note for note in run.notes)


@pytest.mark.parametrize(
    ("changes", "names"),
    [
        ({"p95_ttft_ms": None}, ["p95_ttft_ms", "missing"]),
        ({"p99_itl_ms": "Infinity"}, ["p99_itl_ms", "not a number"]),
        ({"request_rate": "trace"}, ["request_rate", "trace"]),
        ({"request_rate": -8.0}, ["request_rate", "negative"]),
        ({"accept_length": 5.0}, ["accept_length", "outside [1, k + 1]"]),
        ({"accept_length": None}, ["accept_length", "without counters", "sglang backend"]),
        ({"server_info": "up"}, ["server_info"]),
        ({"output_throughput": 1.0}, ["output_throughput"]),
        ({"random_range_ratio": None}, ["random_range_ratio", "missing"]),
    ],
)
def test_sglang_missing_or_impossible_values_are_refused(tmp_path, changes, names):
    lines = _sglang()
    lines[1] = _edited(lines[1], **changes)
    assert "(run 2)" in _refused(tmp_path, lines, *names, file="bad.jsonl")


def test_sglang_bare_infinity_in_a_latency_is_refused(tmp_path):
    text = (
        (DATA / "sglang_two_runs.jsonl")
        .read_text()
        .replace('"p99_ttft_ms": 240.0', '"p99_ttft_ms": Infinity')
    )
    assert "Infinity" in text.split("\n")[0].split('"p99_ttft_ms"')[1][:12]
    _refused(tmp_path, text, "p99_ttft_ms", "not a finite number", file="bad.jsonl")


CSV = (DATA / "normalised_runs.csv").read_text()


@pytest.mark.parametrize(
    ("old", "new", "names"),
    [
        ("label,", "lable,", ["lable", "unknown column", "bench-csv.md"]),
        ("poisson-2,Qwen", "poisson-2,x,Qwen", ["more cells than columns"]),
        (",2,,120,61.5", ",two,,120,61.5", ["request_rate", "not a number"]),
        (",2,,120,61.5", ",,,120,61.5", ["request_rate", "missing"]),
        (",120,61.5,", ",120,nan,", ["duration_s", "not a finite"]),
        ("512,200,256,768", "512,200,256,", ["input_min/input_max", "both ends"]),
        ("512,200,256,768", "900,200,256,768", ["input_mean", "outside"]),
        ("782.5,on,3,2.3", "782.5,on,3,2.9", ["spec_per_position", "disagrees"]),
        ("0.6;0.45;0.25", "0.6;0.75;0.25", ["spec_per_position", "non-increasing"]),
        (",off,,,", ",off,3,,", ["spec_k", "speculation is off"]),
        (",,,2.1,", ",on,,,", ["spec_acceptance_length", "without counters"]),
        (",other,,16", ",tgi-ish,,16", ["engine", "one of"]),
        ("0.081,0.074,0.12,0.2,0.0151,0.022,3.1,4.6", ",,,,,,,", ["no latency or throughput"]),
    ],
)
def test_normalised_csv_bad_cells_are_refused(tmp_path, old, new, names):
    assert old in CSV
    _refused(tmp_path, CSV.replace(old, new, 1), *names, file="bad.csv")


# -- several files ---------------------------------------------------------------------------------


def test_results_of_two_models_or_two_engines_in_one_call_are_refused(tmp_path):
    with pytest.raises(SpecsimError, match=r"runs of two models.*Qwen") as caught:
        read_bench_files([DATA / "vllm_v33_spec.json", DATA / "normalised_runs.csv"])
    assert "normalised_runs.csv" in str(caught.value) and "fix:" in str(caught.value)
    with pytest.raises(SpecsimError, match=r"runs of two engines: 'vllm'.*'sglang'"):
        read_bench_files([DATA / "vllm_v33_spec.json", DATA / "sglang_two_runs.jsonl"])


def test_the_same_file_twice_is_refused(tmp_path):
    copy = tmp_path / "copy.json"
    copy.write_bytes((DATA / "vllm_v33_spec.json").read_bytes())
    with pytest.raises(SpecsimError, match=r"the same results as .*vllm_v33_spec.json"):
        read_bench_files([DATA / "vllm_v33_spec.json", copy])


def test_a_missing_file_or_a_folder_is_refused(tmp_path):
    with pytest.raises(SpecsimError, match="not found"):
        read_bench_files([tmp_path / "absent.json"])
    with pytest.raises(SpecsimError, match="found a folder"):
        read_bench_files([tmp_path])


# -- rate against duration -------------------------------------------------------------------------


def _run(rate: float, completed: int, duration: float, burstiness=1.0, cap=None) -> BenchRun:
    return BenchRun(
        source="x.json",
        sha256="",
        index=0,
        format="vllm-bench",
        engine="vllm",
        engine_version=None,
        model=None,
        label=None,
        traffic=Traffic(rate, burstiness, cap, completed),
        lengths=Lengths(1, 1),
        duration_s=duration,
        completed=completed,
        metrics={},
        itl_per_token=False,
        speculation=None,
    )


def test_a_run_too_short_for_its_rate_is_refused(tmp_path):
    data = _vllm("vllm_v102.json")  # 100 requests at 2/s, burstiness 0.5: at least 14.3 s
    changed = _edited(data, duration=10.0, request_throughput=10.0, output_throughput=1280.0)
    changed["total_token_throughput"] = (102400 + 12800) / 10.0
    _refused(tmp_path, changed, "request_rate/duration", "100 requests at 2 requests/s")
    # The same duration passes with a concurrency cap or an infinite rate (no open-loop pace).
    check_pace(_run(2.0, 100, 10.0, 0.5, cap=8), "request_rate", "duration")
    check_pace(_run(math.inf, 100, 10.0), "request_rate", "duration")


@pytest.mark.parametrize("burstiness", [1.0, 0.5, 4.0])
def test_the_pace_bound_passes_real_arrival_schedules_and_catches_a_tenth_of_it(burstiness):
    # 2000 gamma schedules of 100 requests at 2/s (seed 7): the duration can be no shorter than
    # the last send. The bound's false-alarm rate is below 3e-7 per run, so none of the 2000
    # may fail; a bound at 2 sigma instead of 5 fails 24 to 39 of them (1-2 %, this seed).
    rng = np.random.default_rng(7)
    rate, n = 2.0, 100
    gaps = rng.gamma(burstiness, 1 / (rate * burstiness), size=(2000, n - 1))
    for last_send in gaps.sum(axis=1):
        check_pace(_run(rate, n, float(last_send), burstiness), "request_rate", "duration")
    with pytest.raises(SpecsimError, match="take at least"):
        check_pace(_run(rate, n, 0.1 * n / rate, burstiness), "request_rate", "duration")
