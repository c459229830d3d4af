"""A verifier written outside specsim, with the checker's documented signature.

Modified rejection sampling from scratch (its own loop, cumsum and searchsorted), the way an
engine's own sampler is written; `specsim check sampler --verifier
tests/data/third_party_verifier.py:verify` judges it exactly.
"""

import torch


def verify(p, q, draft_tokens, n_drafts, randomness):
    batch, k = draft_tokens.shape
    rows = torch.arange(batch)
    accepted = torch.zeros(batch, dtype=torch.long)
    alive = torch.ones(batch, dtype=torch.bool)
    for i in range(k):
        x = draft_tokens[:, i].clamp(min=0)
        ok = alive & (i < n_drafts) & (randomness.accept[:, i] * q[rows, i, x] < p[rows, i, x])
        accepted += ok.long()
        alive &= ok
    tokens = torch.full((batch, k + 1), -1, dtype=torch.long)
    for i in range(k):
        tokens[:, i] = torch.where(i < accepted, draft_tokens[:, i], -1)
    at = accepted.clamp(max=k - 1)
    rejected = accepted < n_drafts
    residual = (p[rows, at] - q[rows, at]).clamp(min=0)
    weights = torch.where(rejected[:, None], residual, p[rows, accepted])
    cdf = weights.cumsum(-1)
    u = (randomness.sample.to(cdf.dtype) * cdf[:, -1])[:, None]
    final = torch.searchsorted(cdf, u, right=True)[:, 0].clamp(max=p.shape[-1] - 1)
    tokens[rows, accepted] = final
    return accepted, tokens
