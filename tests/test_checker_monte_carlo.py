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
from specsim.sampling.harness import verifier_tables
from specsim.sampling.montecarlo import run_monte_carlo
from specsim.sampling.problem import Processing, ToyModels
from specsim.sampling.stats import goodness_of_fit
from specsim.sampling.subjects import VERIFIERS

N = 200_000  # per check below; detects TV >= ~0.01 on the first two tokens with 99% power


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"drafter": "greedy", "ragged": True, "temperature": 0.7, "top_k": 5},
        {"vocab": 16, "k": 3, "top_p": 0.9, "ragged": True},
        {"vocab": 9, "k": 4, "top_p": 0.9},
        {"temperature": 0.0},
    ],
    ids=["default", "greedy-drafter-ragged-topk", "v16-k3-topp-ragged", "v9-k4-topp", "temp-0"],
)
def test_rejection_passes(options):
    # N = 200000, seed 0, alpha 0.01 shared by the k + 1 window tests (alpha / (k + 1) each).
    report = check_sampler("rejection", samples=N, seed=0, **options)
    assert report.lossless, report
    assert report.judged_tokens == report.k + 1 == len(report.window_tests)
    assert report.closed_form_max_abs_error <= 1e-12
    assert report.p_value >= 0.01 and report.impossible_samples == 0
    detectable = [test["detectable_tv"] for test in report.window_tests]
    # Pinned power: the first two tokens keep a small table's power, the whole window (up to
    # ~1,250 pooled cells here) detects what moves the joint of all k + 1 tokens by 2 %.
    assert detectable[1] < 0.011 and detectable[-1] < 0.02
    assert detectable == sorted(detectable)  # more tokens, more cells, less power per cell


def test_the_whole_window_is_judged_so_a_stale_bonus_is_caught_at_the_default_k():
    # The stale-bonus control draws the bonus (token k + 1 = 4) from the wrong position: the
    # first two tokens are exactly right, so a check of two tokens (the old checker) passes it.
    # N = 200000, seed 0, alpha 0.01.
    report = check_sampler("stale-bonus", samples=N, seed=0)
    assert report.k == 3 and not report.lossless and report.tv_distance > 0.04
    _, two, *_, whole = report.window_tests
    level = report.alpha / len(report.window_tests)
    assert two["tokens"] == 2 and two["p_value"] >= level  # invisible in tokens 1-2 ...
    assert whole["tokens"] == 4 and whole["p_value"] < 1e-6  # ... caught in tokens 1-4
    models = ToyModels.make(8, seed=0)
    tables = models.tables(Processing())
    bug = CONTROLS["stale-bonus"].rule
    first_two = ref.first_tokens_distribution(tables, models.prompt, (3,), bug, n_tokens=2)
    target_two = ref.target_distribution(tables.p, models.prompt, 2)
    assert np.abs(first_two - target_two).max() <= 1e-12


def test_greedy_passes_against_greedy_decoding_and_is_flagged_against_sampling():
    # N = 50000, seed 1: against a point mass any miss is fatal; detectable TV ~ 9e-5.
    report = check_sampler("greedy", samples=50_000, seed=1)
    assert report.lossless and report.reference == "target greedy decoding"
    assert report.detectable_tv < 1e-4
    # The same verifier judged against target *sampling* (as a user callable) is flagged, by
    # its exact enumeration and by the Monte Carlo test.
    as_sampler = check_sampler(VERIFIERS["greedy"].load(), samples=50_000, seed=1)
    assert not as_sampler.lossless and as_sampler.p_value < 1e-6
    assert as_sampler.exact_method == "enumeration" and as_sampler.tv_distance > 0.1
    as_greedy = check_sampler(
        VERIFIERS["greedy"].load(), samples=0, greedy_reference=True, vocab=5, k=2
    )
    assert as_greedy.lossless and as_greedy.closed_form_max_abs_error <= as_greedy.exact_tolerance


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
    # predicts over the whole window: N = 100000, seed 3, Cressie-Read test at alpha 0.001.
    processing = Processing(1.0, 5, 1.0)
    models = ToyModels.make(8, seed=0)
    if name in CONTROLS:
        verifier, rule, raw = (
            CONTROLS[name].verifier,
            CONTROLS[name].rule,
            CONTROLS[name].verify_with_raw_q,
        )
    else:
        subject = VERIFIERS[name]
        verifier, rule, raw = subject.load(), subject.rule, False
    predicted = ref.first_tokens_distribution(
        models.tables(processing, verify_with_raw_q=raw), models.prompt, (0, 1, 2, 3), rule, 4
    )
    tables = verifier_tables(models, processing, verify_with_raw_q=raw)
    counts = run_monte_carlo(
        verifier, tables, models.prompt, 3, 100_000, 3, n_tokens=4, ragged=True
    )
    assert goodness_of_fit(counts, predicted).p_value > 1e-3


def test_same_seed_same_counts():
    models = ToyModels.make(6, seed=0)
    tables = verifier_tables(models, Processing())
    runs = [
        run_monte_carlo(verify_rejection, tables, models.prompt, 3, 5_000, seed, ragged=True)
        for seed in (4, 4, 5)
    ]
    assert np.array_equal(runs[0], runs[1]) and not np.array_equal(runs[0], runs[2])
    assert runs[0].sum() == 5_000
    assert check_sampler(samples=5_000, seed=4) == check_sampler(samples=5_000, seed=4)


@pytest.mark.slow
def test_false_alarm_rate_is_close_to_alpha():
    # The correct verifier over 100 seeds (0..99), N = 20000 each, alpha 0.05, vocab 6, k 2:
    # three window tests at level alpha / 3. Each test's 100 p-values must pass a KS test
    # against uniform at 0.001 (which also catches an over-conservative test), and the number of
    # family alarms (some test below alpha / 3) must lie in 0..12: between alpha / 3 and alpha
    # per run under the null (nested tests are correlated), so binomial(100, <= 0.05) exceeds
    # 12 with probability < 0.1 %.
    reports = [
        check_sampler("rejection", vocab=6, k=2, samples=20_000, seed=s, alpha=0.05)
        for s in range(100)
    ]
    per_test = np.array([[test["p_value"] for test in r.window_tests] for r in reports])
    for j in range(per_test.shape[1]):
        assert sps.kstest(per_test[:, j], "uniform").pvalue > 1e-3, j
    alarms = sum(not r.lossless for r in reports)
    assert alarms <= 12, alarms
    assert int((per_test < 0.05 / 3).any(axis=1).sum()) == alarms


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


def test_a_wrapped_third_party_verifier_is_checked_exactly():
    # The correct third-party sampler passes its exact enumeration (to float32 rounding: its
    # inputs are float32) and the Monte Carlo tests (N = 200000, seed 0, alpha 0.01); the buggy
    # one (resampling from p) is caught by both.
    good = check_sampler(adapter(), samples=N, seed=0)
    assert good.lossless and good.exact_method == "enumeration" and good.p_value >= 0.01
    assert good.enumeration_cases == 8**3 and good.malformed is None
    assert good.closed_form_max_abs_error <= good.exact_tolerance < 1e-4
    bad = check_sampler(adapter(buggy=True), samples=N, seed=0)
    assert not bad.lossless and bad.p_value < 0.01
    assert bad.closed_form_max_abs_error > 100 * bad.exact_tolerance


def test_enumerating_a_callable_gives_its_closed_form_exactly():
    # In float64 a callable's enumeration is exact: each built-in rule and control, called as a
    # function, reproduces its own closed form (one step from the prompt, then the target) to
    # 1e-12, ragged windows included.
    import torch

    from specsim.sampling.enumeration import enumerate_step

    models = ToyModels.make(4, seed=2)
    processing = Processing(0.8, 3, 1.0)
    tables = verifier_tables(models, processing, dtype=torch.float64)
    subjects = [(VERIFIERS[n].load(), VERIFIERS[n].rule) for n in ("rejection",)]
    subjects += [(c.verifier, c.rule) for n, c in CONTROLS.items() if n != "raw-q"]
    for verifier, rule in subjects:
        for counts in ((3,), (0, 1, 2, 3)):
            got = enumerate_step(
                verifier, tables, models.prompt, 3, counts, p_table=models.tables(processing).p
            )
            expected = ref.rule_first_step_window(
                models.tables(processing), models.prompt, counts, rule, 4
            )
            np.testing.assert_allclose(got.window, expected, atol=1e-12, rtol=0)


def test_a_callable_without_monte_carlo_still_gets_an_exact_verdict(monkeypatch):
    report = check_sampler(verify_rejection, samples=0, vocab=5, k=2)
    assert report.lossless and report.exact_method == "enumeration" and report.p_value is None
    monkeypatch.setattr(checker, "torch_available", lambda: False)
    with pytest.raises(SpecsimError, match="nothing could be run"):
        check_sampler(verify_rejection, samples=1000)


# ---- malformed outputs are verdicts ---------------------------------------------------------


def wrong_shape(p, q, draft_tokens, n_drafts, randomness):
    return VerifyResult(n_drafts * 0, draft_tokens, draft_tokens >= 0)


def wrong_prefix(p, q, draft_tokens, n_drafts, randomness):
    result = verify_rejection(p, q, draft_tokens, n_drafts, randomness)
    tokens = result.tokens.clone()
    tokens[:, 0] = torch.where(result.accepted > 0, (tokens[:, 0] + 1) % p.shape[-1], 0)
    return VerifyResult(result.accepted, tokens, result.accepted_mask)


def token_out_of_range(p, q, draft_tokens, n_drafts, randomness):
    result = verify_rejection(p, q, draft_tokens, n_drafts, randomness)
    tokens = result.tokens.clone()
    last = tokens.gather(1, result.accepted[:, None])
    tokens.scatter_(1, result.accepted[:, None], torch.where(last == 0, p.shape[-1], last))
    return result.accepted, tokens


def crashes(p, q, draft_tokens, n_drafts, randomness):
    raise RuntimeError("shape mismatch in my kernel")


@pytest.mark.parametrize(
    "verifier, reason",
    [
        (wrong_shape, "tokens of shape"),
        (wrong_prefix, "accepted prefix that differs from the drafts"),
        (token_out_of_range, "outside the vocabulary"),
        (crashes, "raised RuntimeError: shape mismatch in my kernel"),
    ],
)
def test_a_malformed_output_is_a_verdict_with_the_rows(verifier, reason):
    report = check_sampler(verifier, samples=1000, vocab=4, k=2)
    assert not report.lossless and report.malformed is not None
    assert reason in report.malformed["reason"]
    example = report.malformed["examples"][0]
    assert set(example) >= {"row", "draft_tokens", "n_drafts", "accept_uniforms"}
    if verifier in (wrong_prefix, token_out_of_range):
        # The offending row is shown with what the verifier returned.
        assert "tokens" in example and len(example["tokens"]) == 3


def test_a_verifier_that_draws_its_own_randomness_has_no_enumeration():
    # Judged by the Monte Carlo test alone (N = 50000, seed 0): its own torch.rand breaks the
    # "deterministic given the uniforms" premise, which the enumeration detects and says.
    own = torch.Generator().manual_seed(0)  # its own stream, seeded: not the suite's order

    def own_uniforms(p, q, draft_tokens, n_drafts, randomness):
        accept = torch.rand(randomness.accept.shape, generator=own, dtype=randomness.accept.dtype)
        mine = type(randomness)(accept, randomness.sample)
        return verify_rejection(p, q, draft_tokens, n_drafts, mine)

    report = check_sampler(own_uniforms, samples=50_000, vocab=4, k=2)
    assert report.closed_form_max_abs_error is None and "different outputs" in report.exact_note
    assert report.lossless and report.p_value >= 0.01


# ---- raw logits: the client's own processing is exercised ----------------------------------


def own_processing(target_logits, drafter_logits, draft_tokens, n_drafts, randomness, *,
                   temperature, top_k, top_p, buggy=False):  # fmt: skip
    """A client that takes raw logits and applies temperature and top-k itself (top-p off);
    ``buggy`` forgets the temperature on the drafter's side."""

    def process(logits, t):
        scaled = logits / t
        if top_k:
            kth = scaled.topk(top_k, dim=-1).values[..., -1:]
            scaled = scaled.masked_fill(scaled < kth, float("-inf"))
        return torch.softmax(scaled, dim=-1)

    p = process(target_logits, temperature)
    q = process(drafter_logits, 1.0 if buggy else temperature)
    return verify_rejection(p, q, draft_tokens, n_drafts, randomness, validate=False)


def test_raw_logits_exercise_the_clients_own_processing():
    # Temperature 0.7 and top-k 5, vocab 6, k 2: exact enumeration plus N = 100000, seed 0.
    options = dict(inputs="logits", temperature=0.7, top_k=5, vocab=6, k=2, samples=100_000)
    good = check_sampler(own_processing, **options)
    assert good.lossless and good.inputs == "logits"
    assert good.closed_form_max_abs_error <= good.exact_tolerance

    def forgets(*args, **kwargs):
        return own_processing(*args, **kwargs, buggy=True)

    bad = check_sampler(forgets, **options)
    assert not bad.lossless and bad.closed_form_max_abs_error > 1e-3 and bad.p_value < 0.01


def test_lossy_by_design_is_reported_not_failed():
    typical = VERIFIERS["typical"].load()
    report = check_sampler(typical, samples=0, lossy_by_design=True, vocab=5, k=2)
    assert report.lossy_by_design and not report.lossless and report.tv_distance > 0.01
