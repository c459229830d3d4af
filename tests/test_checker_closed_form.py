"""The closed-form reference: exact output distributions of every verifier and control.

Exact (float64) tests: no sampling, no tolerance beyond rounding (1e-12).
"""

from __future__ import annotations

import functools
import itertools

import numpy as np
import pytest

from specsim.sampling import reference as ref
from specsim.sampling.checker import check_sampler
from specsim.sampling.controls import CONTROLS
from specsim.sampling.problem import Processing, ToyModels

EXACT = 1e-12


def closed_form(
    vocab, k, rule, processing=None, drafter="sample", ragged=False, raw=False, seed=None
):
    processing = processing or Processing()
    models = ToyModels.make(vocab, seed=vocab + k if seed is None else seed)
    tables = models.tables(processing, drafter, verify_with_raw_q=raw)
    counts = tuple(range(k + 1)) if ragged else (k,)
    produced = ref.first_tokens_distribution(tables, models.prompt, counts, rule, k + 1)
    return produced, models, tables


CONFIGS = [
    # (vocab, k, processing, drafter, ragged)
    (2, 1, Processing(), "sample", False),
    (5, 2, Processing(), "sample", False),
    (7, 3, Processing(0.7, 3, 1.0), "sample", True),
    (9, 4, Processing(1.4, 0, 0.8), "greedy", False),
    (16, 3, Processing(), "sample", False),
    (16, 2, Processing(1.0, 5, 0.9), "sample", True),
    (6, 3, Processing(0.0, 0, 1.0), "sample", False),
    (6, 3, Processing(), "greedy", True),
]


@pytest.mark.parametrize("config", CONFIGS, ids=str)
def test_rejection_matches_the_target_exactly(config):
    vocab, k, processing, drafter, ragged = config
    produced, models, tables = closed_form(vocab, k, ref.REJECTION, processing, drafter, ragged)
    target = ref.target_distribution(tables.p, models.prompt, k + 1)
    assert produced.shape == (vocab,) * (k + 1)  # the whole window, bonus token included
    assert np.abs(produced - target).max() <= EXACT
    assert produced.sum() == pytest.approx(1.0, abs=EXACT)


@pytest.mark.parametrize("config", CONFIGS, ids=str)
def test_greedy_matches_target_greedy_decoding_exactly(config):
    vocab, k, processing, drafter, ragged = config
    produced, models, tables = closed_form(vocab, k, ref.GREEDY, processing, drafter, ragged)
    greedy_target = ref.target_distribution(tables.p, models.prompt, k + 1, greedy=True)
    assert np.abs(produced - greedy_target).max() <= EXACT
    assert greedy_target.max() == 1.0  # a single path
    if processing.temperature != 0:
        # ... and it is not sampling from p: the reference matters.
        sampled = ref.target_distribution(tables.p, models.prompt, k + 1)
        assert ref.total_variation(produced, sampled) > 0.1


def test_typical_is_lossy_and_its_distance_is_reported():
    produced, models, tables = closed_form(8, 3, ref.TYPICAL)
    tv = ref.total_variation(produced, ref.target_distribution(tables.p, models.prompt, 4))
    assert tv > 0.05
    report = check_sampler("typical", vocab=8, k=3, samples=0, problem_seed=11)
    assert report.lossless is False and report.lossy_by_design is True
    assert report.tv_distance > 0.05
    assert report.closed_form_max_abs_error > EXACT


@pytest.mark.parametrize("name", sorted(CONTROLS))
def test_every_negative_control_is_lossy_in_closed_form(name):
    # Top-k 5 of 8 so that raw and processed q differ. Whether a bug shows depends on the
    # problem (a shared uniform is invisible where acceptance is 0 or 1) and on the tokens
    # judged (a stale bonus only in token k + 1), so the whole window of the checker's default
    # problem (problem seed 0, k 3) is judged.
    control = CONTROLS[name]
    processing = Processing(1.0, 5, 1.0)
    produced, models, tables = closed_form(
        8, 3, control.rule, processing, raw=control.verify_with_raw_q, seed=0
    )
    tv = ref.total_variation(produced, ref.target_distribution(tables.p, models.prompt, 4))
    assert tv > 5e-3, f"{name}: TV {tv}"
    report = check_sampler(name, vocab=8, k=3, samples=0, top_k=5)
    assert report.lossless is False and report.tv_distance > 1e-3


@pytest.mark.parametrize(
    "rule",
    [ref.REJECTION, ref.GREEDY, ref.TYPICAL] + [c.rule for c in CONTROLS.values()],
    ids=lambda r: r.name,
)
@pytest.mark.parametrize("n", [0, 1, 2, 4])
def test_a_step_emits_a_proper_distribution(rule, n):
    models = ToyModels.make(6, seed=1)
    parts = ref.step_distribution(models.tables(Processing()), models.prompt, n, rule)
    assert [part.ndim for part in parts] == list(range(1, n + 2))
    assert min(float(part.min()) for part in parts) >= 0
    assert sum(float(part.sum()) for part in parts) == pytest.approx(1.0, abs=EXACT)


# ---- the enumerator checked against a direct, loop-by-loop computation --------------------


def brute_force_window(tables, context, n, rule):
    """The first n + 1 emitted tokens (a whole window), summed over explicit draft paths and
    outcomes position by position, each short step continued by further steps (no shared
    arrays, no vectorisation)."""
    vocab = tables.vocab

    def dist(table, ctx):
        return table[ctx[-2], ctx[-1]]

    def step(ctx):
        """Yield (emitted sequence, probability) for every draft path and outcome."""
        for path in itertools.product(range(vocab), repeat=n):
            q_path, accepts, residuals, ps, c = 1.0, [], [], [], tuple(ctx)
            for x in path:
                p_here, q_here = dist(tables.p, c), dist(tables.q_verify, c)
                q_path *= dist(tables.q_draft, c)[x]
                accepts.append(rule.accept(p_here, q_here)[x])
                residuals.append(rule.residual(p_here, q_here))
                ps.append(p_here)
                c = (*c, x)
            bonus = rule.bonus(ps[-1] if rule.stale_bonus and n else dist(tables.p, c))
            survive = 1.0
            for j in range(n + 1):
                if j == n:
                    for y in range(vocab):
                        yield (*path, y), q_path * survive * bonus[y]
                    break
                if rule.shared_uniform:
                    next_survive = min(survive, accepts[j]) if j else accepts[0]
                else:
                    next_survive = survive * accepts[j]
                for y in range(vocab):
                    yield (*path[:j], y), q_path * (survive - next_survive) * residuals[j][y]
                survive = next_survive

    @functools.cache
    def first(ctx, m):
        out = np.zeros((vocab,) * m)
        for seq, prob in step(ctx):
            if len(seq) >= m:
                out[seq[:m]] += prob
            else:
                out[seq] += prob * first((*ctx, *seq)[-2:], m - len(seq))
        return out

    return first(tuple(context), n + 1)


@pytest.mark.parametrize(
    "rule", [ref.REJECTION, ref.TYPICAL, *(c.rule for c in CONTROLS.values())], ids=lambda r: r.name
)
@pytest.mark.parametrize("n", [1, 2, 3])
def test_vectorised_enumeration_equals_brute_force(rule, n):
    models = ToyModels.make(3, seed=4)
    tables = models.tables(Processing(1.0, 2, 1.0))
    fast = ref.first_tokens_distribution(tables, models.prompt, (n,), rule, n_tokens=n + 1)
    slow = brute_force_window(tables, models.prompt, n, rule)
    np.testing.assert_allclose(fast, slow, atol=EXACT, rtol=0)
    # Fewer tokens are the window's marginals.
    two = ref.first_tokens_distribution(tables, models.prompt, (n,), rule, n_tokens=2)
    np.testing.assert_allclose(two, slow.sum(axis=tuple(range(2, n + 1))), atol=EXACT, rtol=0)


def test_closed_form_of_resample_from_p_matches_the_textbook_formula():
    # k = 1, first token: P(y) = q(y) min(1, p(y)/q(y)) + (1 - beta) p(y), beta = sum min(p, q).
    models = ToyModels.make(5, seed=2)
    tables = models.tables(Processing())
    a, b = models.prompt
    p, q = tables.p[a, b], tables.q_draft[a, b]
    beta = np.minimum(p, q).sum()
    expected = np.minimum(p, q) + (1 - beta) * p
    produced = ref.first_tokens_distribution(
        tables, models.prompt, (1,), CONTROLS["resample-p"].rule, n_tokens=1
    )
    np.testing.assert_allclose(produced, expected, atol=EXACT, rtol=0)
    assert np.abs(expected - p).max() > 1e-3  # and it is not p


def test_first_three_tokens_are_exact_too():
    models = ToyModels.make(4, seed=3)
    tables = models.tables(Processing(0.8, 0, 0.9))
    produced = ref.first_tokens_distribution(tables, models.prompt, (0, 1, 2), ref.REJECTION, 3)
    target = ref.target_distribution(tables.p, models.prompt, n_tokens=3)
    assert np.abs(produced - target).max() <= EXACT
