"""`specsim simulate` end to end: outputs, --json, --compare-baseline, and one-line errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from specsim.cli import main
from specsim.metrics import RECORD_COLUMNS
from specsim.simulation.records import read_records

DATA = Path(__file__).parent / "data"

SCENARIO = """\
name: cli-test
seed: 5
profile: sim_profile.yaml
workload:
  kind: poisson
  rate: 10
  requests: 120
  prompt: {dist: uniform, low: 20, high: 200}
  output: {dist: uniform, low: 10, high: 80}
engine: {max_batch: 16}
speculation: {drafter: c05, k: 3}
slo: {ttft_s: 0.5, tpot_s: 0.01}
"""

SUMMARY_KEYS = {
    "requests", "duration_s", "throughput_tokens_per_s", "ttft_s", "tpot_s", "itl_s", "e2e_s",
    "queueing_s", "mean_acceptance_length", "draft_acceptance_rate", "per_position_acceptance",
    "flops_total", "flops_drafter", "flops_verification", "flops_wasted",
    "flops_wasted_fraction", "cost_usd_per_million_tokens", "goodput_requests_per_s",
    "kv_cache_utilisation", "batch_size", "preemptions", "scenario", "lossy", "lossy_note",
    "pools",
}  # fmt: skip


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    for name in ("sim_profile.yaml", "sim_sequences.txt", "vidur_small.csv", "azure_bad_row.csv"):
        shutil.copy(DATA / name, tmp_path / name)
    (tmp_path / "s.yaml").write_text(SCENARIO)
    return tmp_path


def test_simulate_writes_records_and_summary(workdir, capsys):
    out = workdir / "run"
    assert main(["simulate", str(workdir / "s.yaml"), "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary) >= SUMMARY_KEYS
    for key in ("ttft_s", "tpot_s", "itl_s", "e2e_s", "queueing_s"):
        assert set(summary[key]) == {"mean", "p50", "p90", "p99"}
    assert summary["scenario"]["drafter"] == "c05" and summary["scenario"]["k"] == 3
    rec = read_records(out / "requests.csv")
    assert list(rec) == list(RECORD_COLUMNS) and rec["id"].shape[0] == 120
    printed = capsys.readouterr().out
    assert "cli-test: 120 requests" in printed and "TPOT" in printed


def test_rerun_is_byte_identical_and_json_goes_to_stdout(workdir, capsys):
    args = ["simulate", str(workdir / "s.yaml"), "--set", "speculation.k=2"]
    assert main([*args, "--out", str(workdir / "a"), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert main([*args, "--out", str(workdir / "b")]) == 0
    for name in ("summary.json", "requests.csv"):
        assert (workdir / "a" / name).read_bytes() == (workdir / "b" / name).read_bytes()
    assert printed["scenario"]["k"] == 2


def test_k_beyond_the_measured_positions_warns_once_on_one_line(workdir, capsys):
    # sim_profile.yaml measured c05/rejection for 3 positions: k = 3 is silent, k = 5 is not.
    scenario = str(workdir / "s.yaml")
    assert main(["simulate", scenario, "--out", str(workdir / "k3")]) == 0
    assert "warning" not in capsys.readouterr().err
    assert (
        main(["simulate", scenario, "--out", str(workdir / "k5"), "--set", "speculation.k=5"]) == 0
    )
    err = capsys.readouterr().err
    assert err.count("specsim: warning:") == 1 and err.count("\n") == 1
    assert "k = 5 is beyond the 3 positions" in err and "'c05'" in err


def test_compare_baseline_adds_the_k0_run(workdir):
    out = workdir / "cmp"
    assert main(["simulate", str(workdir / "s.yaml"), "--out", str(out), "--compare-baseline"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["baseline"]["scenario"]["k"] == 0
    assert summary["baseline"]["requests"] == summary["requests"]
    speedup = summary["speedup_vs_baseline"]
    assert speedup["tpot_mean"] == pytest.approx(
        summary["baseline"]["tpot_s"]["mean"] / summary["tpot_s"]["mean"], rel=1e-3
    )
    assert speedup["tpot_mean"] > 1.5  # memory-bound fixture, alpha ~0.8, c = 0.05


def test_compare_baseline_states_every_metric_that_got_worse(workdir, capsys):
    """TTFT gets worse with speculation on this fixture (the drafter's prompt pass lengthens
    every prefill): the summary and the printed lines must say so, with the amounts."""
    out = workdir / "cmp"
    assert main(["simulate", str(workdir / "s.yaml"), "--out", str(out), "--compare-baseline"]) == 0
    printed = capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    base = summary["baseline"]
    assert "ttft_s.p99" in summary["compared_vs_baseline"]
    assert "throughput_tokens_per_s" in summary["compared_vs_baseline"]
    expected = {}
    for name in summary["compared_vs_baseline"]:
        key, _, stat = name.partition(".")
        value, baseline = (s[key][stat] if stat else s[key] for s in (summary, base))
        higher_is_better = key in ("throughput_tokens_per_s", "goodput_requests_per_s")
        worse_by = (baseline - value if higher_is_better else value - baseline) / baseline
        if worse_by >= 0.005:
            expected[name] = worse_by
    worse = {item["metric"]: item["worse_by"] for item in summary["regressions_vs_baseline"]}
    assert worse.keys() == expected.keys() and "ttft_s.mean" in worse
    # Both sides are the stored (6-significant-digit) figures; worse_by is rounded to 6 too.
    assert all(worse[m] == pytest.approx(expected[m], rel=1e-5) for m in worse)
    assert "TTFT" in printed.split("vs speculation off")[1].splitlines()[0]
    for item in summary["regressions_vs_baseline"]:
        assert f"{item['label']} {item['worse_by']:.0%} higher" in printed


def test_typical_verifier_warns_in_the_human_summary(workdir, capsys):
    args = ["simulate", str(workdir / "s.yaml"), "--out", str(workdir / "t")]
    assert main([*args, "--set", "speculation.verifier=typical"]) == 0
    assert "lossy" in capsys.readouterr().out


BAD_INPUTS = [
    (["--set", "workload.colour=red"], "workload.colour", "Extra inputs"),
    (["--set", "speculation.k=three"], "speculation.k", "integer"),
    (["--set", "workload.rate=-2"], "workload.rate", "greater than or equal to 0.000001"),
    (["--set", "workload.rate=0"], "workload.rate", "greater than or equal to 0.000001"),
    (["--set", "speculation.drafter=huge"], "sim_profile.yaml", "no drafter 'huge'"),
    (["--set", "speculation.temperature=0.5"], "sim_profile.yaml", "temperature 0.5"),
    (["--set", "speculation.verifier=greedy", "--set", "speculation.drafter=c20"],
     "sim_profile.yaml", "no 'greedy' acceptance"),
    (["--set", "slo={}"], "slo", "at least one of"),
    (["--set", "profile=missing.yaml"], "missing.yaml", "not found"),
    (["--set", "workload={kind: trace, trace: azure_bad_row.csv}"], "azure_bad_row.csv", "line 4"),
    (["--set", "fleet.replicas=2", "--set", "fleet.pools=[{name: a, replicas: 1}]"],
     "fleet", "pools hold 1"),
]  # fmt: skip


@pytest.mark.parametrize(("extra", "where", "what"), BAD_INPUTS)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(workdir, capsys, extra, where, what):
    out = workdir / "never"
    code = main(["simulate", str(workdir / "s.yaml"), "--out", str(out), *extra])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("specsim simulate: error: ")
    assert where in err and what in err
    assert "Traceback" not in err
    assert not out.exists() or not any(out.iterdir())
    assert not list(workdir.glob(".never*"))  # no staging folder left behind


def test_missing_scenario_file(workdir, capsys):
    assert main(["simulate", str(workdir / "nope.yaml"), "--out", str(workdir / "o")]) == 2
    assert "nope.yaml" in capsys.readouterr().err


def test_bundled_chat_scenario_runs(repo, tmp_path):
    out = tmp_path / "chat"
    assert main(["simulate", str(repo / "scenarios" / "chat.yaml"), "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["requests"] > 2000 and summary["scenario"]["workload"] == "trace"
