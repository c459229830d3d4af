"""Scoring children drafted without replacement (Sequoia, RSD) on the target's own text (torch).

The verifier (``specsim.sampling.tree_verifiers.verify_tree_without_replacement``) tries a
node's children in rank order; child j was drawn from q_j, q with the earlier siblings' tokens
removed and renormalised, and is accepted with min(1, p_j(x_j) / q_j(x_j)); after a rejection
p_(j+1) = norm(max(0, p_j - q_j)). What the profiler needs (``tree_scoring``) is, given that
the token emitted at the node is t, the probability ``accept[r]`` that child r was the one
accepted: P(the elder siblings were drawn and rejected, child r drawn as t and accepted) / p(t).

The residual has a closed form along any history. Write R_theta = max(0, p - theta q) and
M(theta) = sum R_theta. A rejected token has p_j(x) < q_j(x), so every later residual is 0
there, and max(0, R_theta / M - c q) = R_(theta + c M) / M wherever R_theta > 0. Hence with
theta_1 = 0 and rest_j = 1 - q(elder siblings' tokens) (q_j = q / rest_j off them):

    p_j = R_(theta_j) / M(theta_j),   theta_(j+1) = theta_j + M(theta_j) / rest_j,

the stage-j rejection weight of a token a not yet drawn is w_j(a) = max(0, q_j(a) - p_j(a)),
and child j holds t and is accepted with min(q_j(t), p_j(t)). The residual depends on the
history only through the removed q-mass; the sum over histories is still one over ordered
tuples of distinct tokens, V^r terms for rank r (the innermost sibling needs O(1) each).

Ranks 0, 1 and 2 are summed exactly (rank 2: V^2 per position). Ranks 3 and up (a node with
more than three children) are estimated: the first r - 1 elder siblings are drawn from their
rejection weights (``samples`` histories per position, a seeded generator), the last one is
summed exactly, and each history weighs its reach probability: unbiased, and the replicates
(``replicates`` groups of the histories) give the estimate's standard error.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from specsim.profiling.scoring import probabilities

EXACT_RANKS = 3  # ranks 0..2 are summed exactly; wider nodes are estimated
SAMPLES = 64  # histories per position for the estimated ranks
REPLICATES = 8  # groups of the histories, for the standard error
CHUNK = 32  # positions per pass (the rank-2 sum holds [CHUNK, V, V] tensors)
MAX_RANK2_ELEMENTS = 2**27  # 1 GiB of doubles per [CHUNK, V, V] tensor: about V = 2,000
TINY = 1e-300


def affordable(vocab: int, width: int) -> bool:
    """Whether nodes of ``width`` children can be scored over a ``vocab``-token vocabulary: the
    exact rank-2 sum needs [CHUNK, V, V] tensors, out of reach for a real model's vocabulary."""
    return width <= 2 or CHUNK * vocab * vocab <= MAX_RANK2_ELEMENTS


@dataclass
class Histories:
    """Nodes' states after some rejected siblings, batched over a leading shape ``[...]``: the
    residual's threshold theta and mass M, the q-mass left, the removed tokens, the reach
    probability of the history."""

    theta: torch.Tensor  # [...]
    mass: torch.Tensor  # [...]
    rest: torch.Tensor  # [...]
    removed: torch.Tensor  # [..., V] bool
    reach: torch.Tensor  # [...]


def residual_mass(p: torch.Tensor, q: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """M(theta) = sum max(0, p - theta q) for each theta: ``p, q`` ``[L, V]``, ``theta``
    ``[L, ...]``."""
    extra = theta.dim() - 1
    shape = (p.shape[0],) + (1,) * extra + (p.shape[1],)
    return (p.view(shape) - theta.unsqueeze(-1) * q.view(shape)).clamp(min=0).sum(-1)


class WithoutReplacement:
    """One request's positions (a chunk): p, q ``[L, V]`` and the text's tokens ``[L]``."""

    def __init__(self, p: torch.Tensor, q: torch.Tensor, tokens: torch.Tensor):
        self.p, self.q, self.t = p, q, tokens
        self.p_t = p.gather(1, tokens[:, None]).squeeze(1)
        self.q_t = q.gather(1, tokens[:, None]).squeeze(1)

    def _view(self, x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """``x`` ``[L, ...]`` broadcast against ``like`` ``[L, *batch]``."""
        return x.view(x.shape + (1,) * (like.dim() - x.dim()))

    def root(self) -> Histories:
        length = self.p.shape[0]
        ones = torch.ones(length, dtype=self.p.dtype)
        removed = torch.zeros_like(self.p, dtype=torch.bool)
        return Histories(torch.zeros_like(ones), ones, ones.clone(), removed, ones.clone())

    def next_theta(self, h: Histories) -> torch.Tensor:
        """The threshold after the next sibling is rejected: p_j - q_j with q_j = q / rest."""
        return h.theta + h.mass / h.rest.clamp_min(TINY)

    def rejection_weights(self, h: Histories) -> torch.Tensor:
        """``[..., V]``: P(the next sibling is drawn as a and rejected | the history)."""
        p, q = self.p.view(self._shape(h)), self.q.view(self._shape(h))
        p_j = (p - h.theta.unsqueeze(-1) * q).clamp(min=0) / h.mass.clamp_min(TINY).unsqueeze(-1)
        q_j = q / h.rest.clamp_min(TINY).unsqueeze(-1)
        return torch.where(h.removed, 0.0, (q_j - p_j).clamp(min=0))

    def next_rank_accept(self, h: Histories) -> torch.Tensor:
        """``[...]``: P(the next sibling is rejected, then the one after holds t and is accepted),
        summed exactly over the next sibling's token, times the history's reach."""
        w = self.rejection_weights(h)
        theta = self.next_theta(h)
        mass = residual_mass(self.p, self.q, theta)
        p_t, q_t = self._view(self.p_t, theta), self._view(self.q_t, theta)
        p_next = (p_t - theta * q_t).clamp(min=0) / mass.clamp_min(TINY)
        rest = h.rest.unsqueeze(-1) - self.q.view(self._shape(h))
        q_next = q_t.unsqueeze(-1) / rest.clamp_min(TINY)
        accept = torch.minimum(q_next, p_next.unsqueeze(-1))
        # The next sibling drawn as t removes t; t removed earlier has p_next(t) = 0 already.
        vocab = torch.arange(self.p.shape[1])
        accept = torch.where(vocab == self._view(self.t, theta).unsqueeze(-1), 0.0, accept)
        # Rows past a history's reach (w = 0) may hold huge, meaningless ratios: drop them.
        total = torch.where(w > 0, w * accept, 0.0).sum(-1)
        return torch.where(h.reach > 0, h.reach * total, 0.0)

    def _shape(self, h: Histories) -> tuple[int, ...]:
        """``[L, 1, ..., V]``: p and q broadcast against the histories' batch."""
        return (self.p.shape[0],) + (1,) * (h.theta.dim() - 1) + (self.p.shape[1],)

    def accept_here(self, h: Histories) -> torch.Tensor:
        """``[...]``: P(the history, then the next sibling holds t and is accepted)."""
        p_t, q_t = self._view(self.p_t, h.theta), self._view(self.q_t, h.theta)
        p_j = (p_t - h.theta * q_t).clamp(min=0) / h.mass.clamp_min(TINY)
        return torch.where(
            h.reach > 0, h.reach * torch.minimum(q_t / h.rest.clamp_min(TINY), p_j), 0.0
        )

    def expand(self, h: Histories) -> Histories:
        """Every next rejected sibling: the batch grows a trailing axis of size V."""
        w = self.rejection_weights(h)
        theta = self.next_theta(h)
        mass = residual_mass(self.p, self.q, theta)
        vocab = self.p.shape[1]
        grow = (*h.theta.shape, vocab)
        removed = h.removed.unsqueeze(-2) | torch.eye(vocab, dtype=torch.bool)
        return Histories(
            theta.unsqueeze(-1).expand(grow),
            mass.unsqueeze(-1).expand(grow),
            h.rest.unsqueeze(-1) - self.q.view(self._shape(h)),
            removed,
            h.reach.unsqueeze(-1) * w,
        )

    def draw(self, h: Histories, generator: torch.Generator) -> Histories:
        """One next rejected sibling per history, drawn from its rejection weights; the reach
        takes their total (where it is 0 the history ends: its reach stays 0)."""
        w = self.rejection_weights(h)
        flat = w.reshape(-1, w.shape[-1])
        total = flat.sum(-1)
        safe = torch.where(total[:, None] > 0, flat, 1.0)
        drawn = torch.multinomial(safe, 1, generator=generator).squeeze(1)
        theta = self.next_theta(h)
        mass = residual_mass(self.p, self.q, theta)
        q_flat = self.q.view(self._shape(h)).expand(w.shape).reshape(flat.shape)
        rest = h.rest.reshape(-1) - q_flat.gather(1, drawn[:, None]).squeeze(1)
        removed = h.removed.reshape(flat.shape).clone()
        removed[torch.arange(flat.shape[0]), drawn] = True
        return Histories(
            theta,
            mass,
            rest.view(h.theta.shape),
            removed.view(h.removed.shape),
            h.reach * total.view(h.theta.shape),
        )


def chunk_scores(
    chunk: WithoutReplacement, width: int, generator: torch.Generator, samples: int
) -> torch.Tensor:
    """``[L, width]`` joint P(child r accepted holding t), or ``[R, L, width]`` with one
    estimate per replicate when ``width`` exceeds the exact ranks."""
    root = chunk.root()
    exact = [chunk.accept_here(root)]
    if width > 1:
        exact.append(chunk.next_rank_accept(root))
    if width > 2:
        exact.append(chunk.next_rank_accept(chunk.expand(root)).sum(-1))
    exact = torch.stack(exact[:width], dim=1)
    if width <= EXACT_RANKS:
        return exact
    length = chunk.p.shape[0]
    many = Histories(
        root.theta[:, None].expand(length, samples),
        root.mass[:, None].expand(length, samples),
        root.rest[:, None].expand(length, samples),
        root.removed[:, None, :].expand(length, samples, -1),
        root.reach[:, None].expand(length, samples),
    )
    estimated = []
    for rank in range(EXACT_RANKS, width):
        if rank == EXACT_RANKS:
            for _ in range(rank - 1):
                many = chunk.draw(many, generator)
        else:
            many = chunk.draw(many, generator)
        estimated.append(chunk.next_rank_accept(many))  # [L, samples]
    per_sample = torch.stack(estimated, dim=-1)  # [L, samples, width - EXACT_RANKS]
    groups = per_sample.view(length, REPLICATES, samples // REPLICATES, -1).mean(2)
    replicate_exact = exact[None].expand(REPLICATES, -1, -1)
    return torch.cat([replicate_exact, groups.permute(1, 0, 2)], dim=-1)


def without_replacement_accept(
    p_logits: torch.Tensor,
    q_logits: torch.Tensor,
    temperature: float,
    tokens: Sequence[int],
    width: int,
    generator: torch.Generator,
    samples: int = SAMPLES,
) -> np.ndarray:
    """``[L, width]`` (``[REPLICATES, L, width]`` past the exact ranks): the probability that
    child r, drafted without replacement, was the one accepted given the text's token."""
    if samples % REPLICATES:
        raise ValueError(f"samples ({samples}) must be a multiple of {REPLICATES}")
    p = probabilities(p_logits.double(), temperature)
    q = probabilities(q_logits.double(), temperature)
    at = torch.as_tensor(tokens, dtype=torch.long)
    parts = []
    for start in range(0, len(at), CHUNK):
        part = slice(start, start + CHUNK)
        chunk = WithoutReplacement(p[part], q[part], at[part])
        joint = chunk_scores(chunk, width, generator, samples)
        p_text = chunk.p_t.clamp_min(TINY)
        parts.append(torch.where(chunk.p_t[:, None] > 0, joint / p_text[:, None], 0.0))
    return torch.cat(parts, dim=-2).clamp(0.0, 1.0).numpy()
