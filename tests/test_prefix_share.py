"""A run's prefix-cache hit share: from a /metrics scrape, stated per result file or per table
row, and replayed as the workload's cached prefix (``specsim.serving.prefix_share``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from specsim.calibration.workload import EngineDefaults, replay
from specsim.errors import SpecsimError
from specsim.serving.detect import read_bench_files
from specsim.serving.prefix_share import parse_share, scrape_share, state_shares
from specsim.serving.prometheus_text import parse_prometheus
from specsim.serving.scrapes import attach_scrapes

DATA = Path(__file__).parent / "data" / "bench"
VLLM_CACHE = (
    "# TYPE vllm:prefix_cache_queries counter\n"
    'vllm:prefix_cache_queries_total{engine="0",model_name="m"} 6000.0\n'
    'vllm:prefix_cache_queries_total{engine="1",model_name="m"} 4000.0\n'
    "# TYPE vllm:prefix_cache_hits counter\n"
    'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 4500.0\n'
    'vllm:prefix_cache_hits_total{engine="1",model_name="m"} 1500.0\n'
)


def test_a_scrape_s_cache_counters_give_the_hit_share_summed_over_series():
    share, words = scrape_share(parse_prometheus(VLLM_CACHE, "m.txt"), "m.txt")
    assert share == pytest.approx(0.6) and "since the server started" in words
    sglang = parse_prometheus('sglang:cache_hit_rate{model_name="m"} 0.42\n', "s.txt")
    assert scrape_share(sglang, "s.txt")[0] == 0.42
    assert scrape_share(parse_prometheus("vllm:num_requests_running 3\n", "x"), "x") is None
    bad = VLLM_CACHE.replace("4500.0", "9500.0")  # more hits than queries
    with pytest.raises(SpecsimError, match="vllm:prefix_cache_hits"):
        scrape_share(parse_prometheus(bad, "bad.txt"), "bad.txt")


def test_a_scrape_with_cache_series_only_gives_a_plain_run_its_share(tmp_path):
    scrape = tmp_path / "metrics.txt"
    scrape.write_text(VLLM_CACHE)
    result = DATA / "vllm_v33_spec.json"
    (run,) = attach_scrapes(read_bench_files([result]), [(str(result), str(scrape))])
    assert run.prefix_hit_share == pytest.approx(0.6)
    assert run.speculation is not None  # its own counters kept, not refused
    assert any("prefix-cache hit share 0.6 from" in note for note in run.notes)


def test_a_stated_share_is_replayed_as_that_fraction_of_every_prompt_cached(tmp_path):
    result = DATA / "vllm_v33_spec.json"
    (run,) = state_shares(read_bench_files([result]), [parse_share(f"{result}=0.25")])
    assert run.prefix_hit_share == 0.25
    replayed = replay(run, tmp_path / "trace.csv", None, EngineDefaults())
    prefix = replayed.scenario("profile.yaml").workload.prefix
    assert (prefix.source, prefix.fraction, prefix.hit_rate) == ("fraction", 0.25, 1.0)
    assert replayed.describe()["prefix_hit_share"] == 0.25
    plain = replay(
        dataclasses.replace(run, prefix_hit_share=None), tmp_path / "t.csv", None, EngineDefaults()
    )
    assert plain.scenario("profile.yaml").workload.prefix is None
    for text in ("x", "a.json=1.5", "a.json=", "=0.2"):
        with pytest.raises(SpecsimError, match="--prefix-hit"):
            parse_share(text)
    with pytest.raises(SpecsimError, match="not one of the benchmark result files"):
        state_shares([run], [("other.json", 0.2)])


def test_a_table_row_states_its_own_share(tmp_path):
    table = tmp_path / "runs.csv"
    table.write_text(
        "label,max_concurrency,completed,duration_s,input_mean,output_mean,ttft_s.mean,"
        "prefix_hit_share\n"
        "turns,4,100,50,5800,200,0.106,0.92\n"
        "cold,4,100,90,5800,200,0.9,\n"
    )
    turns, cold = read_bench_files([table])
    assert (turns.prefix_hit_share, cold.prefix_hit_share) == (0.92, None)


def test_a_scenario_prefix_read_from_trace_columns_is_refused_for_runs_without_a_share(tmp_path):
    from specsim.scenario import Scenario
    from specsim.validation.bench import check_prefix

    trace = tmp_path / "t.csv"
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens,session_id\n0,8,8,a\n")
    scenario = Scenario.model_validate(
        {
            "profile": str(DATA / "calibration_prior.yaml"),
            "workload": {
                "kind": "trace",
                "trace": str(trace),
                "format": "vidur",
                "prefix": {"source": "session"},
            },
        }
    )
    (run,) = read_bench_files([DATA / "vllm_v33_spec.json"])
    with pytest.raises(SpecsimError, match=r"workload\.prefix\.source: the scenario"):
        check_prefix([run], scenario)
    check_prefix([dataclasses.replace(run, prefix_hit_share=0.3)], scenario)  # its own share
