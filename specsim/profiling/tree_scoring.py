"""Scoring a draft model's trees on the target's own text (torch): which child explains each
emitted token.

At a tree node the drafter proposes children, rank 0 first; the verifier either accepts one of
them or emits a token of its own and ends the step. Exact verification is lossless, so the text
a tree run emits is distributed as the target's own text and the walk may condition on it, as
the chain walk does (``specsim.profiling.scoring``). Given that the token emitted at a position
is t, what matters is the probability ``accept[r]`` that child r was the one accepted (and so
held t); the subtree under it was drafted from the text's own prefix, so the walk goes on along
the text. Per position and rank, for children drafted

* ``top-k`` (EAGLE-2's expansion: rank r is the drafter's r-th most likely token, one-hot
  proposals): a child holding t is accepted exactly when t is emitted (the verifier accepts x
  with p'(x) and otherwise removes x from p', so a rejected child's token is never emitted),
  so ``accept[r] = 1`` where t is the drafter's r-th token, else 0. Greedy verification on
  greedy text reads the same way;
* ``iid`` (SpecInfer: children drawn independently from q, tried in order, accept x with
  min(1, p'(x) / q(x)), after a rejection p' <- norm(max(0, p' - q))): the residual does not
  depend on the rejected token, so child r is reached with probability prod_{j<r} (1 - b_j),
  b_j = sum min(p'_j, q), and accepted holding t with min(q(t), p'_r(t)); given t,
  ``accept[r] = prod_{j<r} (1 - b_j) min(q(t), p'_r(t)) / p(t)``. With one child this is the
  chain's min(1, q(t) / p(t));
* ``without-replacement`` (Sequoia, RSD: child j drawn from q with its elder siblings' tokens
  removed): the residual depends on how much q-mass the rejected siblings held
  (``specsim.profiling.tree_without_replacement``).

Distributions are temperature-only (softmax(logits / T)), as for chains.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from specsim.profiling.scoring import probabilities

TREE_DRAFTS = ("top-k", "iid", "without-replacement")


def top_k_accept(q_logits: torch.Tensor, tokens: Sequence[int], width: int) -> np.ndarray:
    """``[L, width]``: 1 where the text's token is the drafter's rank-r token."""
    at = torch.as_tensor(tokens, dtype=torch.long)[:, None]
    rank = (q_logits > q_logits.gather(1, at)).sum(-1)  # tokens the drafter ranks above t
    return torch.nn.functional.one_hot(rank.clamp(max=width), width + 1)[:, :width].double().numpy()


def iid_accept(
    p_logits: torch.Tensor,
    q_logits: torch.Tensor,
    temperature: float,
    tokens: Sequence[int],
    width: int,
) -> np.ndarray:
    """``[L, width]``: the probability that child r of i.i.d. drafts was accepted, given the
    text's token (see the module docstring)."""
    p = probabilities(p_logits.double(), temperature)
    q = probabilities(q_logits.double(), temperature)
    at = torch.as_tensor(tokens, dtype=torch.long)[:, None]
    p_text = p.gather(1, at).squeeze(1)
    q_text = q.gather(1, at).squeeze(1)
    residual, reach = p, torch.ones_like(p_text)
    out = []
    for _ in range(width):
        out.append(reach * torch.minimum(q_text, residual.gather(1, at).squeeze(1)))
        overlap = torch.minimum(residual, q).sum(-1).clamp(0.0, 1.0)
        left = (residual - q).clamp(min=0.0)
        # Where p' = q the step accepts surely; what is left (nothing) stays nothing.
        residual = left / left.sum(-1, keepdim=True).clamp_min(1e-300)
        reach = reach * (1.0 - overlap)
    accept = torch.stack(out, dim=1) / p_text.clamp_min(1e-300)[:, None]
    return torch.where(p_text[:, None] > 0, accept, 0.0).clamp(0.0, 1.0).numpy()
