"""Whole runs (``specsim check rollout --verifier/--step/--control``): bugs that pass every
one-step check are flagged over sequences, and the exact implementations pass.

Every run here: 50,000 sequences of 6 tokens, vocab 4, seed 0 unless stated; the prefix tests
(tokens 1-j, j = 1..6, each at level 0.01 / 6) detect TV >= 0.013 on the first token and >= 0.032
on all six with 99% power (``stats.detectable_tv`` of the target's exact distribution).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specsim.cli import main
from specsim.cli.check_rollout import SEQUENCE_CONTROLS as CLI_CONTROLS
from specsim.sampling.sequences import SEQUENCE_CONTROLS, check_sequences

DATA = Path(__file__).parent / "data"
SEQUOIA = DATA / "sequoia_tree_verifier.py"
STEP = DATA / "kv_cache_step.py"
RUNS = 50_000


@pytest.mark.parametrize("control", sorted(SEQUENCE_CONTROLS))
def test_each_planted_bug_is_flagged_and_the_exact_step_passes(control):
    report = check_sequences(control=control, samples=RUNS)
    assert report.malformed is None
    assert report.lossless == (control == "exact-step")
    assert report.window_tests[-1]["detectable_tv"] < 0.04


@pytest.mark.parametrize("control", ["reused-uniforms", "kept-rejected-entry"])
def test_the_cross_step_bugs_leave_the_first_token_right(control):
    """Token 1 always comes from the first step, which these bugs do not touch: only the later
    tokens, emitted by later steps, depart from the target."""
    report = check_sequences(control=control, samples=RUNS)
    first, whole = report.window_tests[0], report.window_tests[-1]
    assert first["p_value"] >= 0.01 / 6 and whole["p_value"] < 1e-6


@pytest.mark.parametrize(
    "verifier, tree, drafts",
    [("rejection", None, "iid"), ("rejection", "2,1", "without-replacement")],
)
def test_built_in_exact_verifiers_pass_over_whole_runs(verifier, tree, drafts):
    report = check_sequences(verifier, tree=tree, drafts=drafts, samples=RUNS, seed=1)
    assert report.lossless


def test_typical_acceptance_is_flagged_over_whole_runs():
    assert not check_sequences("typical", samples=RUNS).lossless


def test_sequoia_spectree_is_exact_per_step_but_its_uniforms_drawn_once_are_not():
    """SpecTree draws its accept uniforms once per generation and reads them at every step;
    with fresh uniforms its step is exact (``test_tree_checker_plugin``), and so are its runs."""
    kwargs = dict(tree="2,1", drafts="without-replacement", samples=RUNS)
    assert check_sequences(f"{SEQUOIA}:verify", **kwargs).lossless
    assert not check_sequences(f"{SEQUOIA}:verify_uniforms_drawn_once", **kwargs).lossless


def test_your_step_function_with_its_cache(capsys, tmp_path):
    argv = ["check", "rollout", "--step", f"{STEP}:step", "--samples", str(RUNS)]
    assert main([*argv, "--json", "--out", str(tmp_path / "out")]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["lossless"] and summary["kind"] == "step"
    assert json.loads((tmp_path / "out" / "rollout.json").read_text())["lossless"]
    bad = ["check", "rollout", "--step", f"{STEP}:step_without_rollback", "--samples", str(RUNS)]
    assert main([*bad, "--fail-on-shift"]) == 1
    assert "LOSSY over whole runs" in capsys.readouterr().out


def test_a_step_that_breaks_the_contract_is_a_verdict():
    def broken(target, drafter, cache, last, randomness):
        return last, last  # tokens of the wrong shape

    report = check_sequences(step=broken, samples=100)
    assert not report.lossless and "tokens" in report.malformed["reason"]


@pytest.mark.parametrize(
    "args, key",
    [
        (["--step", f"{STEP}:step", "--tree", "2,1"], "--tree"),
        (["--step", f"{STEP}:step", "--verifier", "rejection"], "--step"),
        (["--verifier", "rejection", "--baseline", "runs/a"], "--baseline"),
        (["--verifier", "rejection", "--vocab", "16", "--tokens", "6"], "--tokens"),
        (["--verifier", "nowhere.py:verify"], "--verifier"),
    ],
)
def test_bad_input_exits_2_with_one_line(capsys, args, key):
    assert main(["check", "rollout", *args, "--samples", "10"]) == 2
    err = capsys.readouterr().err
    assert key in err and len(err.strip().splitlines()) == 1


def test_cli_controls_match_the_registry():
    assert set(CLI_CONTROLS) == set(SEQUENCE_CONTROLS)
