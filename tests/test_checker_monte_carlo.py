"""Monte Carlo checks of the real torch verifiers, the negative controls and the false-alarm rate.

Every statistical test names its sample size N, its seed, its level and the smallest TV distance
it detects with 99% power (``report.detectable_tv``, asserted below so the claim is pinned).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats as sps

from specsim.errors import SpecsimError
from specsim.sampling import VerifyResult, check_sampler, checker, verify_rejection
from specsim.sampling import reference as ref
from specsim.sampling.controls import CONTROLS
from specsim.sampling.montecarlo import run_monte_carlo, torch_tables
from specsim.sampling.problem import Processing, ToyModels
from specsim.sampling.stats import g_test

N = 200_000  # per check below; detects TV >= ~0.01 with 99% power at alpha 0.01 (vocab 8)


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"drafter": "greedy", "ragged": True, "temperature": 0.7, "top_k": 5},
        {"vocab": 16, "k": 4, "top_p": 0.9, "ragged": True},
        {"temperature": 0.0},
    ],
    ids=["default", "greedy-drafter-ragged-topk", "v16-k4-topp-ragged", "temperature-0"],
)
def test_rejection_passes(options):
    # N = 200000, seed 0, alpha 0.01.
    report = check_sampler("rejection", samples=N, seed=0, **options)
    assert report.lossless, report
    assert report.closed_form_max_abs_error <= 1e-12
    assert report.p_value >= 0.01 and report.impossible_samples == 0
    assert report.detectable_tv < 0.015


def test_greedy_passes_against_greedy_decoding_and_is_flagged_against_sampling():
    # N = 50000, seed 1: against a point mass any miss is fatal; detectable TV ~ 9e-5.
    report = check_sampler("greedy", samples=50_000, seed=1)
    assert report.lossless and report.reference == "target greedy decoding"
    assert report.detectable_tv < 1e-4
    # The same verifier judged against target *sampling* (as a user callable) is flagged.
    as_sampler = check_sampler(checker.VERIFIERS["greedy"].load(), samples=50_000, seed=1)
    assert not as_sampler.lossless and as_sampler.p_value < 1e-6


def test_typical_is_flagged_with_its_distance():
    # N = 50000, seed 2, alpha 0.01: typical acceptance is lossy by design.
    report = check_sampler("typical", samples=50_000, seed=2)
    assert not report.lossless and report.lossy_by_design
    assert report.p_value < 1e-6 and report.tv_distance > 0.05


CONTROL_OPTIONS = {"raw-q": {"top_k": 5}}


@pytest.mark.parametrize("name", sorted(CONTROLS))
def test_negative_controls_are_caught_where_the_correct_verifier_passes(name):
    # N = 200000, seed 0, alpha 0.01, top-k 5 for raw-q: the same N, seed and problem at which
    # test_rejection_passes[default] (and the top-k run below) pass.
    options = CONTROL_OPTIONS.get(name, {})
    report = check_sampler(name, samples=N, seed=0, **options)
    assert not report.lossless
    assert report.p_value < 0.01, f"{name}: Monte Carlo missed it (p = {report.p_value})"
    assert report.tv_distance > report.detectable_tv / 2
    correct = check_sampler("rejection", samples=N, seed=0, **options)
    assert correct.lossless and correct.p_value >= 0.01


@pytest.mark.parametrize("name", ["rejection", "typical", *sorted(CONTROLS)])
def test_torch_implementation_follows_its_closed_form(name):
    # Each torch verifier (right or wrong) must produce the distribution its closed form
    # predicts: N = 100000, seed 3, G-test at alpha 0.001 against the closed form.
    processing = Processing(1.0, 5, 1.0)
    models = ToyModels.make(8, seed=0)
    if name in CONTROLS:
        verifier, rule, raw = (
            CONTROLS[name].verifier,
            CONTROLS[name].rule,
            CONTROLS[name].verify_with_raw_q,
        )
    else:
        subject = checker.VERIFIERS[name]
        verifier, rule, raw = subject.load(), subject.rule, False
    predicted = ref.first_tokens_distribution(
        models.tables(processing, verify_with_raw_q=raw), models.prompt, (0, 1, 2, 3), rule
    )
    tables = torch_tables(models, processing, verify_with_raw_q=raw)
    counts = run_monte_carlo(verifier, tables, models.prompt, 3, 100_000, 3, ragged=True)
    assert g_test(counts, predicted).p_value > 1e-3


def test_same_seed_same_counts():
    models = ToyModels.make(6, seed=0)
    tables = torch_tables(models, Processing())
    runs = [
        run_monte_carlo(verify_rejection, tables, models.prompt, 3, 5_000, seed, ragged=True)
        for seed in (4, 4, 5)
    ]
    assert np.array_equal(runs[0], runs[1]) and not np.array_equal(runs[0], runs[2])
    assert runs[0].sum() == 5_000
    assert check_sampler(samples=5_000, seed=4) == check_sampler(samples=5_000, seed=4)


@pytest.mark.slow
def test_false_alarm_rate_is_close_to_alpha():
    # The correct verifier over 100 seeds (0..99), N = 20000 each, alpha 0.05, vocab 6, k 2.
    # Under the null the number of false alarms is binomial(100, 0.05): we require 1..12
    # (a priori probability of failing 0.6% + 0.1%), and a KS test of the 100 p-values against
    # uniform must not reject at 0.001, which also catches an over-conservative test.
    p_values = np.array(
        [
            check_sampler("rejection", vocab=6, k=2, samples=20_000, seed=s, alpha=0.05).p_value
            for s in range(100)
        ]
    )
    alarms = int((p_values < 0.05).sum())
    assert 1 <= alarms <= 12, alarms
    assert sps.kstest(p_values, "uniform").pvalue > 1e-3


# ---- a third-party verifier through an adapter ------------------------------------------------


def third_party_spec_sample(target_probs, draft_probs, draft_ids, coins, buggy=False):
    """A sampler with its own conventions: time-major probabilities [k+1, B, V] / [k, B, V],
    draft ids [k, B], one coin per position plus one [k+1, B]; returns (ids [B, k+1] padded
    with V, lengths [B]). ``buggy`` resamples from p on rejection."""
    k, batch, vocab = draft_probs.shape
    out = torch.full((batch, k + 1), vocab, dtype=torch.long)
    length = torch.zeros(batch, dtype=torch.long)
    alive = torch.ones(batch, dtype=torch.bool)
    for i in range(k):
        x = draft_ids[i]
        p_x = target_probs[i].gather(1, x[:, None])[:, 0]
        q_x = draft_probs[i].gather(1, x[:, None])[:, 0]
        ok = alive & (coins[i] * q_x < p_x)
        out[ok, i] = x[ok]
        stop = alive & ~ok
        residual = target_probs[i] if buggy else torch.clamp(target_probs[i] - draft_probs[i], 0)
        cdf = residual.cumsum(1)
        pick = torch.searchsorted(cdf, (coins[k] * cdf[:, -1])[:, None], right=True)[:, 0]
        out[stop, i] = pick[stop]
        length = torch.where(stop, i + 1, length)
        alive &= ok
    cdf = target_probs[k].cumsum(1)
    bonus = torch.searchsorted(cdf, (coins[k] * cdf[:, -1])[:, None], right=True)[:, 0]
    out[alive, k] = bonus[alive]
    length = torch.where(alive, k + 1, length)
    return out, length


def adapter(buggy=False):
    """Wrap third_party_spec_sample in the checker's verifier signature (see checker docs)."""

    def verify(p, q, draft_tokens, n_drafts, randomness):
        coins = torch.cat([randomness.accept, randomness.sample[:, None]], dim=1)
        ids, length = third_party_spec_sample(
            p.transpose(0, 1), q.transpose(0, 1), draft_tokens.t(), coins.t(), buggy
        )
        tokens = torch.where(ids == p.shape[-1], -1, ids)
        k = draft_tokens.shape[1]
        return VerifyResult(length - 1, tokens, tokens[:, :k] >= 0)

    return verify


def test_a_wrapped_third_party_verifier_is_checked():
    # N = 200000, seed 0, alpha 0.01: the correct third-party sampler passes, the buggy one
    # (resampling from p) is caught. No closed form exists for a callable.
    good = check_sampler(adapter(), samples=N, seed=0)
    assert good.lossless and good.closed_form_max_abs_error is None and good.p_value >= 0.01
    bad = check_sampler(adapter(buggy=True), samples=N, seed=0)
    assert not bad.lossless and bad.p_value < 0.01


def test_malformed_verifier_output_is_a_clear_error():
    def wrong_shape(p, q, draft_tokens, n_drafts, randomness):
        return VerifyResult(n_drafts * 0, draft_tokens, draft_tokens >= 0)

    def wrong_prefix(p, q, draft_tokens, n_drafts, randomness):
        result = verify_rejection(p, q, draft_tokens, n_drafts, randomness)
        tokens = result.tokens.clone()
        tokens[:, 0] = torch.where(result.accepted > 0, (tokens[:, 0] + 1) % p.shape[-1], 0)
        return VerifyResult(result.accepted, tokens, result.accepted_mask)

    for bad in (wrong_shape, wrong_prefix):
        with pytest.raises(SpecsimError) as info:
            check_sampler(bad, samples=1000)
        assert info.value.key == "verifier"


def test_a_callable_needs_monte_carlo_samples(monkeypatch):
    with pytest.raises(SpecsimError, match="no closed form"):
        check_sampler(verify_rejection, samples=0)
    monkeypatch.setattr(checker, "torch_available", lambda: False)
    with pytest.raises(SpecsimError, match="nothing could be run"):
        check_sampler(verify_rejection, samples=1000)


def test_without_torch_the_closed_form_still_gives_a_verdict(monkeypatch):
    monkeypatch.setattr(checker, "torch_available", lambda: False)
    report = check_sampler("rejection")
    assert report.lossless and report.p_value is None and report.samples == 0
    assert "torch is not installed" in report.monte_carlo_note
    assert not check_sampler("typical").lossless
