"""`specsim check sampler`: verdicts, JSON keys and exit codes."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specsim.cli import main
from specsim.sampling import checker, subjects

JSON_KEYS = {
    "verifier", "lossless", "closed_form_max_abs_error", "tv_distance", "p_value", "samples",
    "detectable_tv", "alpha", "seed", "power", "dof", "reference", "lossy_by_design",
    "judged_tokens", "window_tests", "exact_method", "exact_tolerance", "malformed",
}  # fmt: skip


def run_json(capsys, *args):
    code = main(["check", "sampler", *args, "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out)


def test_rejection_is_lossless_in_json(capsys):
    code, summary = run_json(capsys, "--verifier", "rejection", "--samples", "50000")
    assert code == 0
    assert set(summary) >= JSON_KEYS
    assert summary["lossless"] is True and summary["verifier"] == "rejection"
    assert summary["closed_form_max_abs_error"] <= 1e-12
    assert summary["samples"] == 50_000 and summary["seed"] == 0 and summary["alpha"] == 0.01
    assert 0 < summary["detectable_tv"] < 0.05
    assert summary["judged_tokens"] == 4 and [t["tokens"] for t in summary["window_tests"]] == [
        1, 2, 3, 4,
    ]  # fmt: skip


def test_typical_is_reported_lossy_with_exit_zero(capsys):
    code, summary = run_json(capsys, "--verifier", "typical", "--samples", "20000", "--seed", "3")
    assert code == 0
    assert summary["lossless"] is False and summary["lossy_by_design"] is True
    assert summary["tv_distance"] > 0.05 and summary["p_value"] < 0.01 and summary["seed"] == 3


def test_human_output_states_the_verdict_and_the_evidence(capsys):
    assert main(["check", "sampler", "--verifier", "typical", "--samples", "20000"]) == 0
    out = capsys.readouterr().out
    assert "verdict: LOSSY by design, TV distance" in out
    assert "closed form" in out and "p-value" in out and "99% power" in out
    # The power is stated per judged prefix of the window, with its cells.
    for j in (1, 2, 3, 4):
        assert "detects TV >= " in out and f"on tokens 1-{j} with 99% power" in out
    assert "judged: the whole window, tokens 1-4" in out
    assert main(["check", "sampler", "--samples", "0"]) == 0
    out = capsys.readouterr().out
    assert "verdict: LOSSLESS" in out and "skipped (--samples 0)" in out


def test_control_through_the_cli_is_flagged(capsys):
    code, summary = run_json(capsys, "--control", "raw-q", "--top-k", "5", "--samples", "100000")
    assert code == 0 and summary["verifier"] == "raw-q"
    assert summary["lossless"] is False and summary["p_value"] < 0.01


def test_an_exact_verifier_found_lossy_exits_1_with_fail_on_lossy(capsys, monkeypatch):
    # Planted regression: the "rejection" verifier behaves like the resample-p control. The
    # verdict is printed and the command exits 0 (a verdict was computed); with --fail-on-lossy
    # the exit code tells a CI job the check failed.
    from specsim.sampling import checker

    real = checker.check_sampler

    def regressed(verifier, **options):
        report = real("resample-p", **options)
        return dataclasses.replace(report, verifier=verifier, negative_control=False)

    monkeypatch.setattr(checker, "check_sampler", regressed)
    argv = ["check", "sampler", "--verifier", "rejection", "--samples", "0"]
    assert main(argv) == 0
    assert "verdict: LOSSY, TV distance" in capsys.readouterr().out
    assert main([*argv, "--fail-on-lossy"]) == 1
    assert "verdict: LOSSY, TV distance" in capsys.readouterr().out
    # Flagging a negative control is the expected verdict, not a regression.
    monkeypatch.undo()
    control = ["check", "sampler", "--control", "resample-p", "--samples", "0", "--fail-on-lossy"]
    assert main(control) == 0


def test_greedy_options_and_ragged(capsys):
    code, summary = run_json(
        capsys, "--verifier", "greedy", "--drafter", "greedy", "--ragged", "--vocab", "5",
        "--k", "4", "--temperature", "0.5", "--top-p", "0.9", "--samples", "10000",
    )  # fmt: skip
    assert code == 0 and summary["lossless"] is True
    assert summary["reference"] == "target greedy decoding"
    assert (summary["vocab"], summary["k"], summary["ragged"]) == (5, 4, True)


@pytest.mark.parametrize(
    "args, key",
    [
        (["--vocab", "17"], "--vocab"),
        (["--vocab", "16", "--k", "4"], "--vocab"),
        (["--verifier", "no_such_module_xyz:verify"], "--verifier"),
        (["--verifier", "specsim.sampling.verifiers:no_such_function"], "--verifier"),
        (["--verifier", "specsim.sampling.verifiers:TYPICAL_DELTA"], "--verifier"),
        (["--verifier", "nonsense"], "--verifier"),
        (["--inputs", "logits"], "--inputs"),
        (["--verifier", "rejection", "--lossy-by-design"], "--lossy-by-design"),
        (["--vocab", "1"], "--vocab"),
        (["--k", "5"], "--k"),
        (["--k", "0"], "--k"),
        (["--samples", "-1"], "--samples"),
        (["--top-p", "0"], "--top-p"),
        (["--top-p", "1.5"], "--top-p"),
        (["--top-k", "-1"], "--top-k"),
        (["--temperature", "-0.1"], "--temperature"),
        (["--temperature", "nan"], "--temperature"),
        (["--alpha", "1"], "--alpha"),
        (["--seed", "-1"], "--seed"),
        (["--problem-seed", "-3"], "--problem-seed"),
        (["--control", "raw-q"], "--control raw-q"),
        (["--control", "resample-p", "--verifier", "rejection"], "--control"),
    ],
)
def test_bad_input_exits_2_with_one_line(capsys, args, key):
    quick = [] if "--samples" in args else ["--samples", "0"]
    assert main(["check", "sampler", *args, *quick]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and key in err and "fix:" in err


def test_library_rejects_unknown_verifier_names():
    with pytest.raises(checker.SpecsimError):
        checker.check_sampler("nonsense")


def test_subprocess_exit_code_2_without_traceback():
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "specsim", "check", "sampler", "--vocab", "32"],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "--vocab" in proc.stderr
    assert proc.stdout == ""


def test_check_needs_a_sub_check():
    with pytest.raises(SystemExit) as info:
        main(["check"])
    assert info.value.code == 2


def test_cli_choices_match_the_sampling_registries():
    from specsim.cli import check
    from specsim.sampling.controls import CONTROLS

    assert set(check.VERIFIER_CHOICES) == set(subjects.VERIFIERS)
    assert set(check.CONTROL_CHOICES) == set(CONTROLS)
    assert (check.MAX_VOCAB, check.MAX_K) == (checker.MAX_VOCAB, checker.MAX_K)


HIDE_TORCH = """
import sys
class HideTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError("No module named 'torch'")
sys.meta_path.insert(0, HideTorch())
from specsim.cli import main
code = main(["check", "sampler", "--verifier", "rejection", "--json"])
assert "torch" not in sys.modules
raise SystemExit(code)
"""


def test_base_install_without_torch_still_gives_the_closed_form_verdict():
    # The README's main job installs specsim without torch and runs this command.
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", HIDE_TORCH], capture_output=True, text=True, env=env, check=False
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["lossless"] is True and summary["p_value"] is None
    assert summary["closed_form_max_abs_error"] <= 1e-12
    assert "torch is not installed" in summary["monte_carlo_note"]


def test_building_the_check_parser_does_not_import_scipy_or_torch():
    code = (
        "import argparse, sys; from specsim.cli import check; "
        "check.add_arguments(argparse.ArgumentParser()); "
        "print(sorted(m for m in ('numpy', 'scipy', 'torch') if m in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "[]"


def test_typical_at_temperature_zero_is_lossless_here_but_still_called_lossy_in_general(capsys):
    assert main(["check", "sampler", "--verifier", "typical", "--temperature", "0"]) == 0
    out = capsys.readouterr().out
    assert "LOSSLESS on this problem" in out and "lossy in general" in out


def test_a_control_that_coincides_with_the_exact_verifier_says_so(capsys):
    # One position: a shared uniform is the same as one uniform per position.
    assert main(["check", "sampler", "--control", "shared-uniform", "--k", "1"]) == 0
    out = capsys.readouterr().out
    assert "LOSSLESS on this problem" in out and "coincides with the exact verifier" in out


def test_same_seed_gives_byte_identical_json(capsys):
    args = ["check", "sampler", "--ragged", "--top-k", "5", "--samples", "20000", "--json"]
    outputs = []
    for _ in range(2):
        assert main(args) == 0
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1]


def test_out_writes_the_report_atomically(tmp_path, capsys):
    out = tmp_path / "check"
    assert main(["check", "sampler", "--samples", "2000", "--out", str(out), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert json.loads((out / "sampler_check.json").read_text()) == printed
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    assert main(["check", "sampler", "--samples", "0", "--out", str(blocker)]) == 2
    assert "not a folder" in capsys.readouterr().err


THIRD_PARTY_FILE = Path(__file__).parent / "data" / "third_party_verifier.py"
THIRD_PARTY = THIRD_PARTY_FILE.read_text(encoding="utf-8")
EXACT_RESIDUAL = "residual = (p[rows, at] - q[rows, at]).clamp(min=0)"


def write_third_party(folder, name, q_scale=""):
    """The shipped example sampler, or with ``q_scale`` (e.g. "0.5 * ") a mis-computed
    residual, norm(max(0, p - 0.5 q))."""
    assert EXACT_RESIDUAL in THIRD_PARTY
    text = THIRD_PARTY.replace(EXACT_RESIDUAL, EXACT_RESIDUAL.replace("- q", f"- {q_scale}q"))
    path = folder / f"{name}.py"
    path.write_text(text, encoding="utf-8")
    return path


def test_the_readme_example_verifier_is_exact(capsys, monkeypatch, repo):
    # The command of docs/guide/check-verifier.md, at vocab 6 to keep it quick (N = 20000, seed 0).
    monkeypatch.chdir(repo)
    code, summary = run_json(
        capsys, "--verifier", "tests/data/third_party_verifier.py:verify", "--vocab", "6",
        "--samples", "20000", "--fail-on-lossy",
    )  # fmt: skip
    assert code == 0 and summary["lossless"] and summary["exact_method"] == "enumeration"


def test_a_module_function_verifier_is_judged_exactly_from_the_cli(tmp_path, capsys, monkeypatch):
    # A third-party function named as module:function (importable from the working folder)
    # and as file.py:function: exact enumeration plus Monte Carlo (N = 50000, seed 0).
    write_third_party(tmp_path, "their_sampler")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    code, summary = run_json(
        capsys, "--verifier", "their_sampler:verify", "--samples", "50000", "--vocab", "6"
    )
    assert code == 0 and summary["lossless"] is True, summary
    assert summary["exact_method"] == "enumeration" and summary["enumeration_cases"] == 6**3
    assert summary["closed_form_max_abs_error"] <= summary["exact_tolerance"] < 1e-4
    buggy = write_third_party(tmp_path, "their_buggy", q_scale="0.5 * ")
    argv = ["check", "sampler", "--verifier", f"{buggy}:verify", "--samples", "20000"]
    assert main([*argv, "--vocab", "6"]) == 0
    out = capsys.readouterr().out
    assert "verdict: LOSSY" in out and "exact (enumeration: one step from the prompt" in out
    assert main([*argv, "--vocab", "6", "--fail-on-lossy"]) == 1
    capsys.readouterr()
    # Meant to be lossy: reported, not a failure.
    assert main([*argv, "--vocab", "6", "--fail-on-lossy", "--lossy-by-design"]) == 0


def test_a_malformed_third_party_output_is_a_verdict_not_a_traceback(tmp_path, capsys):
    broken = write_third_party(tmp_path, "broken")
    text = broken.read_text().replace("return accepted, tokens", "return accepted + 1, tokens")
    broken.write_text(text)
    argv = ["check", "sampler", "--verifier", f"{broken}:verify", "--vocab", "4", "--k", "2"]
    assert main([*argv, "--samples", "1000"]) == 0
    out = capsys.readouterr().out
    assert "NOT EXACT: the verifier's output breaks its contract" in out
    assert "accepted counts outside [0, n_drafts]" in out and "drafts [" in out
    assert main([*argv, "--samples", "1000", "--fail-on-lossy"]) == 1
