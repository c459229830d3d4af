"""Scores of tree children drafted without replacement (``profiling.tree_without_replacement``).

- Against exact enumeration of every ordered draw of the children, following the verifier's rule
  step by step on explicit vectors (an implementation that shares nothing with the closed form):
  ranks 0..2 to rounding, the estimated rank 3 within its stated standard error.
- Against the sampling core's verifier itself (``verify_tree_without_replacement``) by
  simulation on a 6-token vocabulary, with two planted scoring errors that must fail it.
- The estimate is seeded: the same seed gives the same scores.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from specsim.profiling import tree_without_replacement as wor
from specsim.profiling.tree_scoring import iid_accept
from specsim.profiling.tree_without_replacement import REPLICATES, without_replacement_accept
from specsim.tree import TreeShape


def verifier_by_enumeration(p: np.ndarray, q: np.ndarray, children: int) -> np.ndarray:
    """[V, children]: P(child r accepted holding t) / p(t) over every ordered draw of the
    children without replacement: child j from q without the earlier tokens, accepted with
    min(1, p'(x) / q'(x)); on a rejection p' <- norm(max(0, p' - q')), x leaves q'."""
    joint = np.zeros((len(p), children))
    for draws in itertools.permutations(range(len(p)), children):
        prob, left = 1.0, 1.0
        for x in draws:
            prob, left = prob * q[x] / left, left - q[x]
        residual, proposal, reach = p.copy(), q.copy(), prob
        for rank, x in enumerate(draws):
            accept = min(1.0, residual[x] / proposal[x])
            joint[x, rank] += reach * accept
            reach *= 1.0 - accept
            rest = np.maximum(residual - proposal, 0.0)
            residual = rest / rest.sum() if rest.sum() > 0 else rest
            proposal = proposal.copy()
            proposal[x] = 0.0
            proposal /= proposal.sum()
    return joint / p[:, None]


def pair(seed: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng(seed)
    p_logits = rng.normal(size=vocab) * 0.8
    q_logits = rng.normal(size=vocab) * 1.8
    return torch.from_numpy(p_logits), torch.from_numpy(q_logits)


def scores(p_logits, q_logits, width, seed=0, samples=wor.SAMPLES):
    vocab = len(p_logits)
    rows = p_logits.expand(vocab, -1), q_logits.expand(vocab, -1)
    generator = torch.Generator().manual_seed(seed)
    return without_replacement_accept(*rows, 1.0, list(range(vocab)), width, generator, samples)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_scores_equal_an_enumeration_of_every_draw(seed):
    p_logits, q_logits = pair(seed, 6)
    p, q = torch.softmax(p_logits, 0).numpy(), torch.softmax(q_logits, 0).numpy()
    expected = verifier_by_enumeration(p, q, 5)
    np.testing.assert_allclose(scores(p_logits, q_logits, 3), expected[:, :3], atol=1e-12)
    # Ranks 3 and 4 are estimated: 8 replicates of 512 histories per token (seed 0); each
    # cell's pooled estimate is within 4 of its standard errors.
    got = scores(p_logits, q_logits, 5, samples=4096)
    assert got.shape == (REPLICATES, 6, 5)
    np.testing.assert_allclose(got[0, :, :3], expected[:, :3], atol=1e-12)
    pooled, error = got.mean(0), got.std(0, ddof=1) / np.sqrt(REPLICATES)
    assert np.all(np.abs(pooled - expected)[:, 3:] <= 4 * error[:, 3:] + 1e-12)


def simulate_verifier(p, q, children: int, rows: int, seed: int) -> np.ndarray:
    """[V, children]: the frequency of (child r accepted, its token t) over ``rows`` runs of
    the sampling core's verifier on one node, children drawn from q without replacement."""
    from specsim.sampling.randomness import draw_randomness
    from specsim.sampling.tree_verifiers import verify_tree_without_replacement

    generator = torch.Generator().manual_seed(seed)
    shape, vocab = TreeShape.parse(str(children)), len(p)
    drafts = torch.multinomial(q.expand(rows, -1), children, replacement=False, generator=generator)
    p_rows = p.expand(rows, shape.num_nodes + 1, vocab)
    q_rows = q.expand(rows, shape.num_nodes + 1, vocab)
    randomness = draw_randomness(generator, rows, shape.num_nodes)
    result = verify_tree_without_replacement(
        p_rows, q_rows, drafts, shape, randomness, validate=False
    )
    seen = np.zeros((vocab, children))
    accepted = result.accepted == 1
    np.add.at(seen, (result.tokens[accepted, 0].numpy(), result.path[accepted, 0].numpy()), 1)
    return seen / rows


def worst_z(seen: np.ndarray, scored: np.ndarray, p: np.ndarray, rows: int) -> float:
    """The largest |frequency - scored joint| in its binomial standard errors."""
    expected = scored * p[:, None]
    error = np.sqrt(np.maximum(expected * (1 - expected), 1e-12) / rows)
    return float(np.max(np.abs(seen - expected) / error))


def test_the_scores_agree_with_the_sampling_cores_verifier(monkeypatch):
    # 400,000 runs of one node with four children (seed 5) on 6 tokens: each cell's frequency
    # has a standard error <= 0.0008; the scores must lie within 5 of them (rank 3: estimated
    # from 4096 histories, its own error some 1e-4). Two planted errors, each off by tens of
    # standard errors in some cell, must fail: the proposal never renormalised (SpecInfer's
    # i.i.d. scores), and the residual updated with q instead of the renormalised q_j.
    rows, children = 400_000, 4
    p_logits, q_logits = pair(5, 6)
    p, q = torch.softmax(p_logits, 0), torch.softmax(q_logits, 0)
    seen = simulate_verifier(p, q, children, rows, seed=5)
    scored = scores(p_logits, q_logits, children, samples=4096).mean(0)
    assert worst_z(seen, scored, p.numpy(), rows) < 5
    tokens = list(range(6))
    rows_6 = p_logits.expand(6, -1), q_logits.expand(6, -1)
    iid = iid_accept(*rows_6, 1.0, tokens, children)
    assert worst_z(seen, iid, p.numpy(), rows) > 10
    monkeypatch.setattr(wor.WithoutReplacement, "next_theta", lambda self, h: h.theta + h.mass)
    stale = scores(p_logits, q_logits, children, samples=4096).mean(0)
    assert worst_z(seen, stale, p.numpy(), rows) > 10


def test_the_estimate_is_seeded():
    p_logits, q_logits = pair(7, 6)
    first, again = scores(p_logits, q_logits, 4, seed=3), scores(p_logits, q_logits, 4, seed=3)
    np.testing.assert_array_equal(first, again)
    other = scores(p_logits, q_logits, 4, seed=4)
    assert not np.array_equal(first[..., 3], other[..., 3])
    np.testing.assert_array_equal(first[..., :3], other[..., :3])  # the exact ranks


def test_wide_nodes_over_a_real_vocabulary_are_left_out_with_a_warning():
    """A node of 3 children over 4,096 tokens would need [4096, 4096] doubles per position for
    the exact rank-2 sum: the entries are left out (said once), the other draftings kept; 2
    children need no such sum."""
    from types import SimpleNamespace

    from specsim.profiling.tree_measure import tree_entries
    from specsim.profiling.tree_without_replacement import affordable
    from specsim.tree import TreeShape

    assert affordable(258, 4) and affordable(150_000, 2) and not affordable(4_096, 3)
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 4_096, generator=generator)
    text = SimpleNamespace(logits=logits, tokens=[1, 2, 3, 4, 5, 6])
    with pytest.warns(UserWarning, match="without-replacement tree entries left out"):
        entries = tree_entries(
            "d", [logits.roll(1, -1)], [text], 1.0, ["rejection"], [TreeShape.parse("3,1")]
        )
    assert {e["drafts"] for e in entries} == {"top-k", "iid"}
