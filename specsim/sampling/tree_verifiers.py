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

from dataclasses import dataclass

import torch

from specsim.sampling.logits import inverse_cdf, sample_from_probs
from specsim.sampling.reference import TYPICAL_DELTA, TYPICAL_EPSILON
from specsim.sampling.validation import (
    SamplingInputError,
    check_non_negative,
    check_row_sums,
    check_tokens,
    check_uniforms,
    require_float,
)
from specsim.tree import TreeShape


@dataclass(frozen=True)
class TreeVerifyResult:
    """What one tree step emitted, per row (see the module docstring)."""

    accepted: torch.Tensor  # [B] int64
    path: torch.Tensor  # [B, D] int64 node indices, -1 padded
    tokens: torch.Tensor  # [B, D+1] int64, -1 padded

    @property
    def emitted(self) -> torch.Tensor:
        return self.accepted + 1

    @property
    def last_node(self) -> torch.Tensor:
        """[B]: the node the walk stopped at (-1: the root)."""
        at = (self.accepted - 1).clamp(min=0).unsqueeze(1)
        return torch.where(self.accepted > 0, self.path.gather(1, at).squeeze(1), -1)


def verify_tree_rejection(p, q, draft_tokens, tree, randomness, *, validate=True):
    """Multi-draft speculative sampling, children drawn i.i.d. from q at each node. Exact.

    SpecInfer's rule (Miao et al., 2024, "SpecInfer", section 4.2, multi-step speculative
    sampling): at a node with target p' = p and children x_1, x_2, ... in rank order, accept x_j
    with probability min(1, p'(x_j) / q(x_j)); after each rejection replace p' by
    norm(max(0, p' - q)); if every child fails, sample from the final p'. The output is
    distributed as p when the children were drawn i.i.d. from q. With ``q=None`` each child's
    proposal is a point mass on its token: accept with p'(x_j), then remove x_j from p'.
    """
    step = _prepare(p, q, draft_tokens, tree, randomness, validate, True)
    return _rejection_walk(step, randomness, _ExactRule("iid"))


def verify_tree_without_replacement(p, q, draft_tokens, tree, randomness, *, validate=True):
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
    step = _prepare(p, q, draft_tokens, tree, randomness, validate, True)
    return _rejection_walk(step, randomness, _ExactRule("without-replacement"))


def verify_tree_greedy(p, q, draft_tokens, tree, randomness=None, *, validate=True):
    """Greedy trees: follow the child whose token is argmax p at every depth (the first such
    child in rank order, as SGLang's greedy tree verification walks), then emit argmax p. The
    output equals target-only greedy decoding. q and ``randomness`` are ignored."""
    step = _prepare(p, q, draft_tokens, tree, randomness, validate, False)

    def decide(rows, at, kids, kid_tokens):
        p_rows = _rows(step.p, rows, at)
        best = p_rows.argmax(dim=-1)
        return (kids >= 0) & (kid_tokens == best.unsqueeze(1)), best

    return _pass_walk(step, decide)


def verify_tree_typical(
    p,
    q,
    draft_tokens,
    tree,
    randomness,
    *,
    epsilon: float = TYPICAL_EPSILON,
    delta: float = TYPICAL_DELTA,
    validate=True,
):
    """Medusa's typical acceptance over a tree. LOSSY: the output is NOT distributed as p.

    A child x passes if p(x) > min(epsilon, delta exp(-H(p))) with p the parent's target
    distribution (Cai et al., 2024, "Medusa", section 2.3.1). The walk takes the first passing
    child in rank order at each node (Medusa instead keeps the longest passing candidate path;
    the two differ only where two siblings pass, and both are lossy). Where no child passes it
    emits argmax p; at a leaf it samples the bonus token from p, as the chain verifier does.
    q is ignored.
    """
    step = _prepare(p, q, draft_tokens, tree, randomness, validate, True)
    tiny = torch.finfo(step.p.dtype).tiny

    def decide(rows, at, kids, kid_tokens):
        p_rows = _rows(step.p, rows, at)
        entropy = -(p_rows * p_rows.clamp_min(tiny).log()).sum(dim=-1)
        threshold = torch.clamp(delta * torch.exp(-entropy), max=epsilon)
        p_x = p_rows.gather(1, kid_tokens.clamp(min=0))
        final = p_rows.argmax(dim=-1)
        leaf = kids[:, 0] < 0
        if bool(leaf.any()):
            u = randomness.sample[rows[leaf]]
            final[leaf] = sample_from_probs(p_rows[leaf], u, validate=False)
        return (kids >= 0) & (p_x > threshold.unsqueeze(1)), final

    return _pass_walk(step, decide)


# ----------------------------------------------------------------------------------------------
# Inputs.


@dataclass(frozen=True)
class TreeStep:
    """Validated inputs and the tree's tables."""

    p: torch.Tensor
    q: torch.Tensor | None
    draft: torch.Tensor
    tree: TreeShape
    kids: torch.Tensor  # [N+1, W]: row u+1 lists node u's children in rank order, -1 padded

    @property
    def depth(self) -> int:
        return self.tree.depth


def child_table(tree: TreeShape, device=None) -> torch.Tensor:
    """``[N+1, W]``: row u+1 holds node u's children (row 0 the root's), rank order, -1 padded."""
    lists = [tree.children(node) for node in range(-1, tree.num_nodes)]
    width = max(len(kids) for kids in lists)
    table = torch.full((len(lists), width), -1, dtype=torch.long)
    for row, kids in enumerate(lists):
        table[row, : len(kids)] = torch.tensor(kids, dtype=torch.long)
    return table.to(device)


def _prepare(p, q, draft_tokens, tree, randomness, validate, needs_uniforms) -> TreeStep:
    if not isinstance(tree, TreeShape):
        raise SamplingInputError(
            f"expected a TreeShape, got {type(tree).__name__}",
            key="tree",
            fix="pass specsim.tree.TreeShape.parse('2,2,1') or TreeShape.from_paths(...)",
        )
    n = tree.num_nodes
    require_float(p, "p", 3, f"p as [B, N+1, V] with N = {n} tree nodes")
    batch, rows, vocab = p.shape
    if rows != n + 1:
        raise SamplingInputError(
            f"expected {n + 1} rows per sequence (the root and {n} nodes), got {rows}",
            key="p",
            fix="p[:, 0] is at the root, p[:, i+1] after node i",
        )
    if not isinstance(draft_tokens, torch.Tensor) or tuple(draft_tokens.shape) != (batch, n):
        shape = tuple(getattr(draft_tokens, "shape", ()))
        raise SamplingInputError(
            f"expected shape {(batch, n)}, got {shape}", key="draft_tokens", fix="one per node"
        )
    if q is not None:
        require_float(q, "q", 3, "q as [B, N+1, V], or None for a deterministic drafter")
        if tuple(q.shape) != tuple(p.shape):
            raise SamplingInputError(
                f"expected shape {tuple(p.shape)} like p, got {tuple(q.shape)}",
                key="q",
                fix="q[:, 0] is what the root's children were drafted from, q[:, i+1] node i's",
            )
    kids = child_table(tree, p.device)
    if validate:
        check_tokens(draft_tokens, vocab, "draft_tokens")
        check_row_sums(p, "p")
        # p(x) and q(x) of every node at its parent's row: what the accept tests read.
        at = (torch.as_tensor(tree.parents, device=p.device) + 1).unsqueeze(0)
        row = torch.arange(batch, device=p.device).unsqueeze(1)
        x = draft_tokens.long()
        check_non_negative(p[row, at, x], "p")
        if q is not None:
            check_row_sums(q, "q", (kids[:, 0] >= 0).expand(batch, -1))
            check_non_negative(q[row, at, x], "q")
    if needs_uniforms:
        if randomness is None:
            raise SamplingInputError(
                "this verifier needs its random numbers",
                key="randomness",
                fix="pass draw_randomness(generator, B, N) for N tree nodes",
            )
        if validate:
            check_uniforms(randomness.accept, "randomness.accept", (batch, n))
            check_uniforms(randomness.sample, "randomness.sample", (batch,))
    return TreeStep(p, q, draft_tokens.long(), tree, kids)


def _rows(x: torch.Tensor, rows: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
    """``x[rows, at]`` as a fresh ``[R, V]`` tensor."""
    if not x.is_contiguous():
        return x[rows, at]
    return x.view(-1, x.shape[-1]).index_select(0, rows * x.shape[1] + at)


# ----------------------------------------------------------------------------------------------
# The walks.


class _Result:
    """Accumulates the walk's path and final tokens."""

    def __init__(self, step: TreeStep):
        batch, depth = step.draft.shape[0], step.depth
        device = step.draft.device
        self.node = torch.full((batch,), -1, dtype=torch.long, device=device)
        self.path = torch.full((batch, depth), -1, dtype=torch.long, device=device)
        self.accepted = torch.zeros(batch, dtype=torch.long, device=device)
        self.final = torch.zeros(batch, dtype=torch.long, device=device)

    def move(self, rows, children, level):
        self.node[rows] = children
        self.path[rows, level] = children
        self.accepted[rows] += 1

    def assemble(self, step: TreeStep) -> TreeVerifyResult:
        batch, depth = self.path.shape
        tokens = torch.full((batch, depth + 1), -1, dtype=torch.long, device=self.path.device)
        drafted = step.draft.gather(1, self.path.clamp(min=0))
        tokens[:, :depth] = torch.where(self.path >= 0, drafted, -1)
        tokens.scatter_(1, self.accepted.unsqueeze(1), self.final.unsqueeze(1))
        return TreeVerifyResult(self.accepted, self.path, tokens)


def _pass_walk(step: TreeStep, decide) -> TreeVerifyResult:
    """Walk where each child passes or fails on its own (greedy, typical): ``decide(rows, at,
    kids, kid_tokens)`` returns the pass mask ``[R, W]`` and the token each row emits if it
    stops there."""
    out = _Result(step)
    live = torch.arange(step.draft.shape[0], device=step.draft.device)
    for level in range(step.depth + 1):
        if live.numel() == 0:
            break
        at = out.node[live] + 1
        kids = step.kids[at]
        kid_tokens = step.draft[live.unsqueeze(1), kids.clamp(min=0)]
        passed, final = decide(live, at, kids, kid_tokens)
        has = passed.any(dim=1)
        first = passed.to(torch.int8).argmax(dim=1)
        out.final[live[~has]] = final[~has]
        live, chosen = live[has], kids[has, first[has]]
        if level < step.depth:
            out.move(live, chosen, level)
    return out.assemble(step)


@dataclass(frozen=True)
class _ExactRule:
    """The exact walk's variants: the proposal update, and the two planted bugs of the tree
    controls (``tree_controls``)."""

    proposal: str  # "iid": q as drafted; "without-replacement": earlier siblings removed
    update_residual: bool = True  # False: siblings are all tested against the node's p
    sibling_uniform: bool = False  # True: every sibling reuses the first sibling's uniform


def first_sibling(tree: TreeShape) -> torch.Tensor:
    """[N]: the index of each node's rank-0 sibling."""
    index = {path: i for i, path in enumerate(tree.paths)}
    return torch.tensor([index[(*path[:-1], 0)] for path in tree.paths], dtype=torch.long)


def _rejection_walk(step: TreeStep, randomness, rule: _ExactRule) -> TreeVerifyResult:
    """Recursive rejection sampling down the tree, one level at a time for every live row.

    At a node the residual p' (and, without replacement, the proposal q') is kept unnormalised
    with its mass, and materialised only once a child there is rejected; until then the test
    reads p(x) and q(x) alone, so on a chain it is the chain verifier's test bit for bit.
    """
    p, q, draft = step.p, step.q, step.draft
    accept = randomness.accept
    if rule.sibling_uniform:
        accept = accept[:, first_sibling(step.tree).to(accept.device)]
    out = _Result(step)
    live = torch.arange(draft.shape[0], device=draft.device)
    for level in range(step.depth + 1):
        if live.numel() == 0:
            break
        at = out.node[live] + 1
        state = _NodeState(p, q, live, at)
        moved = torch.full_like(live, -1)
        kids = step.kids[at]
        for rank in range(kids.shape[1]):
            trying = ((kids[:, rank] >= 0) & (moved < 0)).nonzero().squeeze(-1)
            if trying.numel() == 0:
                break
            child = kids[trying, rank]
            x = draft[live[trying], child]
            ok = state.test(trying, x, accept[live[trying], child], rule)
            moved[trying[ok]] = child[ok]
            state.reject(trying[~ok], x[~ok], rule)
        stopped = moved < 0
        if bool(stopped.any()):
            index = stopped.nonzero().squeeze(-1)
            out.final[live[index]] = state.sample(index, randomness.sample[live[index]], rule)
        live, moved = live[~stopped], moved[~stopped]
        if level < step.depth:
            out.move(live, moved, level)
    return out.assemble(step)


class _NodeState:
    """Per live row at its current node: the residual target p' and proposal q', unnormalised
    with their masses, built from the node's rows of p and q on the first rejection."""

    def __init__(self, p, q, rows, at):
        self.p, self.q, self.rows, self.at = p, q, rows, at
        count, vocab = rows.numel(), p.shape[-1]
        self.touched = torch.zeros(count, dtype=torch.bool, device=p.device)
        self.res_p = torch.zeros((count, vocab), dtype=p.dtype, device=p.device)
        self.res_q = torch.zeros_like(self.res_p) if q is not None else None
        self.p_mass = torch.ones(count, dtype=torch.float64, device=p.device)
        self.q_mass = torch.ones_like(self.p_mass)

    def _at_x(self, source, residual, index, x):
        fresh = source[self.rows[index], self.at[index], x]
        return torch.where(self.touched[index], residual[index, x], fresh)

    def _proposal_at_x(self, index, x, rule):
        if self.q is None:
            return torch.ones(x.shape, dtype=torch.float64, device=x.device)
        if rule.proposal == "iid":
            return self.q[self.rows[index], self.at[index], x].double()
        return self._at_x(self.q, self.res_q, index, x).double()

    def test(self, index, x, u, rule) -> torch.Tensor:
        """u q'(x) < p'(x), cross-multiplied by the masses; float64, as the chain's test."""
        p_x = self._at_x(self.p, self.res_p, index, x).double()
        q_x = self._proposal_at_x(index, x, rule)
        q_mass = self.q_mass[index] if rule.proposal == "without-replacement" else 1.0
        return u.double() * q_x * self.p_mass[index] < p_x * q_mass

    def reject(self, index, x, rule) -> None:
        if index.numel() == 0:
            return
        fresh = index[~self.touched[index]]
        if fresh.numel():
            self.res_p[fresh] = _rows(self.p, self.rows[fresh], self.at[fresh])
            if self.res_q is not None:
                self.res_q[fresh] = _rows(self.q, self.rows[fresh], self.at[fresh])
        was_fresh = ~self.touched[index]
        self.touched[index] = True
        if not rule.update_residual:
            return
        res = self.res_p[index]
        if self.q is None:
            # max(0, p' - onehot(x)) is p' with x removed, since p'(x) <= 1.
            res.scatter_(1, x.unsqueeze(1), 0.0)
        else:
            q_rows = (
                _rows(self.q, self.rows[index], self.at[index])
                if rule.proposal == "iid"
                else self.res_q[index]
            ).to(res.dtype)
            dtype = res.dtype
            p_scale = torch.where(was_fresh, 1.0, self.q_mass[index]).to(dtype).unsqueeze(1)
            q_scale = torch.where(was_fresh, 1.0, self.p_mass[index]).to(dtype).unsqueeze(1)
            if rule.proposal == "iid":
                p_scale = torch.ones_like(p_scale)
            # p'/|p'| - q'/|q'| up to the factor |p'| |q'|; a fresh row is p - q exactly.
            res = torch.where(
                was_fresh.unsqueeze(1), res - q_rows, res * p_scale - q_rows * q_scale
            ).clamp_(min=0)
            if rule.proposal == "without-replacement":
                q_new = self.res_q[index].scatter_(1, x.unsqueeze(1), 0.0)
                self.res_q[index] = q_new
                self.q_mass[index] = q_new.double().sum(dim=1)
        self.res_p[index] = res
        self.p_mass[index] = res.double().sum(dim=1)

    def sample(self, index, u, rule) -> torch.Tensor:
        """The token emitted where the walk stops: from p' after a rejection, else the bonus
        from the node's p."""
        rows, at = self.rows[index], self.at[index]
        weights = _rows(self.p, rows, at)
        touched = self.touched[index]
        if bool(touched.any()):
            if rule.update_residual:
                weights[touched] = self.res_p[index[touched]]
            elif self.q is not None:  # the stale-residual control: one step from the node's p
                q_rows = _rows(self.q, rows[touched], at[touched]).to(weights.dtype)
                weights[touched] = (weights[touched] - q_rows).clamp_(min=0)
        tokens, mass = inverse_cdf(weights, u)
        # An all-zero residual (p' and q' equal up to rounding) falls back to the node's p.
        degenerate = ~((mass > 0) & torch.isfinite(mass))
        if bool(degenerate.any()):
            fallback = _rows(self.p, rows[degenerate], at[degenerate])
            tokens[degenerate] = sample_from_probs(fallback, u[degenerate], validate=False)
        return tokens
