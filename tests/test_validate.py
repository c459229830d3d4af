"""specsim validate: the comparison rules, the output folder, exit codes and bad input."""

from __future__ import annotations

import io
import json
import sys

import pytest
import yaml
from test_engine_common import drafter_map, hand_profile, model_spec, prompts_path

from specsim.cli import main
from specsim.validation.compare import (
    THRESHOLDS,
    compare_prediction,
    comparison_table,
    explain_failures,
    metric_names,
)


def summary(scale: float = 1.0, acceptance: float = 2.0, throughput: float = 100.0) -> dict:
    lat = {"mean": 1.0 * scale, "p50": 0.9 * scale, "p90": 1.5 * scale, "p99": 2.0 * scale}
    return {
        "ttft_s": lat,
        "tpot_s": lat,
        "e2e_s": lat,
        "throughput_tokens_per_s": throughput,
        "mean_acceptance_length": acceptance,
    }


def test_relative_error_sign_and_thresholds():
    same = compare_prediction(summary(), summary())
    assert same.passed and all(r.relative_error == 0 for r in same.rows)
    assert len(same.rows) == len(metric_names()) == 14
    slower = compare_prediction(summary(scale=1.08), summary())  # 8 % more latency predicted
    e2e = next(r for r in slower.rows if r.metric == "e2e_s.mean")
    assert e2e.relative_error == pytest.approx(0.08)
    assert not e2e.ok  # 8 % > 5 %
    p90 = next(r for r in slower.rows if r.metric == "e2e_s.p90")
    assert p90.ok  # 8 % < 10 %
    assert [r.metric for r in slower.failures] == ["e2e_s.mean"]
    accept = compare_prediction(summary(acceptance=2.07), summary(acceptance=2.0))
    assert [r.metric for r in accept.failures] == ["mean_acceptance_length"]  # 3.5 % > 3 %
    assert "EXCEEDED" in comparison_table(accept)
    assert set(THRESHOLDS) <= set(metric_names())


def test_replicas_give_each_metric_a_band_and_failures_say_where_they_fall():
    # The simulator's own spread: ten replicas at 0.90x .. 1.35x the measured latencies.
    replicas = [summary(scale=0.90 + 0.05 * i) for i in range(10)]
    result = compare_prediction(summary(scale=0.88), summary(), replicas)
    e2e = next(r for r in result.rows if r.metric == "e2e_s.mean")
    # Over the first draw and its replicas (0.88, 0.90 .. 1.35): 10th and 90th percentiles,
    # and the prediction is their median, not the first draw alone.
    assert e2e.band == pytest.approx((0.90, 1.30))
    assert e2e.predicted == pytest.approx(1.10) and e2e.first_draw == pytest.approx(0.88)
    assert e2e.relative_error == pytest.approx(0.10)
    assert not e2e.ok and e2e.in_band  # a 10 % miss, inside the workload's spread
    lines = explain_failures(result)
    assert len(lines) == len(result.failures)
    assert all("inside" in line and "11 replications" in line for line in lines)
    # The measured value (1.0) lies above 0.88, 0.90 and 0.95 of the eleven draws.
    assert (e2e.draws_below, e2e.draws) == (3, 11)
    assert all("above 3 of the 11 draws" in line for line in lines)
    assert "sim p10..p90" in comparison_table(result)
    far = compare_prediction(summary(scale=0.5), summary(), [summary(scale=0.5)] * 3)
    assert all(not r.in_band for r in far.failures)
    assert all("outside" in line for line in explain_failures(far))
    assert all("above all 4 draws" in line for line in explain_failures(far))
    low = compare_prediction(summary(scale=2.0), summary(), [summary(scale=2.0)] * 3)
    assert all("below all 4 draws" in line for line in explain_failures(low))
    # Without replicas: no band, no explanation, the table as before.
    plain = compare_prediction(summary(scale=0.88), summary())
    assert all(r.band is None and r.in_band is None for r in plain.rows)
    assert all(r.predicted == r.first_draw for r in plain.rows)
    assert all(r.draws is None for r in plain.rows)
    assert explain_failures(plain) == [] and "sim p10" not in comparison_table(plain)


def test_a_replication_serves_the_same_requests_with_other_draws(tmp_path):
    from specsim.scenario import load_scenario
    from specsim.simulation import run_simulation
    from specsim.simulation.records import read_records

    hand_profile(tmp_path / "p.yaml")
    data = yaml.safe_load(write_scenario(tmp_path).read_text())
    data["profile"] = "p.yaml"
    data["workload"] = {
        "kind": "poisson",
        "rate": 20.0,
        "requests": 40,
        "prompt": {"dist": "uniform", "low": 8, "high": 40},
        "output": {"dist": "uniform", "low": 4, "high": 30},
    }
    (tmp_path / "scenario.yaml").write_text(yaml.safe_dump(data))
    scenario = load_scenario(tmp_path / "scenario.yaml")
    runs = {}
    for replication in (0, 0, 1, 2):
        path = tmp_path / f"r{replication}.csv"
        run_simulation(scenario, path, replication=replication)
        records = read_records(path)
        order = records["id"].argsort()  # written as requests finish
        runs.setdefault(replication, []).append({c: v[order] for c, v in records.items()})
    base, again = runs[0]
    assert all((base[c] == again[c]).all() for c in ("arrival_s", "first_token_s", "accepted"))
    for replication in (1, 2):
        other = runs[replication][0]
        for column in ("arrival_s", "prompt_tokens", "output_tokens"):
            assert (other[column] == base[column]).all(), column  # the same requests
        assert not (other["accepted"] == base["accepted"]).all()  # other acceptance draws
    assert not (runs[1][0]["accepted"] == runs[2][0]["accepted"]).all()


def write_scenario(tmp_path, **engine):
    data = {
        "name": "validate-test",
        "seed": 3,
        "profile": "unused.yaml",
        "workload": {
            "kind": "closed_loop",
            "concurrency": 2,
            "requests": 6,
            "prompt": {"dist": "fixed", "value": 24},
            "output": {"dist": "fixed", "value": 12},
        },
        "engine": {"max_batch": 2, "chunked_prefill": False, **engine},
        "speculation": {"drafter": "small", "k": 2},
    }
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def validate_argv(scenario, profile, out) -> list[str]:
    drafters = [f"--drafter={name}={spec}" for name, spec in drafter_map().items()]
    return [
        "validate",
        str(scenario),
        "--profile",
        str(profile),
        "--out",
        str(out),
        "--target",
        model_spec("specsim-target"),
        "--prompts",
        prompts_path(),
        *drafters,
        "--json",
    ]


class Terminal(io.StringIO):
    """A stderr that says it is a terminal, so tqdm draws its bars into it."""

    def isatty(self) -> bool:
        return True


def _with_held_out_errors(path, **median_by_model):
    """The profile at ``path`` with these median held-out errors on its models' fits."""
    data = yaml.safe_load(path.read_text())
    for name, median in median_by_model.items():
        model = data["target"] if name == "target" else data["drafters"][name]
        model["latency"]["fit"]["held_out"] = {
            "method": "leave-one-out relative error",
            "points": 40,
            "median_rel_error": median,
            "max_rel_error": 2 * median,
        }
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.slow
def test_validate_writes_everything_and_exit_code_follows_the_verdict(
    tmp_path, capsys, monkeypatch
):
    scenario = write_scenario(tmp_path)
    out = tmp_path / "out"
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    profile = _with_held_out_errors(hand_profile(tmp_path / "p.yaml"), target=0.26, small=0.04)
    argv = validate_argv(scenario, profile, out)
    code = main([a for a in argv if a != "--json"])
    result = json.loads((out / "comparison.json").read_text())
    assert code == (0 if result["passed"] else 1)
    # The long phases show their progress on a terminal: every request, every replication.
    bars = terminal.getvalue()
    assert "engine run: 100%" in bars and "6/6" in bars
    assert "simulations: 100%" in bars and "19/19" in bars
    printed = capsys.readouterr().out
    assert "mean ms" in printed  # the human report, iteration table included
    # A target fit that misses its held-out points by 26 % (median) is flagged, the drafter's
    # 4 % is not: in comparison.json, on stderr as the run starts, and in the report.
    fit = result["profile_fit"]
    assert fit["flagged"] == ["target"] and fit["limit_median_rel_error"] == 0.10
    assert fit["models"]["small"]["exceeds"] is False
    warning = "target latency fit misses its own held-out grid points by 26%"
    assert warning in bars and warning in printed
    assert warning in (out / "comparison.md").read_text()
    for name in ("comparison.json", "comparison.md", "validation.png", "validation.csv"):
        assert (out / name).is_file()
    for part in ("engine", "simulation"):
        assert (out / part / "requests.csv").is_file()
        assert json.loads((out / part / "summary.json").read_text())["requests"] == 6
    assert (out / "validation.png").read_bytes()[:4] == b"\x89PNG"
    saved = result
    assert saved["iteration_residuals"] and saved["rows"]
    kinds = {r["kind"] for r in saved["iteration_residuals"]}
    assert kinds == {"prefill", "decode"}


def test_a_wrong_profile_fails_validation_with_exit_1(tmp_path, capsys, monkeypatch):
    scenario = write_scenario(tmp_path)
    slow = hand_profile(tmp_path / "slow.yaml", slow=50.0)  # predicts 50x the real pass times
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    code = main(validate_argv(scenario, slow, tmp_path / "out"))
    assert terminal.getvalue() == ""  # --json: no progress bars, even on a terminal
    result = json.loads(capsys.readouterr().out)
    assert code == 1 and not result["passed"]
    failed = {r["metric"] for r in result["rows"] if r["ok"] is False}
    assert {"e2e_s.mean", "throughput_tokens_per_s"} <= failed


def test_bad_input_exits_2_with_one_line_and_writes_nothing(tmp_path, capsys):
    profile = hand_profile(tmp_path / "p.yaml")
    out = tmp_path / "out"
    chunked = write_scenario(tmp_path, chunked_prefill=True)
    assert main(validate_argv(chunked, profile, out)) == 2
    err = capsys.readouterr().err.strip()
    assert "engine.chunked_prefill" in err and len(err.splitlines()) == 1
    assert main(validate_argv(write_scenario(tmp_path), tmp_path / "none.yaml", out)) == 2
    assert "profile not found" in capsys.readouterr().err
    # A device this machine lacks fails before any model loads (not deep in the engine).
    assert main([*validate_argv(write_scenario(tmp_path), profile, out), "--device", "tpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert "unknown device 'tpu'" in err and len(err.splitlines()) == 1
    assert not out.exists()


def test_iteration_residuals_ask_the_cost_model_for_each_pass(tmp_path):
    from specsim.engine.engine import IterationLog
    from specsim.profile import load_profile
    from specsim.validation.residuals import iteration_residuals, residual_table

    profile = load_profile(hand_profile(tmp_path / "p.yaml"))
    log = IterationLog(
        dt=[0.05, 0.02, 0.03],
        batch=[2, 2, 2],
        kind=["prefill", "decode", "decode"],
        window=[0, 2, 2],
        new_tokens=[48, 6, 6],
        context=[0, 50, 56],
        pairs=[600.0, 320.0, 356.0],
    )
    rows = iteration_residuals(log, profile, "small")
    assert [(r["kind"], r["iterations"]) for r in rows] == [("decode", 2), ("prefill", 1)]
    # decode: target 0.01 + 6e-4, drafter 2 x (0.001 + 2e-5), overhead 1e-4 (all in seconds)
    decode = 0.01 + 6e-4 + 2 * (0.001 + 2e-5) + 1e-4
    # Without a spread in the profile the simulator charges the cost itself: mean = median.
    assert rows[0]["predicted_mean_ms"] == pytest.approx(decode * 1e3)
    assert rows[0]["predicted_median_ms"] == pytest.approx(decode * 1e3)
    assert rows[0]["measured_mean_ms"] == pytest.approx(25.0)
    assert rows[0]["ratio"] == pytest.approx(0.025 / decode)
    assert rows[0]["measured_p10_ms"] == pytest.approx(21.0)  # 20 and 30 ms, interpolated
    assert rows[0]["measured_p90_ms"] == pytest.approx(29.0)
    assert "21.0..29.0" in residual_table(rows)
    prefill = 0.01 + 48e-4 + 0.001 + 48e-5 + 1e-4
    assert rows[1]["predicted_mean_ms"] == pytest.approx(prefill * 1e3)


def test_iteration_table_sets_mean_against_mean_and_median_against_median(tmp_path):
    """With a skewed iteration-time spread in the profile the simulator's mean iteration is the
    cost times the spread's mean (here 1.125) and its median the cost times its median (1.0):
    the table must set each measured statistic against the same statistic predicted."""
    from specsim.costs import PassTotals, StepCosts
    from specsim.engine.engine import IterationLog
    from specsim.profile import load_profile
    from specsim.validation.residuals import iteration_residuals, residual_table

    path = hand_profile(tmp_path / "p.yaml")
    data = yaml.safe_load(path.read_text())
    data["jitter"] = {"quantiles": [0.5, 0.8, 1.0, 1.2, 2.5], "samples": 100}
    path.write_text(yaml.safe_dump(data))
    profile = load_profile(path)
    cost = StepCosts(profile, "small").iteration_s(2, PassTotals(2, 6, 50, 320.0))
    dt = [cost * f for f in (0.7, 1.0, 1.0, 2.9)]  # measured: median 1.0 x, mean 1.4 x
    shape = dict(batch=[2] * 4, kind=["decode"] * 4, window=[2] * 4, new_tokens=[6] * 4)
    log = IterationLog(dt=dt, context=[50] * 4, pairs=[320.0] * 4, **shape)
    (row,) = iteration_residuals(log, profile, "small")
    # Linear pieces sampled at midpoints: the mean is the trapezoid area, 0.25 x 4.5.
    assert row["predicted_mean_ms"] == pytest.approx(cost * 1.125 * 1e3)
    assert row["predicted_median_ms"] == pytest.approx(cost * 1.0 * 1e3, rel=1e-2)
    assert row["measured_median_ms"] == pytest.approx(cost * 1.0 * 1e3)
    assert row["measured_mean_ms"] == pytest.approx(cost * 1.4 * 1e3)
    assert row["ratio"] == pytest.approx(1.4 / 1.125)
    header = residual_table([row]).splitlines()[:2]
    assert "mean ms" in header[0] and "median ms" in header[0]
    # The engine config turns the simulator's spread off: both predictions are the cost.
    (off,) = iteration_residuals(log, profile, "small", jitter=False)
    assert off["predicted_mean_ms"] == pytest.approx(off["predicted_median_ms"])


def test_iteration_residuals_split_each_group_into_its_parts(tmp_path):
    from specsim.costs import PassTotals, StepCosts
    from specsim.engine.engine import IterationLog
    from specsim.profile import load_profile
    from specsim.validation.residuals import iteration_residuals, split_table

    profile = load_profile(hand_profile(tmp_path / "p.yaml"))
    shape = dict(batch=[2, 2], kind=["decode"] * 2, window=[2, 2], new_tokens=[6, 6])
    shape.update(context=[50, 50], pairs=[320.0, 320.0])
    log = IterationLog(dt=[0.02, 0.03], target_s=[0.012, 0.014], drafter_s=[0.004, 0.006], **shape)
    (row,) = iteration_residuals(log, profile, "small")
    parts = StepCosts(profile, "small").iteration_parts(2, PassTotals(2, 6, 50, 320.0))
    target, host = parts.target, parts.host
    assert sum(parts) == pytest.approx(row["predicted_mean_ms"] / 1e3)
    assert row["parts"]["target"] == pytest.approx(
        {"measured_mean_ms": 13.0, "predicted_mean_ms": target * 1e3}
    )
    assert row["parts"]["drafter"]["measured_mean_ms"] == pytest.approx(5.0)
    # The engine's own work: the rest of each iteration (4 and 10 ms).
    assert row["parts"]["host"] == pytest.approx(
        {"measured_mean_ms": 7.0, "predicted_mean_ms": host * 1e3}
    )
    assert "13.00 / " in split_table([row])
    # Without the split (a wall-clock run) the groups have no parts and there is no table.
    (plain,) = iteration_residuals(IterationLog(dt=[0.02, 0.03], **shape), profile, "small")
    assert "parts" not in plain and split_table([plain]) == ""


def test_iteration_residuals_charge_the_per_draft_overhead(tmp_path):
    """Decode at k = 2 over 2 rows pays 2 x (per draft pass + 2 x per drafting sequence) more;
    a prefill pays none of it."""
    from specsim.engine.engine import IterationLog
    from specsim.profile import load_profile
    from specsim.validation.residuals import iteration_residuals

    path = hand_profile(tmp_path / "p.yaml")
    data = yaml.safe_load(path.read_text())
    data["overhead"].update(per_draft_step_s=3e-4, per_draft_token_s=5e-5)
    path.write_text(yaml.safe_dump(data))
    log = IterationLog(
        dt=[0.05, 0.02],
        batch=[2, 2],
        kind=["prefill", "decode"],
        window=[0, 2],
        new_tokens=[48, 6],
        context=[0, 50],
        pairs=[600.0, 320.0],
    )
    decode, prefill = iteration_residuals(log, load_profile(path), "small")
    charged = 0.01 + 6e-4 + 2 * (0.001 + 2e-5) + 1e-4 + 2 * (3e-4 + 2 * 5e-5)
    assert decode["predicted_mean_ms"] == pytest.approx(charged * 1e3)
    assert prefill["predicted_mean_ms"] == pytest.approx(
        (0.01 + 48e-4 + 0.001 + 48e-5 + 1e-4) * 1e3
    )


def test_read_records_parses_the_engines_float_columns(tmp_path):
    from specsim.simulation.records import read_records

    path = tmp_path / "requests.csv"
    path.write_text(
        "id,arrival_s,output_tokens,target_logprob_mean,pool\n"
        "0,0.5,12,-1.49564636,main\n"
        "1,0.75,7,-2,main\n"
    )
    records = read_records(path)
    assert records["id"].dtype.kind == "i" and records["output_tokens"].tolist() == [12, 7]
    assert records["target_logprob_mean"].dtype.kind == "f"
    assert records["target_logprob_mean"].tolist() == [-1.49564636, -2.0]
    assert records["pool"].tolist() == ["main", "main"]


def test_a_run_far_from_the_reference_speed_is_flagged():
    from specsim.engine.speed_reference import steady
    from specsim.validation.validate import _speed

    drift = {
        "reference_pass_s": 2e-3,
        "reference_prefill_s": 8e-3,
        "probes": 30,
        "slowdown_median": 1.02,
        "slowdown_p10": 0.95,
        "slowdown_p90": 1.3,
        "prefill_slowdown_median": 0.97,
        "prefill_slowdown_p10": 0.9,
        "prefill_slowdown_p90": 1.1,
        "reference_host_s": 4e-4,
        "host_slowdown_median": 1.05,
        "host_slowdown_p10": 0.98,
        "host_slowdown_p90": 1.2,
        "models": {
            "small": {
                "decode_s": 8e-4,
                "prefill_s": 1.6e-3,
                "slowdown_median": 0.95,
                "prefill_slowdown_median": 1.0,
            }
        },
    }
    assert steady(drift)
    assert not steady({**drift, "slowdown_median": 1.17})
    assert not steady({**drift, "prefill_slowdown_median": 0.85})
    assert not steady({**drift, "host_slowdown_median": 1.2})
    drafter_slow = {"small": {**drift["models"]["small"], "slowdown_median": 1.3}}
    assert not steady({**drift, "models": drafter_slow})
    speed = {
        "reference_pass": "target decode",
        "measured_before_s": 2e-3,
        "measured_after_s": 2e-3,
        "profile_predicts_s": 2e-3,
        "ratio_before": 1.0,
        "ratio_after": 1.0,
        "reference_clock": drift,
    }
    assert "warning" not in _speed({**speed, "steady": True})
    assert "x1.05 for the engine's own work (0.40 ms" in _speed(speed)
    assert "drafter small, its own probes: x0.95 for a decode (0.80 ms)" in _speed(speed)
    assert "warning: the machine ran more than 10 %" in _speed({**speed, "steady": False})
