"""Acceptance statistics: the chain walk against hand-computed cases and Monte Carlo, prompt
lookup proposals, and the per-position scores of the torch scorer."""

from __future__ import annotations

import math

import numpy as np
import pytest

from specsim.drafters import proposals
from specsim.profiling.acceptance import (
    Scored,
    chain_statistics,
    format_sequences,
    request_concentration,
    run_lengths,
    run_lengths_from_matches,
    walk,
    walk_all,
)

# Greedy matches along a 9-token text; with k = 2 the steps are (hand-walked):
#   s=0: drafts at 0,1 both accepted -> emits 3, next s=3
#   s=3: 3 accepted, 4 rejected      -> emits 2, next s=5
#   s=5: 5 rejected                  -> emits 1, next s=6
#   s=6: 6,7 accepted                -> emits 3, next s=9 (end)
MATCHES = np.array([1, 1, 0, 1, 0, 0, 1, 1, 1], dtype=float)


def test_greedy_walk_matches_the_hand_walked_steps():
    totals = walk(Scored.from_beta(MATCHES, max_k=2), k=2)
    assert totals.steps == 4
    assert totals.accepted == 5
    assert totals.mean_acceptance_length == 1 + 5 / 4
    assert list(totals.tried) == [4, 3]  # every step tries draft 1; s=0,3,6 try draft 2
    assert list(totals.passed) == [3, 2]
    assert totals.conditional_rates() == [0.75, 2 / 3]
    assert totals.unconditional_rates() == [0.75, 0.5]
    # Averaging over every position gives 6/9 for draft 1: not what the steps see.
    assert MATCHES.mean() != pytest.approx(0.75)


def test_fractional_walk_carries_the_exact_start_probabilities():
    # beta = [0.5, 0.5], k = 1. Step at 0 always (w=1): tries 1, accepts 0.5; the next step
    # starts at 1 with probability 0.5 (rejection) or at 2 (end) with 0.5. The step at 1 has
    # w = 0.5: tries 0.5, accepts 0.25. Steps 1.5, accepted 0.75.
    totals = walk(Scored.from_beta([0.5, 0.5], max_k=1), k=1)
    assert totals.steps == pytest.approx(1.5)
    assert totals.accepted == pytest.approx(0.75)
    assert totals.mean_acceptance_length == pytest.approx(1.5)


def test_windows_running_past_the_text_are_not_counted():
    # With k = 4 on a 5-token text of matches, the step at 0 emits 5 tokens and ends the text.
    assert walk(Scored.from_beta(np.ones(5), max_k=4), k=4).steps == 1
    # A step starting at position 3 with k = 4 would need positions 3..6: not counted.
    totals = walk(Scored.from_beta(np.array([0, 0, 0, 0, 1.0]), max_k=4), k=4)
    assert totals.steps == 2  # starts 0 and 1 fit; 2, 3, 4 run past the end
    assert totals.accepted == 0


def test_chain_statistics_mean_acceptance_length_per_k():
    stats = chain_statistics([Scored.from_beta(MATCHES, max_k=8)], max_k=2)
    assert stats.mean_acceptance_length[2] == 2.25
    # k = 1: steps at 0 (acc) ->2 (rej) ->3 (acc) ->5 (rej) ->6 (acc) ->8 (acc) -> end:
    # 6 steps, 4 accepted.
    assert stats.mean_acceptance_length[1] == pytest.approx(1 + 4 / 6)
    assert stats.per_position == [0.75, 2 / 3]
    assert stats.proposal_rate == 1.0


def _monte_carlo_mean_acceptance_length(beta, k, runs, rng):
    """Simulate the actual step process with explicit uniforms (the ground truth)."""
    steps = accepted = 0
    n = len(beta)
    for _ in range(runs):
        s = 0
        while s + k <= n:
            a = 0
            while a < k and rng.random() < beta[s + a]:
                a += 1
            steps += 1
            accepted += a
            s += a + 1
        # a final window that would run past the text is not counted (as in the walk)
    return 1 + accepted / steps


def _independent_positions(scored, k):
    """Planted bug: treat positions as independent, with the rate averaged over the text."""
    m = scored[0].accept[:, 0].mean()
    return 1 + sum(m**i for i in range(1, k + 1))


def _always_full_window(scored, k):
    """Planted bug: advance every step by k + 1, as if no draft were ever rejected."""
    beta = scored[0].accept[:, 0]
    steps = accepted = 0.0
    for s in range(0, len(beta) - k + 1, k + 1):
        steps += 1
        accepted += sum(np.prod(beta[s : s + i]) for i in range(1, k + 1))
    return 1 + accepted / steps


@pytest.mark.parametrize(
    "method, agrees",
    [
        (lambda scored, k: walk_all(scored, k).mean_acceptance_length, True),
        (_independent_positions, False),
        (_always_full_window, False),
    ],
)
def test_walk_agrees_with_monte_carlo_and_planted_bugs_do_not(method, agrees):
    # 60 positions in easy and hard stretches (acceptance is correlated along a text). Monte
    # Carlo: 4000 runs (seed 7), about 2300 steps each, so the estimate's standard error is
    # below 0.003; the tolerance of 0.03 (10 standard errors) still detects the planted bugs,
    # which are off by 0.1 or more here.
    rng = np.random.default_rng(7)
    beta = np.concatenate([np.full(20, 0.95), np.full(20, 0.15), np.full(20, 0.8)])
    beta = np.clip(beta + rng.normal(0, 0.03, beta.size), 0, 1)
    k = 4
    truth = _monte_carlo_mean_acceptance_length(beta, k, 4000, rng)
    estimate = method([Scored.from_beta(beta, max_k=8)], k)
    assert bool(abs(estimate - truth) < 0.03) == agrees, (estimate, truth)


def test_run_lengths_and_sequences_format():
    assert run_lengths_from_matches(MATCHES).tolist() == [3, 2, 1, 2, 1, 1, 4, 3, 2]
    accept = np.array([[1, 1, 0], [1, 0, 1], [0, 1, 1]], dtype=float)
    assert run_lengths(accept, np.array([3, 3, 0])).tolist() == [3, 2, 1]
    assert run_lengths(accept, np.array([1, 3, 3])).tolist() == [2, 2, 1]
    text = format_sequences([np.array([3, 1]), np.array([2])], "run_length")
    assert text == "3 1\n2\n"
    assert format_sequences([np.array([0.25, 1.0])], "beta") == "0.2500 1.0000\n"


def _concentration_without_noise_correction(betas):
    """Planted bug: the variance of per-request means taken as the between-request variance,
    forgetting that each mean of n Bernoulli positions is itself noisy."""
    means = np.array([b.mean() for b in betas])
    m = float(np.mean(np.concatenate(betas)))
    return m * (1 - m) / means.var(ddof=1) - 1


@pytest.mark.parametrize(
    "estimator, agrees",
    [(request_concentration, True), (_concentration_without_noise_correction, False)],
)
def test_request_concentration_recovers_a_beta_mixture(estimator, agrees):
    # 1000 requests whose rates are drawn from Beta(7, 3) (concentration 10, mean 0.7), each with
    # 20 Bernoulli positions (seed 3). The between-request variance is 0.019 and the noise of a
    # 20-position mean 0.0105, so forgetting the noise reads about 6 instead of 10; the
    # estimator's own sampling error at this size is about 5% (8.97..10.23 over seeds 0-5), well
    # inside the 25% tolerance.
    rng = np.random.default_rng(3)
    rates = rng.beta(7, 3, size=1000)
    betas = [(rng.random(20) < r).astype(float) for r in rates]
    estimate = estimator(betas)
    assert bool(abs(estimate - 10) < 2.5) == agrees, estimate


def test_request_concentration_of_identical_requests_is_absent_or_large():
    rng = np.random.default_rng(4)
    alike = [(rng.random(200) < 0.7).astype(float) for _ in range(400)]
    estimate = request_concentration(alike)
    assert estimate is None or estimate > 100
    assert request_concentration(alike[:3]) is None  # too few requests to say


def test_prompt_lookup_proposes_the_continuation_of_the_latest_match():
    tokens, lengths = proposals([1, 2, 3, 4, 1, 2], [3, 4, 9, 1, 2, 3], n=2, k=3)
    assert lengths.tolist() == [3, 3, 3, 0, 0, 3]
    assert tokens[0].tolist() == [3, 4, 1]  # (1, 2) earlier at 0..1, followed by 3 4 1
    assert tokens[1].tolist() == [4, 1, 2]
    assert tokens[2].tolist() == [1, 2, 3]
    assert tokens[5].tolist() == [3, 4, 9]  # the latest (1, 2) is at 4..5 now
    # A match at the very end offers only what follows it.
    short, short_len = proposals([5, 6, 5], [6], n=1, k=4)
    assert short_len.tolist() == [2] and short[0, :2].tolist() == [6, 5]


def test_prompt_lookup_walk_is_conditional_on_a_proposal():
    # Proposals at 2 of 4 starts; accepted drafts per proposal as given.
    accept = np.array([[1, 1, 0, 0], [0, 0, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0]], dtype=float)
    drafts = np.array([3, 0, 0, 0])
    stats = chain_statistics([Scored(accept, drafts)], max_k=2)
    # k = 2: s=0 proposes 2 drafts, both accepted -> next s=3: no proposal -> end. Steps 2,
    # proposing 1; draft 1 tried once, passed once; draft 2 tried once, passed once.
    assert stats.proposal_rate == 0.5
    assert stats.per_position == [1.0, 1.0]
    assert stats.mean_acceptance_length[2] == 1 + 2 / 2


def test_draft_model_scores_match_hand_computed_values():
    torch = pytest.importorskip("torch")
    from specsim.profiling.scoring import draft_model_scores

    p = torch.tensor([[0.5, 0.3, 0.2], [0.9, 0.05, 0.05]])
    q = torch.tensor([[0.2, 0.3, 0.5], [0.2, 0.3, 0.5]])
    scores = draft_model_scores(p.log(), q.log(), temperature=1.0, tokens=[2, 0])
    # The text's tokens 2 and 0: the draft was accepted given them with min(1, q/p) there:
    # min(1, 0.5 / 0.2) = 1 and 0.2 / 0.9. Averaged over tokens x ~ p that is beta.
    assert scores["text_accept"] == pytest.approx([1.0, 0.2 / 0.9])
    # beta = sum min(p, q); typical threshold min(0.09, 0.3 exp(-H(p))) is 0.09 for both rows:
    # row 1 all tokens pass (typical = 1); row 2 only token 0 does (typical = q(0) = 0.2).
    assert scores["beta"] == pytest.approx([0.7, 0.3])
    assert scores["match"].tolist() == [0.0, 0.0]
    assert scores["typical"] == pytest.approx([1.0, 0.2])
    # Typical's first emitted token: row 1 emits q itself (all pass): TV(q, p) = 0.3. Row 2 emits
    # token 0 with 0.2 (passing draft) + 0.8 (fallback to argmax): one-hot 0, TV = 1 - 0.9.
    assert scores["typical_tv"] == pytest.approx([0.3, 0.1])
    # Temperature 2 flattens both: p ~ sqrt(p), q ~ sqrt(q).
    hot = draft_model_scores(p.log(), q.log(), temperature=2.0, tokens=[0, 1])
    ps, qs = p.sqrt(), q.sqrt()
    ps, qs = ps / ps.sum(-1, keepdim=True), qs / qs.sum(-1, keepdim=True)
    assert hot["beta"] == pytest.approx(torch.minimum(ps, qs).sum(-1).numpy(), rel=1e-6)
    # Temperature 0: one-hot argmax, so beta is 1 exactly where the argmaxes agree.
    q_cold = torch.tensor([[0.6, 0.3, 0.1], [0.1, 0.8, 0.1]])
    cold = draft_model_scores(p.log(), q_cold.log(), 0, tokens=[0, 0])
    assert cold["beta"].tolist() == [1.0, 0.0] == cold["match"].tolist()
    assert cold["text_accept"].tolist() == [1.0, 0.0]  # greedy text: the same as a match


def test_ngram_scores_use_p_of_the_proposed_token():
    torch = pytest.importorskip("torch")
    from specsim.profiling.scoring import ngram_scores

    p = torch.tensor([[0.6, 0.3, 0.1], [0.2, 0.7, 0.1], [0.34, 0.33, 0.33]])
    tokens = np.array([[0, 2], [1, 0], [2, 0]])
    lengths = np.array([2, 1, 2])
    scores = ngram_scores(p.log(), tokens, lengths, temperature=1.0, text=[0, 1, 0])
    assert scores["beta"][0] == pytest.approx([0.6, 0.1])
    # Given the text 0 1 0, a proposal was accepted exactly where it is the text's token.
    assert scores["text_accept"].tolist() == [[1.0, 0.0], [1.0, 0.0], [0.0, 0.0]]
    assert scores["beta"][1] == pytest.approx([0.7, 0.0])  # proposal of length 1
    assert scores["beta"][2] == pytest.approx([0.33, 0.0])  # the text ends after one
    assert scores["match"][0].tolist() == [1.0, 0.0]
    assert scores["typical"][0].tolist() == [1.0, 1.0]  # 0.1 > threshold 0.09
    assert math.isclose(scores["typical"][2][0], 1.0)
    # Passing one-hot proposals emit themselves: TV from p is 1 - p(x).
    assert scores["typical_tv"] == pytest.approx([0.4, 0.3, 0.67])


def test_prompt_files_by_paragraph_line_or_jsonl(tmp_path):
    from specsim.workload.prompts import read_prompts

    paragraphs = tmp_path / "a.txt"
    paragraphs.write_text("first line\nstill first\n\n\nsecond\n")
    assert read_prompts(paragraphs) == ["first line\nstill first", "second"]
    lines = tmp_path / "b.txt"
    lines.write_text("one\ntwo\n\n")
    assert read_prompts(lines) == ["one", "two"]
    jsonl = tmp_path / "c.jsonl"
    jsonl.write_text('{"prompt": "x"}\n\n{"text": "y", "id": 2}\n')
    assert read_prompts(jsonl) == ["x", "y"]


# A pair of Markov "models" over tokens {0, 1}: the target's next token is uniform whatever came
# before; the drafter, after a 0, proposes 0 with probability 0.95. A draft accepted there is a 0,
# where the target's own text holds 0 or 1: the beta walk reads the next position after either.
MARKOV_P = np.array([[0.5, 0.5], [0.5, 0.5]])
MARKOV_Q = np.array([[0.95, 0.05], [0.5, 0.5]])


def _speculative_loop_tokens_per_step(k, chains, steps, rng) -> float:
    """The real loop, simulated: k drafts from q, each accepted with min(1, p/q), the first
    rejected one replaced from the residual max(p - q, 0), a bonus token from p after k accepted.
    Chains start from the stationary state (uniform)."""
    p, q = MARKOV_P, MARKOV_Q
    state = (rng.random(chains) < 0.5).astype(int)
    emitted = 0
    for _ in range(steps):
        alive = np.ones(chains, dtype=bool)
        for _ in range(k):
            draft = (rng.random(chains) < q[state, 1]).astype(int)
            accept = rng.random(chains) < np.minimum(1.0, p[state, draft] / q[state, draft])
            residual = np.maximum(p[state] - q[state], 0.0)
            fixed = (rng.random(chains) * residual.sum(1) < residual[:, 1]).astype(int)
            emitted += int(alive.sum())
            state = np.where(alive, np.where(accept, draft, fixed), state)
            alive &= accept
        bonus = (rng.random(chains) < p[state, 1]).astype(int)
        emitted += int(alive.sum())
        state = np.where(alive, bonus, state)
    return emitted / (chains * steps)


@pytest.mark.parametrize("k", [1, 2, 4])
def test_exact_rejection_walk_given_the_text_matches_the_real_loop(k):
    """Seed 0. The real loop over 8,000 chains x 40 steps (320,000 steps: standard error up to
    0.003 tokens per step) against the profiler's walk over 160 texts of 1,000 tokens sampled
    from the target (up to 0.005, at k = 4); tolerance 0.025, about four standard errors at
    k = 4. Walking beta instead (the expected acceptance over tokens the text did not emit)
    reads 0.04 / 0.12 / 0.24 tokens per step low at k = 1 / 2 / 4: the same check rejects it."""
    torch = pytest.importorskip("torch")
    from specsim.profiling.scoring import draft_model_scores

    rng = np.random.default_rng(0)
    real = _speculative_loop_tokens_per_step(k, 8000, 40, rng)
    walked = {"text_accept": [], "beta": []}
    for _ in range(160):
        text = (rng.random(1000) < 0.5).astype(int)
        before = np.concatenate([[0], text[:-1]])
        scores = draft_model_scores(
            torch.tensor(np.log(MARKOV_P[before])),
            torch.tensor(np.log(MARKOV_Q[before])),
            1.0,
            text.tolist(),
        )
        for key, values in walked.items():
            values.append(Scored.from_beta(scores[key]))
    given_text = walk_all(walked["text_accept"], k).mean_acceptance_length
    chained_beta = walk_all(walked["beta"], k).mean_acceptance_length
    assert given_text == pytest.approx(real, abs=0.025)
    assert abs(chained_beta - real) > 0.025


def test_a_draft_models_exact_rejection_entry_walks_the_acceptance_given_the_text():
    """Text whose every token the drafter would have drafted as emitted (min(1, q/p) = 1) while
    beta is 0.5: the rejection entry's lengths and its replayed sequences come from the former
    (k + 1 tokens per step), its per-request statistics (token_beta_mean) from beta."""
    from specsim.profiling.acceptance_measure import AcceptanceResult, _add_entry
    from specsim.profiling.specs import DrafterArg

    n = 64
    rows = {
        "beta": [np.full(n, 0.5)] * 3,
        "text_accept": [np.ones(n)] * 3,
        "match": [np.zeros(n)] * 3,
        "typical": [np.full(n, 0.5)] * 3,
        "typical_tv": [np.zeros(n)] * 3,
    }
    result = AcceptanceResult(entries=[])
    _add_entry(result, DrafterArg("d", "model"), "rejection", 1.0, rows, "p")
    entry = result.entries[0]
    assert entry["mean_acceptance_length"] == {k: pytest.approx(k + 1) for k in range(1, 9)}
    assert entry["token_beta_mean"] == pytest.approx(0.5)
    assert {float(v) for v in result.side_files["p.d.rejection.T1.txt"].split()} == {1.0}
    # Prompt lookup: proposals of 8 everywhere, every one the text's token, beta 0.5.
    rows["drafts"] = [np.full(n, 8)] * 3
    for key in ("beta", "text_accept", "typical"):
        rows[key] = [np.full((n, 8), v[0]) for v in rows[key]]
    _add_entry(result, DrafterArg("lookup", "ngram", 3), "rejection", 1.0, rows, None)
    assert result.entries[1]["mean_acceptance_length"][4] == pytest.approx(5.0)
