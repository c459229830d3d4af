"""The rollout check: two-sample tests on engine runs' quality signals, and its command line.

Synthetic runs (numpy seed stated per test) with n = 200 requests per side: log-likelihoods
N(-1.2, 0.3) nats, lengths from a lognormal, EOS for about half of the requests. At overall
alpha = 0.01 the Mann-Whitney test detects a mean shift of ``detectable_shift`` (about 0.1 nats,
reported) with 80 % power; the planted shifts (0.2 nats, lengths x 1.3) are at least twice that.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from specsim.cli import main
from specsim.engine.records import format_csv
from specsim.errors import SpecsimError
from specsim.validation.rollout import check_rollout, load_rollout_records

N = 200


def fake_run(rng: np.random.Generator, n: int = N, logprob_shift=0.0, length_scale=1.0):
    lengths = np.maximum(1, np.rint(length_scale * rng.lognormal(4.0, 0.5, n))).astype(np.int64)
    arrival = np.sort(rng.uniform(0, 10, n))
    return {
        "id": np.arange(n),
        "arrival_s": arrival,
        "scheduled_s": arrival,
        "first_token_s": arrival + 0.05,
        "finish_s": arrival + 0.05 + 0.01 * lengths,
        "prompt_tokens": np.full(n, 64),
        "output_tokens": lengths,
        "steps": lengths // 2,
        "drafted": lengths,
        "accepted": lengths // 2,
        "preemptions": np.zeros(n, dtype=np.int64),
        "replica": np.zeros(n, dtype=np.int64),
        "pool": np.asarray(["main"] * n),
        "target_logprob_mean": rng.normal(-1.2 + logprob_shift, 0.3, n),
        "eos": (rng.uniform(size=n) < 0.5).astype(np.int64),
    }


def write(folder, records):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "requests.csv").write_text(format_csv(records), encoding="utf-8")
    return folder


def test_same_distribution_is_not_flagged_and_states_detectable_shift():
    rng = np.random.default_rng(1)
    check = check_rollout(fake_run(rng), fake_run(rng))
    assert check.verdict == "no shift detected"
    mw = next(t for t in check.tests if t.signal == "target_logprob_mean")
    assert 0.05 < mw.detectable_shift < 0.15
    assert check.alpha_per_test == pytest.approx(0.01 / 5)  # 2 signals x 2 tests + EOS share


def test_false_alarm_rate_stays_below_alpha():
    # 200 repetitions at alpha 0.1: false alarms ~ Binomial(200, <= 0.1); 35 is > 3 SD above 20.
    rng = np.random.default_rng(2)
    alarms = sum(
        check_rollout(fake_run(rng, 60), fake_run(rng, 60), alpha=0.1).shifted for _ in range(200)
    )
    assert alarms <= 35


def test_loglikelihood_shift_is_flagged():
    rng = np.random.default_rng(3)
    check = check_rollout(fake_run(rng), fake_run(rng, logprob_shift=-0.2))
    assert check.shifted
    flagged = {t.signal for t in check.tests if t.shifted}
    assert flagged == {"target_logprob_mean"}
    mw = next(t for t in check.tests if t.test == "mann-whitney")
    lo, hi = mw.difference_ci95
    assert lo < -0.2 < hi


def test_length_shift_is_flagged():
    rng = np.random.default_rng(4)
    check = check_rollout(fake_run(rng), fake_run(rng, length_scale=1.3))
    assert {t.signal for t in check.tests if t.shifted} == {"output_tokens"}


def test_constant_lengths_are_not_tested():
    rng = np.random.default_rng(5)
    a, b = fake_run(rng), fake_run(rng)
    for run in (a, b):
        run["output_tokens"][:] = 64
        run["eos"][:] = 0
    check = check_rollout(a, b)
    assert [t.signal for t in check.tests] == ["target_logprob_mean"] * 2
    assert len(check.notes) == 2


def test_cli_verdict_json_and_exit_codes(tmp_path, capsys):
    rng = np.random.default_rng(6)
    base = write(tmp_path / "base", fake_run(rng))
    cand = write(tmp_path / "cand", fake_run(rng, logprob_shift=-0.3))
    argv = ["--baseline", str(base), "--candidate", str(cand)]
    assert run_cli([*argv, "--json", "--out", str(tmp_path / "out")]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["verdict"] == "shift"
    assert json.loads((tmp_path / "out" / "rollout.json").read_text())["verdict"] == "shift"
    assert run_cli([*argv, "--fail-on-shift"]) == 1


def run_cli(argv: list[str]) -> int:
    """``specsim check rollout`` once the check command registers it; the module otherwise."""
    try:
        return main(["check", "rollout", *argv])
    except SystemExit as exc:  # argparse: 'rollout' not registered yet
        if exc.code != 2:
            raise
    import argparse

    from specsim.cli import check_rollout

    parser = argparse.ArgumentParser()
    check_rollout.add_arguments(parser)
    return check_rollout.run(parser.parse_args(argv))


def test_bad_input_is_one_line_exit_2(tmp_path, capsys):
    rng = np.random.default_rng(7)
    good = write(tmp_path / "good", fake_run(rng))
    with pytest.raises(SpecsimError, match="run folder not found"):
        load_rollout_records(tmp_path / "missing")
    short = write(tmp_path / "short", fake_run(rng, n=3))
    with pytest.raises(SpecsimError, match="at least"):
        load_rollout_records(short)
    broken = tmp_path / "broken"
    broken.mkdir()
    text = (good / "requests.csv").read_text().splitlines()
    (broken / "requests.csv").write_text("\n".join([text[0], text[1], "1,2,3"]) + "\n")
    with pytest.raises(SpecsimError, match="line 3"):
        load_rollout_records(broken)
    nocol = tmp_path / "nocol"
    nocol.mkdir()
    (nocol / "requests.csv").write_text("id,arrival_s\n1,0.5\n")
    with pytest.raises(SpecsimError, match="missing"):
        load_rollout_records(nocol)


def engine_run(tmp_path, name: str, speculation: dict):
    """64 requests through the real engine (8 closed-loop clients, seed 21), as a run folder."""
    from test_engine_common import drafter_map, model_spec, prompts_path

    from specsim.engine.run import run_engine, write_run
    from specsim.scenario import load_scenario

    data = {
        "name": name,
        "seed": 21,
        "profile": "unused.yaml",
        "workload": {
            "kind": "closed_loop",
            "concurrency": 8,
            "requests": 64,
            "prompt": {"dist": "fixed", "value": 32},
            "output": {"dist": "fixed", "value": 24},
        },
        "engine": {"max_batch": 8, "chunked_prefill": False},
        "speculation": speculation,
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    run = run_engine(
        load_scenario(path),
        target=model_spec("specsim-target"),
        drafters=drafter_map(),
        prompts=prompts_path(),
    )
    write_run(run, tmp_path / name)
    return tmp_path / name


@pytest.mark.slow
def test_engine_rollouts_exact_passes_lossy_typical_is_flagged(tmp_path):
    # n = 64 per side; the lossless candidate must not be flagged (false alarm <= alpha = 0.01),
    # typical acceptance with the weak drafter moves the target log-likelihood and must be.
    base = engine_run(tmp_path, "base", {"drafter": None, "k": 0})
    exact = engine_run(tmp_path, "exact", {"drafter": "small", "k": 3})
    lossy = engine_run(tmp_path, "lossy", {"drafter": "tiny", "k": 3, "verifier": "typical"})
    assert not check_rollout(load_rollout_records(base), load_rollout_records(exact)).shifted
    check = check_rollout(load_rollout_records(base), load_rollout_records(lossy))
    print("\n" + "\n".join(f"{t.signal} {t.test} p={t.p_value:.3g}" for t in check.tests))
    assert check.shifted
