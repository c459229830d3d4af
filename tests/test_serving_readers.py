"""The readers on hand-written files in each engine's documented format (tests/data/bench/).

Every expected value is worked out by hand from the numbers in the fixture (the arithmetic is in
the comments), never read back from the reader. Times in the files are in ms (aggregates) or s
(arrays, duration); the readers give seconds.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from specsim.serving.detect import read_bench_files

DATA = Path(__file__).parent / "data" / "bench"
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"


def one(name: str):
    (run,) = read_bench_files([DATA / name])
    return run


def approx(value):
    return pytest.approx(value, rel=1e-12, abs=1e-15)


def test_vllm_033_result_with_speculation():
    run = one("vllm_v33_spec.json")
    assert (run.format, run.engine, run.model, run.engine_version) == (
        "vllm-bench",
        "vllm",
        LLAMA,
        None,
    )
    assert (run.traffic.request_rate, run.traffic.burstiness, run.traffic.max_concurrency) == (
        4.0,
        1.0,
        None,
    )
    assert (run.traffic.num_prompts, run.completed, run.duration_s) == (40, 40, 12.5)
    assert (run.lengths.input_mean, run.lengths.output_mean) == (1024, 128)  # 40960 / 40, 5120 / 40
    assert run.lengths.input_lens is None and run.lengths.start_times_s is None
    m = run.metrics
    # The aggregates, ms -> s; median is p50.
    assert (m["ttft_s.mean"], m["ttft_s.p50"], m["ttft_s.p99"]) == approx(
        (0.08525, 0.0805, 0.15075)
    )
    assert (m["tpot_s.mean"], m["tpot_s.p50"], m["tpot_s.p99"]) == approx((0.02275, 0.022, 0.031))
    assert (m["itl_s.mean"], m["itl_s.p50"], m["itl_s.p99"]) == approx((0.0569, 0.052, 0.11))
    # No e2el aggregates (not in the default --percentile-metrics), but vLLM 0.33 keeps its
    # latencies [2.00, 2.05, ..., 3.95]: mean 2 + 0.05 x 19.5; p90 at rank 0.9 x 39 = 35.1.
    assert m["e2e_s.mean"] == approx(2.975) and m["e2e_s.p50"] == approx(2.975)
    assert m["e2e_s.p90"] == approx(2.0 + 0.05 * 35.1) and m["e2e_s.p99"] == approx(
        2.0 + 0.05 * 38.61
    )
    assert "ttft_s.p90" not in m and not any(key.endswith(".std") for key in m)
    assert m["throughput_tokens_per_s"] == approx(409.6) and m["request_throughput"] == approx(3.2)
    assert run.itl_per_token is False
    spec = run.speculation
    assert (spec.k, spec.num_drafts, spec.draft_tokens, spec.accepted_tokens) == (
        3,
        2032,
        6096,
        3048,
    )
    assert spec.per_position == approx((0.75, 0.5, 0.25))  # 1524, 1016, 508 of 2032 drafts
    assert spec.acceptance_length == approx(2.5)  # 1 + 3048 / 2032
    assert spec.acceptance_rate == approx(0.5)  # the file's 50.0 (percent)
    assert not spec.scalar_only


def test_vllm_033_result_at_infinite_rate_with_extra_percentiles():
    run = one("vllm_v33_plain.json")
    assert run.traffic.request_rate == math.inf and run.traffic.max_concurrency == 8
    assert run.speculation is None
    m = run.metrics
    # latencies 1.0, 1.1, ..., 2.5 (16): p90 at rank 13.5, p99 at 14.85, p99.9 at 14.985.
    assert (m["e2e_s.mean"], m["e2e_s.p50"], m["e2e_s.p90"]) == approx((1.75, 1.75, 2.35))
    assert (m["e2e_s.p99"], m["e2e_s.p99.9"]) == approx((2.485, 2.4985))
    assert (m["ttft_s.p90"], m["ttft_s.p99.9"], m["tpot_s.p50"]) == approx((0.16, 0.1999, 0.0063))
    assert m["throughput_tokens_per_s"] == approx(4096 / 3.6)


def test_vllm_save_detailed_gives_lengths_send_times_and_missing_percentiles():
    run = one("vllm_v33_detailed.json")
    # Five requests sent, the third failed: the arrays are read without it.
    assert (run.completed, run.traffic.num_prompts) == (4, 5)
    assert run.lengths.input_lens == (100, 200, 120, 80)
    assert run.lengths.output_lens == (5, 4, 3, 6)
    assert run.lengths.start_times_s == approx((0.0, 0.25, 0.75, 1.0))
    assert (run.lengths.input_mean, run.lengths.output_mean) == (125, 4.5)  # 500 / 4, 18 / 4
    m = run.metrics
    # ttfts 0.10, 0.15, 0.12, 0.08: mean 0.1125, median 0.11, p90 at rank 2.7: 0.12 + 0.7 x 0.03.
    assert (m["ttft_s.mean"], m["ttft_s.p50"], m["ttft_s.p90"]) == approx((0.1125, 0.11, 0.141))
    # TPOT (latency - ttft) / (out - 1): 0.025, 0.03, 0.05, 0.02; p90 = 0.03 + 0.7 x 0.02.
    assert (m["tpot_s.mean"], m["tpot_s.p50"], m["tpot_s.p90"]) == approx((0.03125, 0.0275, 0.044))
    # ITL: 14 chunk gaps (8 x 0.02, 3 x 0.03, 0.04, 2 x 0.05): mean 0.39 / 14, p90 at rank 11.7.
    assert (m["itl_s.mean"], m["itl_s.p50"], m["itl_s.p90"]) == approx((0.39 / 14, 0.02, 0.047))
    # latencies 0.2, 0.24, 0.22, 0.18.
    assert (m["e2e_s.mean"], m["e2e_s.p90"], m["e2e_s.p99"]) == approx((0.21, 0.234, 0.2394))


def test_vllm_010_result_has_no_backend_key_and_says_it_records_no_counters():
    run = one("vllm_v102.json")
    assert (run.engine, run.traffic.burstiness, run.traffic.request_rate) == ("vllm", 0.5, 2.0)
    assert run.speculation is None and run.server == {"backend": "openai"}
    assert any("never records speculative counters" in note for note in run.notes)
    assert run.metrics["ttft_s.p99"] == approx(0.11) and "e2e_s.mean" not in run.metrics


def test_vllm_append_result_file_holds_one_run_per_line():
    first, second = read_bench_files([DATA / "vllm_v33_append.json"])
    assert (first.index, second.index) == (0, 1)
    assert (first.traffic.request_rate, second.traffic.request_rate) == (1.0, 2.0)
    assert first.label == second.label == "sweep" and first.sha256 == second.sha256
    # latencies 0.8 + 0.02 j (+ 0.1 in the second run), j = 0..9.
    assert (first.metrics["e2e_s.mean"], second.metrics["e2e_s.mean"]) == approx((0.89, 0.99))
    assert (first.metrics["ttft_s.mean"], second.metrics["ttft_s.mean"]) == approx((0.04, 0.045))
    assert second.where.endswith("(run 2)")


def test_vllm_2024_script_mean_and_median_e2el_are_swapped_back():
    run = one("vllm_2024_script.json")
    # The file says mean 1152 ms and median 1577 ms. Its arrays give E2E = TTFT + sum(ITL) of
    # 1.0, 1.1, 1.2, 3.0 (mean 1.575, median 1.15): the file's pair matches them crosswise.
    assert (run.metrics["e2e_s.mean"], run.metrics["e2e_s.p50"]) == approx((1.577, 1.152))
    assert run.metrics["e2e_s.p99"] == approx(2.948)  # percentiles were right
    assert any("swapped back" in note for note in run.notes)
    # ttfts 0.2, 0.3, 0.4, 0.2 and 20 gaps (12 x 0.2, 8 x 0.35).
    assert (run.metrics["ttft_s.mean"], run.metrics["ttft_s.p50"]) == approx((0.275, 0.25))
    assert run.metrics["itl_s.mean"] == approx(0.26)


def test_sglang_jsonl_two_runs_with_infinity_and_fixed_percentiles():
    first, second = read_bench_files([DATA / "sglang_two_runs.jsonl"])
    assert (first.format, first.engine, first.engine_version) == (
        "sglang-bench",
        "sglang",
        "0.5.23",
    )
    assert first.model == LLAMA
    assert (first.traffic.request_rate, first.traffic.max_concurrency) == (math.inf, 16)
    assert (second.traffic.request_rate, second.traffic.max_concurrency) == (8.0, None)
    # --random-input-len 1024 --random-output-len 256 --random-range-ratio 0.5: [512, 1024].
    assert (first.lengths.input_range, first.lengths.output_range) == ((512, 1024), (128, 256))
    assert (first.lengths.input_mean, first.lengths.output_mean) == (768, 192)  # 153600 / 200
    m = first.metrics
    assert (m["e2e_s.mean"], m["e2e_s.p50"], m["e2e_s.p90"], m["e2e_s.p95"]) == approx(
        (3.3, 3.15, 4.5, 4.9)
    )
    assert (m["ttft_s.p99"], m["itl_s.p95"]) == approx((0.24, 0.012))
    assert second.metrics["ttft_s.mean"] == approx(0.076)  # 76 ms
    assert first.metrics["throughput_tokens_per_s"] == approx(38400 / 41.5)
    assert first.itl_per_token is True  # the native sglang backend splits gaps per token
    spec = first.speculation
    assert (spec.k, spec.acceptance_length, spec.scalar_only) == (3, 2.85, True)
    assert spec.per_position is None and second.speculation.acceptance_length == 2.91
    assert any("since the server's last cache flush" in note for note in first.notes)
    assert first.server["speculative_algorithm"] == "EAGLE3"
    assert first.server["speculative_num_draft_tokens"] == 4 and "port" not in first.server


def test_normalised_csv_rows():
    plain, eagle, closed = read_bench_files([DATA / "normalised_runs.csv"])
    assert (plain.format, plain.engine, plain.model) == (
        "normalised-csv",
        "other",
        "Qwen/Qwen2.5-7B-Instruct",
    )
    assert (plain.traffic.request_rate, plain.lengths.input_range) == (2.0, (256, 768))
    assert plain.speculation is None and plain.lengths.output_range is None
    assert plain.metrics["throughput_tokens_per_s"] == approx(200 * 120 / 61.5)  # not given
    assert plain.metrics["request_throughput"] == approx(120 / 61.5)
    assert plain.metrics["ttft_s.p90"] == 0.12 and "itl_s.mean" not in plain.metrics
    assert eagle.metrics["throughput_tokens_per_s"] == 782.5  # given
    assert eagle.speculation.per_position == (0.6, 0.45, 0.25) and eagle.speculation.k == 3
    assert eagle.speculation.acceptance_length == 2.3 and not eagle.speculation.scalar_only
    assert (closed.traffic.request_rate, closed.traffic.max_concurrency) == (math.inf, 16)
    assert closed.speculation.acceptance_length == 2.1 and closed.speculation.scalar_only
    assert closed.speculation.k is None


def test_a_published_table_with_comments_and_throughput_only_rows_reads(tmp_path):
    """A table copied from a publication: its source in # lines, a row with throughput alone
    (its latencies missing, not refused) and a row with p95 and p99 but no p90."""
    table = tmp_path / "published.csv"
    table.write_text(
        "# Qwen3-8B on 1x H100, from a vendor's blog (figures as printed)\n"
        "label,engine,max_concurrency,completed,duration_s,input_mean,output_mean,"
        "throughput_tokens_per_s,tpot_s.p95,tpot_s.p99\n"
        "# concurrency 1: throughput only\n"
        "c1,vllm,1,100,120,1000,200,166.7,,\n"
        "c8,vllm,8,400,100,1000,200,800,0.011,0.013\n"
    )
    (c1, c8) = read_bench_files([table])
    assert c1.metrics == approx({"throughput_tokens_per_s": 166.7, "request_throughput": 100 / 120})
    assert (c8.metrics["tpot_s.p95"], c8.metrics["tpot_s.p99"]) == (0.011, 0.013)
    assert "tpot_s.p90" not in c8.metrics and c8.label == "c8"


def test_format_comes_from_the_content_not_the_name(tmp_path):
    renamed = tmp_path / "results.txt"
    renamed.write_bytes((DATA / "sglang_two_runs.jsonl").read_bytes())
    assert [run.format for run in read_bench_files([renamed])] == ["sglang-bench"] * 2


def test_several_files_of_one_deployment_are_read_in_order():
    runs = read_bench_files([DATA / "vllm_v33_spec.json", DATA / "vllm_v33_append.json"])
    assert [(Path(run.source).name, run.index) for run in runs] == [
        ("vllm_v33_spec.json", 0),
        ("vllm_v33_append.json", 0),
        ("vllm_v33_append.json", 1),
    ]
    assert len({run.sha256 for run in runs}) == 2


def test_the_reference_page_example_reads_as_it_says():
    from specsim.docs.bench_csv import bench_csv_page
    from specsim.serving.normalised import COLUMNS, EXAMPLE, read_runs

    plain, eagle = read_runs(EXAMPLE, "example.csv", "")
    assert (plain.traffic.request_rate, plain.speculation) == (2.0, None)
    assert (eagle.traffic.request_rate, eagle.traffic.max_concurrency) == (math.inf, 16)
    assert eagle.speculation.per_position == (0.6, 0.45, 0.25)
    assert eagle.speculation.acceptance_length == approx(2.3)  # 1 + the rates' sum
    page = bench_csv_page()
    assert all(f"| `{column.name}` |" in page for column in COLUMNS) and EXAMPLE in page


def _sglang_line(tmp_path, **changes):
    import json

    data = json.loads((DATA / "sglang_two_runs.jsonl").read_text().splitlines()[1])
    data.update(changes)
    path = tmp_path / "run.jsonl"
    path.write_text(json.dumps(data) + "\n")
    (run,) = read_bench_files([path])
    return run


def test_sglang_itl_is_per_token_only_where_its_client_splits_chunks(tmp_path):
    assert _sglang_line(tmp_path, backend="sglang-oai").itl_per_token is True  # accept_length set
    other = _sglang_line(tmp_path, backend="vllm", accept_length=None, server_info=None)
    assert (other.itl_per_token, other.engine, other.speculation, other.model) == (
        False,
        "vllm",
        None,
        None,
    )
    assert other.engine_version is None and other.server == {}
    oai_plain = _sglang_line(tmp_path, backend="sglang-oai", accept_length=None, server_info=None)
    assert oai_plain.itl_per_token is False


def test_vllm_without_per_position_rates_keeps_the_totals(tmp_path):
    import json

    data = json.loads((DATA / "vllm_v33_spec.json").read_text())
    data["spec_decode_per_position_acceptance_rates"] = []  # no per-position series scraped
    path = tmp_path / "run.json"
    path.write_text(json.dumps(data))
    (run,) = read_bench_files([path])
    assert (run.speculation.k, run.speculation.per_position) == (None, None)
    assert run.speculation.acceptance_length == approx(2.5)
