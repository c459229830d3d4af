"""Measuring DeepSeek-V3's MTP module as a drafter (``specsim.profiling.mtp_measure``): its
scores replay the engine's own steps, ``specsim profile`` writes a ``method: mtp`` entry the
simulator reads, and ``validate`` runs an MTP scenario on a measured profile.

The models are ``test_mtp_engine``'s tiny random DeepSeek-V3 folders with one MTP layer (a
vocabulary of 6 for the step replay, the byte tokenizer's 258 for the command-line runs).
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
import yaml
from test_engine import scenario_file
from test_mtp_engine import (  # noqa: F401  (fixtures)
    GREEDY,
    built,
    byte_folder,
    models,
    prompts,
)

from specsim.cli import main
from specsim.engine.generate import generate
from specsim.engine.step import Sampling
from specsim.errors import SpecsimError
from specsim.profile import load_profile
from specsim.profiling.mtp_measure import mtp_scores
from specsim.profiling.scoring import generate_target_text

N_TOKENS = 14


def replay_greedy_steps(matches: list[np.ndarray], n_tokens: int, k: int) -> tuple[int, int]:
    """(steps, accepted) of ``generate``'s loop replayed on 0/1 scores ``A[s, i]``: the first
    token from prefill, then a step at s offers min(k, tokens still owed - 1) drafts and
    accepts their leading run of matches."""
    steps = accepted = 0
    for match in matches:
        s = 1
        while s < n_tokens:
            offered = min(k, n_tokens - s - 1)
            run = 0
            while run < offered and match[s, run] > 0.5:
                run += 1
            steps, accepted, s = steps + 1, accepted + run, s + run + 1
    return steps, accepted


@torch.no_grad()
def greedy_matches(models, depth_dependent: bool = True) -> list[np.ndarray]:  # noqa: F811
    target, mtp = models
    text = generate_target_text(target, prompts(), 0.0, N_TOKENS, torch.Generator())
    matches = mtp_scores(mtp, text, 0.0)["match"]
    if depth_dependent:
        return matches
    # A draft model's rule: draft i + 1 from s scored with the depth-1 q at s + i.
    return [np.stack([np.roll(m[:, 0], -i) for i in range(m.shape[1])], axis=1) for m in matches]


@pytest.mark.parametrize("k", [1, 2, 3])
def test_greedy_mtp_scores_replay_the_engines_own_steps(models, k):  # noqa: F811
    """At T = 0 the text is the target's greedy text and every score is 0/1, so the engine's
    steps follow from the scores exactly: its step and acceptance counts over 5 prompts x 14
    tokens (``generate``, the serving loop's step) equal the replay's."""
    target, mtp = models
    run = generate(target, mtp, prompts(), N_TOKENS, k, GREEDY, seed=0)
    assert replay_greedy_steps(greedy_matches(models), N_TOKENS, k) == (run.steps, run.accepted)
    assert run.accepted > 0 and run.accepted < run.drafted  # both accept and reject paths


def test_mtp_drafts_past_the_first_depend_on_where_the_step_started(models):  # noqa: F811
    """Scoring draft i + 1 with the depth-1 distribution at s + i (as for a draft model)
    misses the engine's counts: the module's later passes read its own state, not the
    target's. Fails if ``mtp_start_logits`` reuses pass 1's logits at every depth."""
    target, mtp = models
    wrong = greedy_matches(models, depth_dependent=False)
    misses = []
    for k in (2, 3):
        run = generate(target, mtp, prompts(), N_TOKENS, k, GREEDY, seed=0)
        misses.append(replay_greedy_steps(wrong, N_TOKENS, k) != (run.steps, run.accepted))
    assert any(misses)


def profile_argv(folder, out, *extra) -> list[str]:
    return [
        *("profile", "measure"),
        *("--target", str(folder), "--drafter", "deep-mtp=mtp", "--out", str(out)),
        *("--grid", "batch=1,2", "--grid", "context=8,24", "--grid", "new=1,3"),
        *("--grid", "prefill=12", "--repeats", "1", "--seed", "4"),
        *("--max-prompts", "3", "--max-new-tokens", "10", "--temperature", "1.0"),
        *extra,
    ]


@pytest.fixture(scope="module")
def measured(byte_folder, tmp_path_factory):  # noqa: F811
    """``specsim profile`` on the MTP drafter, its engine-overhead waves cut to one round."""
    from specsim.profiling import overhead

    out = tmp_path_factory.mktemp("mtp-profile") / "mtp.yaml"
    original = overhead.measure_overhead
    overhead.measure_overhead = functools.partial(original, waves=1)
    try:
        assert main(profile_argv(byte_folder, out)) == 0
    finally:
        overhead.measure_overhead = original
    return out


def test_a_measured_mtp_profile_loads_with_its_grid_and_acceptance(measured):
    loaded = load_profile(measured)
    entry = loaded.profile.drafters["deep-mtp"]
    assert entry.kind == "draft_model" and entry.method == "mtp"
    assert len(entry.latency.samples) == 2 * 2 * 2 + 2  # batch x context x new, plus prefill
    assert loaded.latency_model("deep-mtp").pass_seconds([24], 1) > 0
    measured_for = {(a.verifier, a.temperature) for a in loaded.profile.acceptance}
    assert {("greedy", 0.0), ("rejection", 1.0), ("typical", 1.0)} <= measured_for
    written = yaml.safe_load(measured.read_text(encoding="utf-8"))
    assert written["drafters"]["deep-mtp"]["method"] == "mtp"


def test_a_measured_mtp_profiles_acceptance_is_its_scores_walked(measured, byte_folder):  # noqa: F811
    """The profile's greedy entry equals the chain statistics of ``mtp_scores`` on the same
    prompts and seed (the scores the step replay above checks against the engine)."""
    from specsim.models import load_model, load_mtp_drafter, load_tokenizer
    from specsim.profiling.acceptance import Scored, chain_statistics
    from specsim.profiling.measure_inputs import MeasureOptions, prompt_ids

    target = load_model(byte_folder, seed=4)
    mtp = load_mtp_drafter(byte_folder, target, seed=4)
    options = MeasureOptions(target=str(byte_folder), drafters=[], name="x", max_prompts=3)
    ids, _, _ = prompt_ids(options, load_tokenizer(byte_folder), target.config.max_position, 10)
    text = generate_target_text(target, ids, 0.0, 10, torch.Generator().manual_seed(4))
    rows = mtp_scores(mtp, text, 0.0)
    stats = chain_statistics(
        [Scored(a, d) for a, d in zip(rows["match"], rows["drafts"], strict=True)]
    )
    greedy = next(a for a in load_profile(measured).profile.acceptance if a.verifier == "greedy")
    # The profile writes its numbers to 6 significant digits.
    assert greedy.per_position == pytest.approx(stats.per_position, rel=1e-5)
    assert greedy.mean_acceptance_length == pytest.approx(stats.mean_acceptance_length, rel=1e-5)
    assert stats.mean_acceptance_length[4] > 1.0  # some drafts accepted


def test_a_simulation_runs_on_a_measured_mtp_profile(measured, tmp_path):
    scenario = scenario_file(tmp_path, speculation={"drafter": "deep-mtp", "k": 2})
    data = yaml.safe_load(scenario.source.read_text())
    data["profile"] = str(measured)
    scenario.source.write_text(yaml.safe_dump(data))
    assert main(["simulate", str(scenario.source), "--out", str(tmp_path / "sim")]) == 0
    summary = (tmp_path / "sim" / "summary.json").read_text()
    assert '"drafter": "deep-mtp"' in summary


def test_validating_an_mtp_scenario_on_a_measured_profile_runs_the_module(
    measured,
    byte_folder,  # noqa: F811
    tmp_path,
):
    """The profile's ``method: mtp`` makes the engine run the target's MTP module under the
    drafter's own name (no --drafter given)."""
    from specsim.validation.validate import ValidateOptions, validate

    scenario = scenario_file(tmp_path, speculation={"drafter": "deep-mtp", "k": 2})
    options = ValidateOptions(
        profile=str(measured), target=str(byte_folder), replications=2, progress=False
    )
    result = validate(scenario, options, tmp_path / "out")
    assert result.engine_summary["scenario"]["drafter_model"] == "mtp"
    records = (tmp_path / "out" / "engine" / "requests.csv").read_text().splitlines()
    drafted = records[0].split(",").index("drafted")
    assert sum(int(row.split(",")[drafted]) for row in records[1:]) > 0


def test_the_reference_clock_with_an_mtp_drafter_is_refused_before_any_model_loads(
    byte_folder,  # noqa: F811
    tmp_path,
):
    from specsim.profiling.measure import MeasureOptions, measure_profile
    from specsim.profiling.specs import parse_drafter

    options = MeasureOptions(
        target=str(byte_folder), drafters=[parse_drafter("mtp")], name="x", clock="reference"
    )
    with pytest.raises(SpecsimError, match="reference clock does not probe MTP") as error:
        measure_profile(options)
    assert "\n" not in str(error.value)


def test_validating_without_a_profile_measures_the_mtp_module(byte_folder, tmp_path, monkeypatch):  # noqa: F811
    """``validate`` with no --profile profiles the scenario's MTP drafter as the target's
    module (its measurement stopped here: the profiling itself is the tests above)."""
    from specsim.profiling import measure
    from specsim.validation.validate import ValidateOptions, validate

    asked = []

    def stop(options, progress_file=None):
        asked.append(options)
        raise SpecsimError("stopped after the options", fix="none")

    monkeypatch.setattr(measure, "measure_profile", stop)
    scenario = scenario_file(tmp_path, speculation={"drafter": "mtp", "k": 2})
    options = ValidateOptions(target=str(byte_folder), progress=False)
    with pytest.raises(SpecsimError, match="stopped after the options"):
        validate(scenario, options, tmp_path / "out")
    (drafter,) = asked[0].drafters
    assert drafter.is_mtp and drafter.name == "mtp" and asked[0].target == str(byte_folder)


def expected_engine_counts(accepts: list[np.ndarray], n_tokens: int, k: int) -> tuple[float, float]:
    """(steps, accepted) that ``generate``'s loop expects on fractional scores ``A[s, i]``
    (the probability that draft i + 1 from s is accepted given drafts 1..i were): the replay
    above with the step start's probability ``w[s]`` carried forward."""
    steps = accepted = 0.0
    for accept in accepts:
        w = np.zeros(n_tokens + k + 2)
        w[1] = 1.0
        for s in range(1, n_tokens):
            offered, reach = min(k, n_tokens - s - 1), 1.0
            steps += w[s]
            for i in range(offered):
                w[s + i + 1] += w[s] * reach * (1.0 - accept[s, i])
                reach *= accept[s, i]
                accepted += w[s] * reach
            w[s + offered + 1] += w[s] * reach
    return steps, accepted


@torch.no_grad()
def test_sampled_mtp_scores_predict_the_engines_acceptance(models):  # noqa: F811
    """At T = 1 under exact rejection the scores are probabilities along one sampled text;
    over many texts their expected acceptance per step is the engine's. 240 rows (5 prompts x
    48, seed 0 for the engine, 1 for the scored texts) of 14 tokens at k = 2, about 1,900
    steps each side; the tolerance is 4 standard errors of the two estimates (rows as units),
    about 0.1 accepted drafts per step (of about 0.6). A coarse check of the sampled path: the
    subtler planted errors tried on these models (pass 2 read from pass 1, pass 1 one entry
    early, the target's states after its norm) move the rate by 0.07 or less; the greedy tests
    above catch all three."""
    target, mtp = models
    sampling = Sampling(temperature=1.0, verifier="rejection")
    many = prompts() * 48
    run = generate(target, mtp, many, N_TOKENS, 2, sampling, seed=0)
    engine_rate = run.accepted / run.steps
    text = generate_target_text(target, many, 1.0, N_TOKENS, torch.Generator().manual_seed(1))
    accepts = mtp_scores(mtp, text, 1.0)["text_accept"]
    per_row = np.array([expected_engine_counts([a], N_TOKENS, 2) for a in accepts])
    predicted_rate = per_row[:, 1].sum() / per_row[:, 0].sum()
    # The engine's per-row spread is not returned: bound it by the scored rows' spread of
    # accepted drafts per step plus the per-step sampling variance (at most k^2 / 4).
    rows_se = per_row[:, 1].std() / per_row[:, 0].mean() / np.sqrt(len(many))
    step_se = np.sqrt(2**2 / 4 / run.steps)
    tolerance = 4 * np.hypot(rows_se, np.hypot(rows_se, step_se))
    assert abs(engine_rate - predicted_rate) < tolerance
    assert 0.1 < predicted_rate < 1.9  # drafts both accepted and rejected
