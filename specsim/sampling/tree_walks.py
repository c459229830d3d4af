"""The tree verifiers' walks from the root (``tree_verifiers``): one where each child passes or
fails on its own (greedy, typical), and recursive rejection sampling with its residual (the exact
rules and the tree controls' planted bugs)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specsim.sampling.logits import inverse_cdf, sample_from_probs
from specsim.sampling.tree_inputs import TreeStep, TreeVerifyResult, rows_at
from specsim.tree import TreeShape


class WalkResult:
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


def pass_walk(step: TreeStep, decide) -> TreeVerifyResult:
    """Walk where each child passes or fails on its own (greedy, typical): ``decide(rows, at,
    kids, kid_tokens)`` returns the pass mask ``[R, W]`` and the token each row emits if it
    stops there."""
    out = WalkResult(step)
    live = torch.arange(step.draft.shape[0], device=step.draft.device)
    for level in range(step.depth + 1):
        if live.numel() == 0:
            break
        at = out.node[live] + 1
        kids = step.children(live, at)
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
class ExactRule:
    """The exact walk's variants: the proposal update, and the two planted bugs of the tree
    controls (``tree_controls``)."""

    proposal: str  # "iid": q as drafted; "without-replacement": earlier siblings removed
    update_residual: bool = True  # False: siblings are all tested against the node's p
    sibling_uniform: bool = False  # True: every sibling reuses the first sibling's uniform
    normalise_residual: bool = True  # False: a sibling after a rejection is tested against
    # the unnormalised max(0, p' - q'), a bug the whole-run check plants


def first_sibling(tree: TreeShape) -> torch.Tensor:
    """[N]: the index of each node's rank-0 sibling."""
    index = {path: i for i, path in enumerate(tree.paths)}
    return torch.tensor([index[(*path[:-1], 0)] for path in tree.paths], dtype=torch.long)


def rejection_walk(step: TreeStep, randomness, rule: ExactRule) -> TreeVerifyResult:
    """Recursive rejection sampling down the tree, one level at a time for every live row.

    At a node the residual p' (and, without replacement, the proposal q') is kept unnormalised
    with its mass, and materialised only once a child there is rejected; until then the test
    reads p(x) and q(x) alone, so on a chain it is the chain verifier's test bit for bit.
    """
    p, q, draft = step.p, step.q, step.draft
    accept = randomness.accept
    if rule.sibling_uniform:
        accept = accept[:, first_sibling(step.tree).to(accept.device)]
    out = WalkResult(step)
    live = torch.arange(draft.shape[0], device=draft.device)
    for level in range(step.depth + 1):
        if live.numel() == 0:
            break
        at = out.node[live] + 1
        state = NodeState(p, q, live, at)
        moved = torch.full_like(live, -1)
        kids = step.children(live, at)
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


class NodeState:
    """Per live row at its current node: the residual target p' and proposal q', unnormalised
    with their masses, built from the node's rows of p and q on the first rejection there."""

    def __init__(self, p, q, rows, at):
        self.p, self.q, self.rows, self.at = p, q, rows, at
        count = rows.numel()
        self.touched = torch.zeros(count, dtype=torch.bool, device=p.device)
        self.res_p: torch.Tensor | None = None  # [R, V], allocated on the first rejection
        self.res_q: torch.Tensor | None = None
        self.p_mass = torch.ones(count, dtype=torch.float64, device=p.device)
        self.q_mass = torch.ones_like(self.p_mass)

    def _at_x(self, source, residual, index, x):
        fresh = source[self.rows[index], self.at[index], x]
        if residual is None:
            return fresh
        return torch.where(self.touched[index], residual[index, x], fresh)

    def test(self, index, x, u, rule) -> torch.Tensor:
        """u q'(x) < p'(x), cross-multiplied by the masses; float64, as the chain's test."""
        p_x = self._at_x(self.p, self.res_p, index, x).double()
        if self.q is None:
            q_x = torch.ones_like(p_x)
        elif rule.proposal == "iid":
            q_x = self.q[self.rows[index], self.at[index], x].double()
        else:
            q_x = self._at_x(self.q, self.res_q, index, x).double()
        q_mass = self.q_mass[index] if rule.proposal == "without-replacement" else 1.0
        p_mass = self.p_mass[index] if rule.normalise_residual else 1.0
        return u.double() * q_x * p_mass < p_x * q_mass

    def reject(self, index, x, rule) -> None:
        if index.numel() == 0:
            return
        if self.res_p is None:
            self.res_p = torch.empty((self.rows.numel(), self.p.shape[-1]), dtype=self.p.dtype,
                                     device=self.p.device)  # fmt: skip
            if self.q is not None and rule.proposal == "without-replacement":
                self.res_q = torch.empty_like(self.res_p)
        fresh = ~self.touched[index]
        self._reject(index[fresh], x[fresh], rule, fresh=True)
        self._reject(index[~fresh], x[~fresh], rule, fresh=False)
        self.touched[index] = True

    def _reject(self, index, x, rule, fresh: bool) -> None:
        if index.numel() == 0:
            return
        rows, at = self.rows[index], self.at[index]
        res = rows_at(self.p, rows, at) if fresh else self.res_p[index]
        if not rule.update_residual:  # the stale-residual control: p' stays the node's p
            self.res_p[index] = res
            return
        if self.q is None:
            # max(0, p' - onehot(x)) is p' with x removed, since p'(x) <= 1.
            res.scatter_(1, x.unsqueeze(1), 0.0)
        else:
            if rule.proposal == "iid":
                q_rows = rows_at(self.q, rows, at).to(res.dtype)
            else:
                q_rows = rows_at(self.q, rows, at) if fresh else self.res_q[index]
                q_rows = q_rows.to(res.dtype)
            if fresh:  # exactly the chain's residual: p - q
                res.sub_(q_rows).clamp_(min=0)
            else:  # p'/|p'| - q'/|q'|, up to the factor |p'| |q'|
                p_scale = self.q_mass[index] if rule.proposal != "iid" else None
                q_scale = self.p_mass[index].to(res.dtype).unsqueeze(1)
                if p_scale is not None:
                    res.mul_(p_scale.to(res.dtype).unsqueeze(1))
                res.sub_(q_rows * q_scale).clamp_(min=0)
            if self.res_q is not None:
                q_rows = q_rows.scatter(1, x.unsqueeze(1), 0.0)
                self.res_q[index] = q_rows
                self.q_mass[index] = q_rows.double().sum(dim=1)
        self.res_p[index] = res
        self.p_mass[index] = res.double().sum(dim=1)

    def sample(self, index, u, rule) -> torch.Tensor:
        """The token emitted where the walk stops: from p' after a rejection, else the bonus
        from the node's p."""
        rows, at = self.rows[index], self.at[index]
        touched = self.touched[index]
        tokens = torch.empty_like(rows)
        plain = (~touched).nonzero().squeeze(-1)
        if plain.numel():
            bonus = rows_at(self.p, rows[plain], at[plain])
            tokens[plain] = sample_from_probs(bonus, u[plain], validate=False)
        hit = touched.nonzero().squeeze(-1)
        if hit.numel() == 0:
            return tokens
        weights = self.res_p[index[hit]]
        if not rule.update_residual and self.q is not None:
            # The stale-residual control: one residual step from the node's p.
            q_rows = rows_at(self.q, rows[hit], at[hit]).to(weights.dtype)
            weights = weights.sub_(q_rows).clamp_(min=0)
        drawn, mass = inverse_cdf(weights, u[hit])
        # An all-zero residual (p' and q' equal up to rounding) falls back to the node's p.
        degenerate = ~((mass > 0) & torch.isfinite(mass))
        if bool(degenerate.any()):
            back = hit[degenerate]
            fallback = rows_at(self.p, rows[back], at[back])
            drawn[degenerate] = sample_from_probs(fallback, u[back], validate=False)
        tokens[hit] = drawn
        return tokens
