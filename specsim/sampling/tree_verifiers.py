"""Tree verification: one step over a drafted tree (``specsim.tree.TreeShape``), batched over rows.

The signature every tree verifier has (the engine's tree step calls it)::

    verify_tree_*(p, q, draft_tokens, tree, randomness, *, validate=True) -> TreeVerifyResult

- ``tree``: a ``TreeShape`` of N drafted nodes, breadth-first, depth D (shared by the batch);
- ``p`` ``[B, N+1, V]``: the target's processed probabilities. ``p[:, 0]`` is at the root (the
  next token after the last committed one), ``p[:, i+1]`` after node i given the path to it:
  what one verification pass over [last committed token, node 0, ..., node N-1] with the tree
  attention mask (``tree.ancestors``) gives;
- ``q`` ``[B, N+1, V]``: the drafter's processed probabilities in the same layout, ``q[:, 0]``
  the distribution the root's children were drafted from, ``q[:, i+1]`` node i's children's
  (leaf rows are not read), or ``None`` for a deterministic drafter (top-k children): each
  child's proposal is then a point mass on its own token;
- ``draft_tokens`` ``[B, N]`` int64: node i's token;
- ``active`` ``[B, N]`` bool, or ``None`` (every node): row b's own tree is its active nodes,
  each with its parent and earlier siblings active (a subtree of the shape: deeper levels or
  last ranks switched off, as ``n_drafts`` shortens a chain); an inactive node's token may be
  -1 and its rows of p and q are not read;
- ``randomness``: a ``VerifierRandomness`` with ``accept`` ``[B, N]`` (one uniform per node, for
  its accept test) and ``sample`` ``[B]`` (for the one token sampled where the walk stops):
  ``draw_randomness(generator, B, N)``.

It returns a ``TreeVerifyResult``: ``accepted`` ``[B]`` (nodes accepted, 0..D), ``path``
``[B, D]`` (the accepted node indices from the root down, padded with -1), ``tokens``
``[B, D+1]`` (the accepted drafts, then the corrected or bonus token, padded with -1); the engine
keeps the KV of ``path`` and appends ``tokens[b, : accepted[b] + 1]``.

Every verifier walks from the root: at a node it tries the children in rank order, moves to the
first one accepted and goes on from there; when none is accepted (or the node is a leaf) it emits
one token there and stops. On a chain (``TreeShape.chain(k)``) each verifier gives its chain
twin's result bit for bit for the same uniforms.
"""

from __future__ import annotations

import torch

from specsim.sampling.logits import sample_from_probs
from specsim.sampling.randomness import VerifierRandomness
from specsim.sampling.reference import TYPICAL_DELTA, TYPICAL_EPSILON
from specsim.sampling.tree_inputs import TreeVerifyResult, prepare_tree, rows_at
from specsim.sampling.tree_walks import ExactRule, pass_walk, rejection_walk
from specsim.tree import TreeShape

__all__ = [
    "TreeVerifyResult",
    "verify_tree_greedy",
    "verify_tree_rejection",
    "verify_tree_typical",
    "verify_tree_without_replacement",
]


def verify_tree_rejection(
    p: torch.Tensor,
    q: torch.Tensor | None,
    draft_tokens: torch.Tensor,
    tree: TreeShape,
    randomness: VerifierRandomness | None,
    *,
    active: torch.Tensor | None = None,
    validate: bool = True,
) -> TreeVerifyResult:
    """Multi-draft speculative sampling, children drawn i.i.d. from q at each node. Exact.

    SpecInfer's rule (Miao et al., 2024, "SpecInfer", section 4, token tree verification by
    multi-step speculative sampling): at a node with target p' = p and children x_1, x_2, ...
    in rank order, accept x_j with probability min(1, p'(x_j) / q(x_j)); after each rejection
    replace p' by norm(max(0, p' - q)); if every child fails, sample from the final p'. The
    output is distributed as p when the children were drawn i.i.d. from q. With ``q=None`` each
    child's proposal is a point mass on its token: accept with p'(x_j), then remove x_j from p'.
    """
    step = prepare_tree(p, q, draft_tokens, tree, randomness, validate, True, active)
    return rejection_walk(step, randomness, ExactRule("iid"))


def verify_tree_without_replacement(
    p: torch.Tensor,
    q: torch.Tensor | None,
    draft_tokens: torch.Tensor,
    tree: TreeShape,
    randomness: VerifierRandomness | None,
    *,
    active: torch.Tensor | None = None,
    validate: bool = True,
) -> TreeVerifyResult:
    """Multi-draft speculative sampling, children drawn from q without replacement. Exact.

    Recursive rejection sampling with the proposal updated as the drafts were drawn (Jeon et
    al., 2024, "Recursive Speculative Decoding", section 3, and Sequoia, Chen et al., 2024,
    section 3.2, its verification algorithm): the j-th child was drawn from q_j, q with the
    earlier siblings' tokens removed and renormalised. Accept x_j with min(1, p_j(x_j) /
    q_j(x_j)); on a rejection p_{j+1} = norm(max(0, p_j - q_j)) and q_{j+1} = q_j with x_j
    removed, renormalised; if every child fails, sample from the last p_j. Each stage is a
    rejection step of target p_j against the proposal x_j was really drawn from, so the output
    is distributed as p (a rejected x_j has p_j(x_j) < q_j(x_j), so p_{j+1}(x_j) = 0 and nothing
    is lost by never proposing it again). The top-k children of EAGLE-2 and Sequoia's
    deterministic trees are the ``q=None`` case: point-mass proposals, as ``verify_tree_rejection``.
    """
    step = prepare_tree(p, q, draft_tokens, tree, randomness, validate, True, active)
    return rejection_walk(step, randomness, ExactRule("without-replacement"))


def verify_tree_greedy(
    p: torch.Tensor,
    q: torch.Tensor | None,
    draft_tokens: torch.Tensor,
    tree: TreeShape,
    randomness: VerifierRandomness | None = None,
    *,
    active: torch.Tensor | None = None,
    validate: bool = True,
) -> TreeVerifyResult:
    """Greedy trees: follow the child whose token is argmax p at every depth (the first such
    child in rank order, as SGLang's greedy tree verification walks), then emit argmax p. The
    output equals target-only greedy decoding. q and ``randomness`` are ignored."""
    step = prepare_tree(p, q, draft_tokens, tree, randomness, validate, False, active)

    def decide(rows, at, kids, kid_tokens):
        p_rows = rows_at(step.p, rows, at)
        best = p_rows.argmax(dim=-1)
        return (kids >= 0) & (kid_tokens == best.unsqueeze(1)), best

    return pass_walk(step, decide)


def verify_tree_typical(
    p: torch.Tensor,
    q: torch.Tensor | None,
    draft_tokens: torch.Tensor,
    tree: TreeShape,
    randomness: VerifierRandomness | None,
    *,
    epsilon: float = TYPICAL_EPSILON,
    delta: float = TYPICAL_DELTA,
    active: torch.Tensor | None = None,
    validate: bool = True,
) -> TreeVerifyResult:
    """Medusa's typical acceptance over a tree. LOSSY: the output is NOT distributed as p.

    A child x passes if p(x) > min(epsilon, delta exp(-H(p))) with p the parent's target
    distribution (Cai et al., 2024, "Medusa", section 2.3.1). The walk takes the first passing
    child in rank order at each node (Medusa instead keeps the longest passing candidate path;
    the two differ only where two siblings pass, and both are lossy). Where no child passes it
    emits argmax p; at a leaf it samples the bonus token from p, as the chain verifier does.
    q is ignored.
    """
    step = prepare_tree(p, q, draft_tokens, tree, randomness, validate, True, active)
    tiny = torch.finfo(step.p.dtype).tiny

    def decide(rows, at, kids, kid_tokens):
        p_rows = rows_at(step.p, rows, at)
        entropy = -(p_rows * p_rows.clamp_min(tiny).log()).sum(dim=-1)
        threshold = torch.clamp(delta * torch.exp(-entropy), max=epsilon)
        p_x = p_rows.gather(1, kid_tokens.clamp(min=0))
        final = p_rows.argmax(dim=-1)
        leaf = kids[:, 0] < 0
        if bool(leaf.any()):
            u = randomness.sample[rows[leaf]]
            final[leaf] = sample_from_probs(p_rows[leaf], u, validate=False)
        return (kids >= 0) & (p_x > threshold.unsqueeze(1)), final

    return pass_walk(step, decide)
