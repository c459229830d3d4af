"""validate --bench: a serving engine's own benchmark runs against the simulator's prediction.

The runs come from ``bench_runs``: the prior ``calibration_prior.yaml`` with its terms scaled
(``TRUTH``: decode x 1.4, prefill x 0.7, ...), simulated at a few loads and written as vllm
bench serve 0.33 writes them. Validated on the truth profile, every figure is predicted within
the simulator's own draw-to-draw noise; on the prior (decode 1.4 x too fast) the latencies miss
by far more than the thresholds.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from pathlib import Path

import pytest
import yaml
from bench_runs import DRAFTER, PRIOR, Case, truth_profile, vllm_scrape, write_runs

import specsim
from specsim.cli import main
from specsim.errors import SpecsimError

CASES = [Case("off-r4", 4.0), Case("off-c8", math.inf, 8), Case("k2-r6", 6.0, k=2)]
REQUESTS = 60


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    """A plan's --out folder after bash engine/bench.sh vllm: results in engine/bench/vllm/,
    beside the engine files that are not results."""
    folder = tmp_path_factory.mktemp("bench")
    files = write_runs(folder / "made", CASES, requests=REQUESTS, seed=11)
    results = folder / "plan" / "engine" / "bench" / "vllm"
    results.mkdir(parents=True)
    for file in files:
        shutil.copy(file, results / Path(file).name)
    engine = folder / "plan" / "engine"
    (engine / "bench.sh").write_text("#!/usr/bin/env bash\n")
    (engine / "vllm.json").write_text('{"method": "draft_model", "num_speculative_tokens": 2}')
    truth = truth_profile(folder)
    return folder, files, truth


def scenario(folder: Path, profile: Path, k: int = 0) -> Path:
    """A scenario whose workload validate --bench ignores (each run brings its own)."""
    data = {
        "name": "bench-check",
        "profile": str(profile),
        "workload": {
            "kind": "poisson",
            "rate": 1.0,
            "requests": 4,
            "prompt": {"dist": "fixed", "value": 8},
            "output": {"dist": "fixed", "value": 8},
        },
        "speculation": {"drafter": DRAFTER, "k": k} if k else {},
    }
    path = folder / f"scenario-k{k}-{profile.stem}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def validate(capsys, bench_dir, scenario_file, out, *options) -> tuple[int, dict | str]:
    argv = ["validate", "--bench", str(bench_dir), str(scenario_file)]
    code = main([*argv, "--out", str(out), "--replications", "4", "--json", *options])
    captured = capsys.readouterr()
    return code, json.loads(captured.out) if code in (0, 1) else captured.err.strip()


def test_runs_of_the_truth_validate_on_the_truth_and_fail_on_the_prior(bench, tmp_path, capsys):
    folder, _, truth = bench
    plan = folder / "plan"
    # Only the speculation-off runs: a k = 0 scenario.
    off = tmp_path / "off"
    shutil.copytree(plan, off)
    (off / "engine" / "bench" / "vllm" / "k2-r6.json").unlink()
    code, summary = validate(capsys, off, scenario(tmp_path, truth), tmp_path / "ok")
    assert code == 0 and summary["passed"]
    assert [run["label"] for run in summary["runs"]] == ["off-c8", "off-r4"]  # name order
    for run in summary["runs"]:
        rows = {row["metric"]: row for row in run["rows"]}
        # Every figure of the file that the simulation gives, as the client measured it.
        expected = {f"{m}.{s}" for m in ("ttft_s", "tpot_s", "e2e_s") for s in ("mean", "p50")}
        expected |= {"itl_s.mean", "throughput_tokens_per_s", "request_throughput"}
        assert expected <= set(rows)
        assert set(run["not_compared"]) == {"itl_s.p50", "itl_s.p90", "itl_s.p99"}
        assert rows["e2e_s.p90"]["threshold"] == 0.10 and rows["e2e_s.mean"]["threshold"] == 0.05
        # The same requests at the same instants on the same costs (no jitter, no speculation):
        # equal up to the records' rounding, 1 us on times of 10 ms and more (both sides).
        for row in rows.values():
            assert row["relative_error"] == pytest.approx(0.0, abs=2e-4), row["metric"]
    assert summary["runs"][0]["workload"]["arrivals"] == "a closed loop of 8 clients"
    out = tmp_path / "ok"
    for name in ("comparison.json", "comparison.md", "validation.png", "validation.csv"):
        assert (out / name).is_file()
    for run in summary["runs"]:
        for name in ("workload.csv", "requests.csv", "summary.json"):
            assert (out / "runs" / run["name"] / name).is_file()
    back = specsim.load_run(out)  # the Python API reads the folder back
    assert isinstance(back, specsim.BenchValidationRun) and back.passed
    assert back.metrics["run"].unique().tolist() == ["01-off-c8", "02-off-r4"]
    assert len(back.metrics) == sum(len(run["rows"]) for run in summary["runs"])
    assert back.runs["02-off-r4"].summary["requests"] == REQUESTS
    # The prior's decode is 1.4 x too fast: the latencies are predicted far too short.
    code, summary = validate(capsys, off, scenario(tmp_path, PRIOR), tmp_path / "prior")
    assert code == 1 and not summary["passed"]
    for run in summary["runs"]:
        rows = {row["metric"]: row for row in run["rows"]}
        assert rows["tpot_s.mean"]["relative_error"] < -0.2
        assert rows["e2e_s.mean"]["ok"] is False


def test_a_speculative_run_is_compared_on_its_counted_acceptance_length(bench, tmp_path, capsys):
    _, files, truth = bench
    runs = tmp_path / "spec"
    runs.mkdir()
    (spec_file,) = [f for f in files if f.endswith("k2-r6.json")]
    shutil.copy(spec_file, runs)
    code, summary = validate(capsys, runs, scenario(tmp_path, truth, k=2), tmp_path / "out")
    (run,) = summary["runs"]
    rows = {row["metric"]: row for row in run["rows"]}
    counted = json.loads(Path(spec_file).read_text())["spec_decode_acceptance_length"]
    assert rows["mean_acceptance_length"]["measured"] == pytest.approx(counted, rel=1e-9)
    assert rows["mean_acceptance_length"]["threshold"] == 0.03
    # Other acceptance draws than the run's: the lengths differ a little, well within 3 %.
    assert abs(rows["mean_acceptance_length"]["relative_error"]) < 0.03
    assert run["speculation"] == {"k": 2, "scalar_only": False}
    assert code == (0 if summary["passed"] else 1)


def spoil(folder: Path, files: list[str], what: str) -> Path:
    """A results folder with one thing wrong."""
    out = folder / what
    out.mkdir()
    off, spec = Path(files[0]), Path(files[2])
    if what == "empty":
        return out
    shutil.copy(off, out)
    data = json.loads(off.read_text())
    if what == "only-notes":
        (out / off.name).unlink()
        (out / "server.log").write_text("INFO: Started server process\n")
    elif what == "two-models":
        (out / "other.json").write_text(json.dumps({**data, "model_id": "other/model"}))
    elif what == "two-engines":
        (out / "other.json").write_text(json.dumps({**data, "backend": "sglang"}))
    elif what == "missing-key":
        del data["completed"]
        (out / "other.json").write_text(json.dumps(data))
    elif what == "rate-and-duration":
        (out / "other.json").write_text(json.dumps({**data, "duration": 1.0}))
    elif what == "spec-without-counters":
        spec_data = json.loads(spec.read_text())
        del spec_data["spec_decode_num_drafts"]
        (out / "other.json").write_text(json.dumps(spec_data))
    elif what in ("spec-run-k0-scenario", "other-k"):
        shutil.copy(spec, out)
        (out / off.name).unlink()
    elif what == "speculating-scenario-plain-run":
        pass
    elif what == "bench-sh-not-run":
        (out / off.name).unlink()
        (out / "engine").mkdir()
        (out / "engine" / "bench.sh").write_text("#!/usr/bin/env bash\n")
    return out


BAD = {
    "empty": (0, "holds no benchmark result files"),
    "only-notes": (0, "holds no benchmark result files (skipped "),
    "two-models": (0, "runs of two models"),
    "two-engines": (0, "runs of two engines"),
    "missing-key": (0, "completed: missing"),
    "rate-and-duration": (0, "take at least"),
    "spec-without-counters": (2, "a speculative run without its counters"),
    "speculating-scenario-plain-run": (2, "without speculative decoding counters, and the"),
    "spec-run-k0-scenario": (0, "a speculative run, and the scenario does not speculate"),
    "other-k": (3, "the run drafted 2 tokens per step; the scenario's k is 3"),
    "bench-sh-not-run": (0, "no results: engine/bench is missing"),
}


@pytest.mark.parametrize("what", list(BAD))
def test_bad_results_are_refused_in_one_line_with_nothing_written(bench, tmp_path, capsys, what):
    _, files, truth = bench
    k, expected = BAD[what]
    given = spoil(tmp_path, files, what)
    out = tmp_path / "out"
    code, err = validate(capsys, given, scenario(tmp_path, truth, k=k), out)
    assert code == 2
    assert expected in err and "\n" not in err, err
    assert not out.exists()


def test_relative_folders_resolve_from_the_working_folder(bench, tmp_path, capsys, monkeypatch):
    """The replayed traces sit in the output folder; the scenario's own relative paths resolve
    against its file's folder, which must not move them."""
    folder, _, truth = bench
    elsewhere = tmp_path / "scenarios"
    elsewhere.mkdir()
    shutil.copytree(folder / "plan", tmp_path / "plan")
    (tmp_path / "plan" / "engine" / "bench" / "vllm" / "k2-r6.json").unlink()
    monkeypatch.chdir(tmp_path)
    code, summary = validate(capsys, "plan", scenario(elsewhere, truth), "runs/check")
    assert code in (0, 1), summary
    assert (tmp_path / "runs" / "check" / "comparison.json").is_file()


def test_options_of_the_built_in_engine_are_refused_with_bench(bench, tmp_path, capsys):
    folder, _, truth = bench
    code, err = validate(
        capsys, folder / "plan", scenario(tmp_path, truth), tmp_path / "o", "--clock", "cpu"
    )
    assert code == 2 and "--clock: sets up the built-in engine, and --bench runs none" in err
    assert not (tmp_path / "o").exists()


def test_sglang_results_are_read_by_content_with_their_scalar_acceptance(tmp_path):
    """SGLang bench_serving JSONL (two runs in one file, a scalar accept_length each) under a
    name that says nothing is found and read; its k (server_info's num_steps) is checked
    against the scenario's, and its scalar is the measured acceptance length. (No simulation:
    the fixture's 200 requests of an 8B deployment take minutes to simulate on 2 cores.)"""
    from specsim.scenario import load_scenario
    from specsim.serving.detect import read_bench_files
    from specsim.serving.runs import SpecCounters
    from specsim.validation.bench import check_speculation, measured_acceptance, result_files

    data = Path(__file__).parent / "data" / "bench" / "sglang_two_runs.jsonl"
    folder = tmp_path / "results"
    folder.mkdir()
    shutil.copy(data, folder / "out.log")
    (folder / ".hidden").write_text("an editor's backup, skipped\n")
    files = result_files(folder)
    assert files == [folder / "out.log"]
    runs = read_bench_files(files)
    assert [(r.engine, r.format) for r in runs] == [("sglang", "sglang-bench")] * 2
    assert [measured_acceptance(r) for r in runs] == [2.85, 2.91]
    path = scenario(tmp_path, PRIOR, k=3)
    for run in runs:
        check_speculation(run, load_scenario(path))
    with pytest.raises(SpecsimError, match="the scenario's k is 2"):
        check_speculation(runs[0], load_scenario(scenario(tmp_path, PRIOR, k=2)))
    # A draft acceptance rate alone: L = 1 + k x rate.
    rate_only = dataclasses.replace(runs[0], speculation=SpecCounters(4, acceptance_rate=0.5))
    assert measured_acceptance(rate_only) == 3.0


def test_a_scrape_gives_a_result_file_without_counters_its_acceptance(bench, tmp_path, capsys):
    # The k = 2 run with its spec_decode_* keys dropped (an older layout), and its server's
    # scrape: with --metrics it is compared on the scrape's counted length, as the full file is.
    _, files, truth = bench
    (spec_file,) = [f for f in files if f.endswith("k2-r6.json")]
    data = json.loads(Path(spec_file).read_text())
    runs = tmp_path / "old"
    runs.mkdir()
    stripped = runs / "k2-r6.json"
    stripped.write_text(json.dumps({k: v for k, v in data.items() if "spec_decode" not in k}))
    scrape = tmp_path / "metrics.txt"  # outside the results folder, which is read whole
    scrape.write_text(vllm_scrape(data))
    spec_scenario = scenario(tmp_path, truth, k=2)
    options = ("--metrics", f"{stripped}={scrape}")
    _, summary = validate(capsys, runs, spec_scenario, tmp_path / "out", *options)
    (run,) = summary["runs"]
    rows = {row["metric"]: row for row in run["rows"]}
    expected = 1 + data["spec_decode_accepted_tokens"] / data["spec_decode_num_drafts"]
    assert rows["mean_acceptance_length"]["measured"] == pytest.approx(expected, rel=1e-9)
    # Without it the file reads as speculation off, which a speculating scenario refuses.
    argv = ["validate", "--bench", str(runs), str(spec_scenario)]
    assert main([*argv, "--out", str(tmp_path / "off")]) == 2
    capsys.readouterr()
    assert main([*argv[:1], str(spec_scenario), *options, "--out", str(tmp_path / "x")]) == 2
    assert "no --bench is given" in capsys.readouterr().err


def test_a_server_log_beside_the_results_is_skipped_and_one_replication_is_accepted(
    bench, tmp_path, capsys
):
    _, files, truth = bench
    runs = tmp_path / "runs"
    runs.mkdir()
    shutil.copy(files[0], runs)
    (runs / "server.log").write_text("INFO: Started server process [1]\n")
    argv = [runs, scenario(tmp_path, truth), tmp_path / "out", "--replications", "1"]
    code, summary = validate(capsys, *argv)
    assert code in (0, 1), summary
    assert summary["skipped"] == {
        str(runs / "server.log"): "not a benchmark result of a known format"
    }
    (run,) = summary["runs"]
    assert all(row["band"] is None for row in run["rows"])  # one draw: no band
    text = (tmp_path / "out" / "comparison.md").read_text()
    assert f"skipped {runs / 'server.log'}: not a benchmark result" in text


def test_latency_thresholds_move_to_p95_where_a_run_has_no_p90():
    from specsim.validation.compare import compare_figures, tail_thresholds

    keys = ["ttft_s.p95", "ttft_s.p99", "tpot_s.p90", "tpot_s.p95", "e2e_s.mean"]
    thresholds = tail_thresholds(keys)
    assert thresholds["ttft_s.p95"] == 0.10 and "ttft_s.p90" not in thresholds
    assert "ttft_s.p99" not in thresholds and "tpot_s.p95" not in thresholds
    assert thresholds["tpot_s.p90"] == 0.10 and thresholds["e2e_s.p90"] == 0.10  # kept
    draw = {key: 1.2 for key in keys}
    rows = {
        r.metric: r
        for r in compare_figures(keys, [draw], dict.fromkeys(keys, 1.0), thresholds).rows
    }
    assert rows["ttft_s.p95"].ok is False and rows["ttft_s.p99"].ok is None


def test_engine_caps_come_from_the_scenario_a_server_log_or_the_engine_and_say_which(
    bench, tmp_path, capsys
):
    _, files, truth = bench
    runs = tmp_path / "runs"
    runs.mkdir()
    shutil.copy(files[0], runs)
    code, summary = validate(
        capsys, runs, scenario(tmp_path, truth), tmp_path / "a", "--replications", "0"
    )
    assert code in (0, 1), summary
    default = "vLLM 0.33's API-server default (test-gpu, 75 GiB)"
    assert summary["engine_caps"]["max_batch"] == {"value": 1024, "source": default}
    assert summary["engine_caps"]["max_batched_tokens"] == {"value": 8192, "source": default}
    # The scenario's own setting, and the server's log for what the scenario leaves unset.
    log = tmp_path / "server.log"
    log.write_text("INFO non-default args: {'max_num_seqs': 64, 'max_num_batched_tokens': 2048}\n")
    path = scenario(tmp_path, truth)
    argv = ["--set", "engine.max_batch=32", "--server-args", str(log), "--replications", "0"]
    code, summary = validate(capsys, runs, path, tmp_path / "b", *argv)
    assert code in (0, 1), summary
    assert summary["engine_caps"]["max_batch"] == {
        "value": 32,
        "source": f"{path} (engine.max_batch)",
    }
    assert summary["engine_caps"]["max_batched_tokens"] == {
        "value": 2048,
        "source": "server.log (max_num_batched_tokens)",
    }
    (run,) = summary["runs"]
    assert run["workload"]["engine"] == {"max_batch": 32, "max_batched_tokens": 2048}


def test_a_run_s_hit_share_replaces_the_scenario_s_prefix_which_is_kept_otherwise(
    bench, tmp_path, capsys
):
    _, files, truth = bench
    runs = tmp_path / "runs"
    runs.mkdir()
    shutil.copy(files[0], runs)
    result = runs / Path(files[0]).name
    plain = scenario(tmp_path, truth)
    cached = tmp_path / "cached.yaml"
    data = yaml.safe_load(plain.read_text())
    data["workload"]["prefix"] = {"source": "fraction", "fraction": 0.5}
    cached.write_text(yaml.safe_dump(data))

    def ttft(summary) -> tuple[dict | None, float]:
        (run,) = summary["runs"]
        rows = {row["metric"]: row for row in run["rows"]}
        return run["workload"]["prefix"], rows["ttft_s.mean"]["predicted"]

    once = ("--replications", "0")
    _, none = validate(capsys, runs, plain, tmp_path / "none", *once)
    _, kept = validate(capsys, runs, cached, tmp_path / "kept", *once)
    stated = ("--prefix-hit", f"{result}=0.9", *once)
    _, share = validate(capsys, runs, cached, tmp_path / "share", *stated)
    assert ttft(none)[0] is None
    assert ttft(kept)[0] == {"source": "fraction", "fraction": 0.5, "hit_rate": 1.0}
    assert ttft(share)[0] == {"source": "fraction", "fraction": 0.9, "hit_rate": 1.0}
    # Cached prompt tokens skip prefill: the more cached, the shorter the predicted TTFT.
    assert ttft(none)[1] > ttft(kept)[1] > ttft(share)[1]
