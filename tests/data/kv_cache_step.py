"""A whole speculative step that owns its KV cache, written against the interface of
``specsim check rollout --step`` (see its --help): draft k tokens, one target pass over
[last, drafts], modified rejection sampling, and the cache rolled back to the accepted prefix.

``step`` is exact. ``step_without_rollback`` forgets the rollback on a rejection: it keeps
every entry of the pass, the rejected drafts' included (a bug only a whole-run check sees).
"""

import torch


def _sample(probs, u):
    cdf = probs.cumsum(-1)
    return (cdf < u[:, None] * cdf[:, -1:]).sum(-1).clamp(max=probs.shape[-1] - 1)


def _step(target, drafter, cache, last, randomness, rollback):
    rows, k = randomness.accept.shape
    index = torch.arange(rows)
    a, b = cache.tokens[index, cache.length - 1], last
    drafts, qs = [], []
    for j in range(k):
        q = drafter(a, b)
        x = _sample(q, randomness.draft[:, j])
        drafts, qs, a, b = [*drafts, x], [*qs, q], b, x
    start = cache.length.clone()
    p = target(cache, torch.stack([last, *drafts], dim=1))
    accepted = torch.zeros(rows, dtype=torch.long)
    tokens = torch.full((rows, k + 1), -1)
    live = torch.ones(rows, dtype=torch.bool)
    for j in range(k + 1):
        if j == k:
            tokens[live, k] = _sample(p[:, k], randomness.sample)[live]
            break
        x, q = drafts[j], qs[j]
        ok = randomness.accept[:, j] * q[index, x] < p[index, j, x]
        residual = (p[:, j] - q).clamp(min=0)
        corrected = _sample(residual, randomness.sample)
        tokens[live, j] = torch.where(ok, x, corrected)[live]
        accepted += (live & ok).long()
        live = live & ok
    cache.length = start + 1 + accepted if rollback else start + k + 1
    return accepted, tokens


def step(target, drafter, cache, last, randomness):
    return _step(target, drafter, cache, last, randomness, rollback=True)


def step_without_rollback(target, drafter, cache, last, randomness):
    return _step(target, drafter, cache, last, randomness, rollback=False)
