"""The tree verifiers on hand-built trees, on chains (bit for bit against the chain verifiers),
batched against row by row, and on bad input."""

from __future__ import annotations

import pytest
import torch

from specsim.sampling import (
    SamplingInputError,
    VerifierRandomness,
    draw_randomness,
    process_logits,
    sample_from_probs,
    verify_greedy,
    verify_rejection,
    verify_typical,
)
from specsim.sampling.tree_controls import TREE_CONTROLS
from specsim.sampling.tree_verifiers import (
    verify_tree_greedy,
    verify_tree_rejection,
    verify_tree_typical,
    verify_tree_without_replacement,
)
from specsim.tree import TreeShape

TREE_VERIFIERS = [
    verify_tree_rejection,
    verify_tree_without_replacement,
    verify_tree_greedy,
    verify_tree_typical,
]
TWO_CHILDREN = TreeShape.parse("2")  # the root's two children, leaves


def uniforms(accept, sample):
    return VerifierRandomness(
        torch.tensor([accept], dtype=torch.float64), torch.tensor([sample], dtype=torch.float64)
    )


def root_with_two_children(p_root, q_root, tokens, leaf_p=(0.0, 0.0, 1.0)):
    """One row: p and q at the root, both children's p = leaf_p (q there is not read)."""
    p = torch.tensor([[p_root, leaf_p, leaf_p]], dtype=torch.float64)
    q = torch.tensor([[q_root, q_root, q_root]], dtype=torch.float64)
    return p, q, torch.tensor([tokens])


# ---- the rules, decided by hand -----------------------------------------------------------------


def test_iid_rule_updates_the_residual_after_a_rejected_sibling():
    # p(0)/q(0) = 0.4: u = 0.41 rejects child 0; p' = norm(max(0, p - q)) = [0, 1, 0], so child
    # 1 (token 2) has p'(2) = 0 and fails too; the final token comes from p': token 1.
    p, q, d = root_with_two_children([0.2, 0.5, 0.3], [0.5, 0.2, 0.3], [0, 2])
    out = verify_tree_rejection(p, q, d, TWO_CHILDREN, uniforms([0.41, 0.0], 0.0))
    assert out.accepted.tolist() == [0] and out.tokens.tolist() == [[1, -1]]
    # Without the update (the stale-residual control) child 1 passes: p(2)/q(2) = 1.
    stale = TREE_CONTROLS["tree-stale-residual"].verifier
    bug = stale(p, q, d, TWO_CHILDREN, uniforms([0.41, 0.0], 0.0))
    assert bug.accepted.tolist() == [1] and bug.path.tolist() == [[1]]
    # u = 0.39 accepts child 0; the bonus comes from p after node 0 (one-hot at 2).
    first = verify_tree_rejection(p, q, d, TWO_CHILDREN, uniforms([0.39, 0.99], 0.5))
    assert first.path.tolist() == [[0]] and first.tokens.tolist() == [[0, 2]]


def test_without_replacement_rule_tests_the_second_child_against_q_without_the_first():
    # Child 0 (token 0): p/q = 0.6, u = 0.7 rejects; p' = [0, .75, .25]. Child 1 (token 2): the
    # i.i.d. rule tests against q: .25/.25 = 1, accepted; without replacement q_2 = [0, .5, .5]:
    # .25/.5 = .5 < u = .7, rejected, and p'' = norm(max(0, p' - q_2)) = [0, 1, 0] gives token 1.
    p, q, d = root_with_two_children([0.3, 0.4, 0.3], [0.5, 0.25, 0.25], [0, 2])
    u = uniforms([0.7, 0.7], 0.3)
    iid = verify_tree_rejection(p, q, d, TWO_CHILDREN, u)
    assert iid.path.tolist() == [[1]] and iid.tokens.tolist() == [[2, 2]]
    wor = verify_tree_without_replacement(p, q, d, TWO_CHILDREN, u)
    assert wor.accepted.tolist() == [0] and wor.tokens.tolist() == [[1, -1]]
    # u = 0.45 < .5 accepts child 1 under both rules.
    both = uniforms([0.7, 0.45], 0.3)
    assert verify_tree_without_replacement(p, q, d, TWO_CHILDREN, both).path.tolist() == [[1]]


def test_deterministic_drafter_removes_each_rejected_child_from_the_residual():
    # Point-mass proposals: child 0 (token 1) passes iff u < p(1) = .5; once rejected, p' = p
    # without token 1 = [.4, 0, .6], so child 1 (token 2) passes iff u < .6, and after that
    # p'' = [1, 0, 0] gives token 0.
    p, _, d = root_with_two_children([0.2, 0.5, 0.3], [0.5, 0.2, 0.3], [1, 2])
    for verify in (verify_tree_rejection, verify_tree_without_replacement):
        assert verify(p, None, d, TWO_CHILDREN, uniforms([0.49, 0.0], 0.0)).path.tolist() == [[0]]
        assert verify(p, None, d, TWO_CHILDREN, uniforms([0.51, 0.59], 0.0)).path.tolist() == [[1]]
        out = verify(p, None, d, TWO_CHILDREN, uniforms([0.51, 0.61], 0.99))
        assert out.tokens.tolist() == [[0, -1]]


def test_greedy_follows_the_first_argmax_child_at_every_depth():
    tree = TreeShape.parse("[[0], [1], [0, 0], [1, 0]]")
    # Root argmax 1: children tokens (2, 1) -> node 1; after node 1 argmax 0: node 3 (token 0)
    # matches; node 3 is a leaf: the bonus is argmax there (2).
    rows = [[0.1, 0.8, 0.1], [0.1, 0.1, 0.8], [0.6, 0.3, 0.1], [0.1, 0.2, 0.7], [0.7, 0.2, 0.1]]
    p = torch.tensor([rows], dtype=torch.float64)
    out = verify_tree_greedy(p, None, torch.tensor([[2, 1, 0, 0]]), tree)
    assert out.path.tolist() == [[1, 3]] and out.tokens.tolist() == [[1, 0, 0]]
    # Node 3's token 2 does not match argmax 0: stop at node 1 and emit argmax 0.
    out = verify_tree_greedy(p, None, torch.tensor([[2, 1, 0, 2]]), tree)
    assert out.path.tolist() == [[1, -1]] and out.tokens.tolist() == [[1, 0, -1]]
    # Both children are argmax 1: the first (node 0) is taken, though node 1's subtree matches
    # deeper; after node 0 argmax is 2, not node 2's token 0: emit 2.
    out = verify_tree_greedy(p, None, torch.tensor([[1, 1, 0, 0]]), tree)
    assert out.path.tolist() == [[0, -1]] and out.tokens.tolist() == [[1, 2, -1]]


def test_typical_takes_the_first_passing_child_and_argmax_where_none_passes():
    # p = [.3, .3, .4] at the root: H = 1.09 nats, threshold min(.09, .3 exp(-H) = .101) = .09,
    # so child 0 (p = .3) passes first. Sharp p: tokens 0 and 1 (p = .01) fail -> argmax 2.
    p = torch.tensor([[[0.3, 0.3, 0.4], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]], dtype=torch.float64)
    out = verify_tree_typical(p, None, torch.tensor([[0, 2]]), TWO_CHILDREN, uniforms([0, 0], 0))
    assert out.path.tolist() == [[0]]  # .3 > .1: child 0 passes first
    sharp = torch.tensor([[[0.01, 0.01, 0.98], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]])
    out = verify_tree_typical(sharp.double(), None, torch.tensor([[0, 1]]), TWO_CHILDREN,
                              uniforms([0, 0], 0))  # fmt: skip
    assert out.accepted.tolist() == [0] and out.tokens.tolist() == [[2, -1]]


# ---- chains, batches, invariants -----------------------------------------------------------------


def random_tree_step(tree, batch=32, vocab=11, seed=0, deterministic=False):
    gen = torch.Generator().manual_seed(seed)
    n = tree.num_nodes
    p = process_logits(torch.randn(batch, n + 1, vocab, generator=gen) * 2)
    q = process_logits(torch.randn(batch, n + 1, vocab, generator=gen) * 2)
    draft = sample_from_probs(q[:, :n], torch.rand(batch, n, generator=gen, dtype=torch.float64))
    return p, None if deterministic else q, draft, draw_randomness(gen, batch, n)


CHAIN_TWINS = [
    (verify_rejection, verify_tree_rejection),
    (verify_rejection, verify_tree_without_replacement),
    (verify_greedy, verify_tree_greedy),
    (verify_typical, verify_tree_typical),
]


@pytest.mark.parametrize("chain, tree_verify", CHAIN_TWINS)
@pytest.mark.parametrize("deterministic", [False, True])
def test_a_chain_shape_gives_the_chain_verifier_bit_for_bit(chain, tree_verify, deterministic):
    """On TreeShape.chain(k) with the same uniforms: equal tokens and counts in float32, over
    8 seeds x 64 rows (rejections at every position, and full windows)."""
    k, tree = 4, TreeShape.chain(4)
    for seed in range(8):
        p, q, draft, randomness = random_tree_step(tree, batch=64, seed=seed)
        q_chain = None if deterministic else q[:, :k]
        q_tree = None if deterministic else q
        ours = tree_verify(p, q_tree, draft, tree, randomness)
        theirs = chain(p, q_chain, draft, None, randomness)
        assert torch.equal(ours.tokens, theirs.tokens)
        assert torch.equal(ours.accepted, theirs.accepted)
        assert torch.equal(ours.path >= 0, theirs.accepted_mask)


@pytest.mark.parametrize("verify", TREE_VERIFIERS)
def test_batched_equals_row_by_row_and_outputs_are_tree_paths(verify):
    tree = TreeShape.parse("[[0], [1], [2], [0, 0], [0, 1], [2, 0], [0, 0, 0]]")
    p, q, draft, randomness = random_tree_step(tree, batch=48, vocab=7, seed=3)
    out = verify(p, q, draft, tree, randomness)
    for b in range(48):
        one = verify(p[b : b + 1], q[b : b + 1], draft[b : b + 1], tree, randomness.rows(b))
        assert torch.equal(one.tokens[0], out.tokens[b]) and torch.equal(one.path[0], out.path[b])
    parents = torch.from_numpy(tree.parents)
    for b in range(48):
        path = out.path[b, : out.accepted[b]].tolist()
        assert [int(parents[n]) for n in path] == [-1, *path][: len(path)]
        assert out.tokens[b, : out.accepted[b]].tolist() == draft[b, path].tolist()
        assert (
            out.tokens[b, out.accepted[b]] >= 0
            and (out.tokens[b, out.accepted[b] + 1 :] == -1).all()
        )
        assert int(out.last_node[b]) == (path[-1] if path else -1)
    assert (out.accepted > 0).any() and (out.accepted < tree.depth).any()


def test_deterministic_drafter_makes_both_exact_rules_agree():
    tree = TreeShape.parse("3,2")
    p, _, draft, randomness = random_tree_step(tree, batch=64, seed=5, deterministic=True)
    a = verify_tree_rejection(p, None, draft, tree, randomness)
    b = verify_tree_without_replacement(p, None, draft, tree, randomness)
    assert torch.equal(a.tokens, b.tokens)


BAD = {
    "p rows": lambda p, q, d, t, r: (p[:, :-1], q, d, t, r),
    "q shape": lambda p, q, d, t, r: (p, q[:, :-1], d, t, r),
    "drafts shape": lambda p, q, d, t, r: (p, q, d[:, :-1], t, r),
    "token range": lambda p, q, d, t, r: (p, q, d + 100, t, r),
    "logits": lambda p, q, d, t, r: (p.log(), q, d, t, r),
    "tree type": lambda p, q, d, t, r: (p, q, d, [[0], [1]], r),
    "uniforms": lambda p, q, d, t, r: (p, q, d, t, VerifierRandomness(r.accept[:, :1], r.sample)),
    "no uniforms": lambda p, q, d, t, r: (p, q, d, t, None),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_raises_a_clear_error(case):
    tree = TreeShape.parse("2,1")
    p, q, draft, randomness = random_tree_step(tree, batch=4, seed=1)
    with pytest.raises(SamplingInputError):
        verify_tree_rejection(*BAD[case](p, q, draft, tree, randomness))
