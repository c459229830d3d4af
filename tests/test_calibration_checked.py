"""profile from-bench --check-runs and --runs-source: runs the fit never sees, predicted on the
fitted profile, their error per figure in the report, the provenance and the quality gate.

The runs come from ``bench_runs`` (the calibration prior with known terms, simulated by
specsim): the check is ``validate --bench``'s prediction, so a check run of the truth itself is
predicted as closely as the fit reproduces its own runs.
"""

from __future__ import annotations

import json
import math

import pytest
from bench_runs import PRIOR, Case, write_runs

from specsim.cli import main
from specsim.profile import load_profile

CASES = [Case("fit-r2", 2.0), Case("fit-c8", math.inf, 8), Case("check-r6", 6.0)]
SOURCE = "vllm 0.33 on test-gpu, test/target-8b: simulated by specsim, published never"


def test_check_runs_are_predicted_on_the_fit_and_stated_per_figure(tmp_path, capsys):
    fit_a, fit_b, check = write_runs(tmp_path / "runs", CASES, requests=40, seed=2)
    out = tmp_path / "fitted.yaml"
    argv = ["profile", "from-bench", fit_a, fit_b, "--into", str(PRIOR), "--out", str(out)]
    argv += ["--check-runs", check, "--runs-source", SOURCE, "--no-held-out", "--json"]
    assert main(argv) == 0, capsys.readouterr().err
    report = json.loads(capsys.readouterr().out)
    checked = report["checked"]
    assert checked["runs"] == ["check-r6"] and len(report["runs"]) == 2
    figures = checked["figures"]
    assert {"throughput_tokens_per_s", "tpot_s.mean", "ttft_s.mean", "e2e_s.mean"} <= set(figures)
    errors = checked["errors"]["check-r6"]
    for name, figure in figures.items():
        assert figure["runs"] == 1
        assert figure["median_abs_error"] == figure["max_abs_error"] == abs(errors[name])
    # The truth's own run, predicted on terms fitted from two others: within a few per cent.
    assert figures["tpot_s.mean"]["median_abs_error"] < 0.03
    assert figures["throughput_tokens_per_s"]["median_abs_error"] < 0.03
    # The gate judges the check runs: the median |error| over all their figures.
    gate = report["gate"]
    every = sorted(abs(e) for e in errors.values())
    assert gate["basis"] == "checked" and gate["passed"]
    middle = len(every) // 2
    expected = every[middle] if len(every) % 2 else (every[middle - 1] + every[middle]) / 2
    assert math.isclose(gate["median_abs_error"], expected)
    calibration = load_profile(out).profile.provenance.calibration
    assert calibration.runs_source == SOURCE
    assert calibration.checked.runs == ["check-r6"]
    assert calibration.checked.files[0].path == check and calibration.checked.files[0].runs == 1
    assert calibration.checked.figures["tpot_s.mean"].max_abs_error == pytest.approx(
        figures["tpot_s.mean"]["max_abs_error"], rel=1e-5
    )
    notes = load_profile(out).profile.provenance.notes
    assert "Predicted on 1 run(s) the fit never saw (check-r6)" in notes
    # Without --check-runs nothing is stated, and the gate judges the fit's own error.
    plain = tmp_path / "plain.yaml"
    assert main([*argv[:6], "--out", str(plain), "--no-held-out", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["checked"] is None and report["gate"]["basis"] == "fit"
    assert load_profile(plain).profile.provenance.calibration.checked is None


def test_a_speculative_check_run_against_a_plain_fit_is_a_one_line_refusal(tmp_path, capsys):
    fit, check = write_runs(
        tmp_path / "runs", [Case("fit-r2", 2.0), Case("k2-r4", 4.0, k=2)], requests=20, seed=4
    )
    out = tmp_path / "fitted.yaml"
    argv = ["profile", "from-bench", fit, "--into", str(PRIOR), "--out", str(out)]
    assert main([*argv, "--check-runs", check, "--no-held-out"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--check-runs" in err[0] and "fix:" in err[0]
    assert not out.exists()
