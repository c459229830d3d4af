"""EAGLE's tree verification at temperature > 0, as an adapter for ``specsim check sampler``.

Written from the published algorithm, ``evaluate_posterior`` in SafeAILab/EAGLE,
eagle/model/utils.py at commit 08dc06ccb428f2d3cf8380933ea50ed3e4178168 (EAGLE-1 sampling
path), re-expressed batched in specsim's tree signature with raw logits (``--inputs logits``):

- at the node the walk has reached, the target's logits go through the logits processor
  (temperature), then the children are tried in rank order: accept x when r <= p'(x) / q'(x),
  q' the drafter's distribution with the earlier siblings removed and renormalised (the
  children were drafted without replacement; ``cart_candidates_prob``);
- on a rejection p' <- norm(max(0, p' - q')) and the walk tries the next sibling;
- where every child is rejected the token is drawn from p'; but where the walk stops at a leaf
  (every draft accepted down to it) the token is drawn from softmax(raw logits) -- the logits
  processor is not applied there.

So the step is exact at temperature 1 and lossy at any other temperature (the bonus token).
EAGLE draws r with random.random(); here r is the node's uniform from ``randomness.accept``.
"""

import torch


def verify(p, q, draft_tokens, tree, randomness, *, temperature, top_k, top_p):
    rows, depth = draft_tokens.shape[0], tree.depth
    target = torch.softmax(p.double() / temperature, dim=-1)
    raw = torch.softmax(p.double(), dim=-1)
    drafter = torch.softmax(q.double() / temperature, dim=-1)
    parents = tree.parents.tolist()
    kids = [[c for c, u in enumerate(parents) if u == node] for node in range(-1, len(parents))]
    width_of = max(len(k) for k in kids)
    table = torch.tensor([k + [-1] * (width_of - len(k)) for k in kids]).reshape(-1, width_of)
    index = torch.arange(rows)
    node = torch.full((rows,), -1)
    moving = torch.ones(rows, dtype=torch.bool)
    path = torch.full((rows, depth), -1)
    tokens = torch.full((rows, depth + 1), -1)
    for level in range(depth + 1):
        residual = target[index, node + 1].clone()
        proposal = drafter[index, node + 1].clone()
        adjusted = torch.zeros(rows, dtype=torch.bool)
        stepped = torch.zeros(rows, dtype=torch.bool)
        width = int((table[node[moving] + 1] >= 0).sum(-1).max()) if moving.any() else 0
        for rank in range(width):
            child = table[node + 1, rank]
            live = moving & ~stepped & (child >= 0)
            x = draft_tokens[index, child.clamp(min=0)]
            q_x = proposal[index, x] / proposal.sum(-1)
            take = live & (randomness.accept[index, child.clamp(min=0)] * q_x <= residual[index, x])
            stepped |= take
            path[take, level] = child[take]
            tokens[take, level] = x[take]
            reject = live & ~take
            normed = proposal / proposal.sum(-1, keepdim=True)
            cut = (residual - normed).clamp(min=0)
            cut = cut / cut.sum(-1, keepdim=True).clamp(min=1e-300)
            residual = torch.where(reject[:, None], cut, residual)
            proposal[index[reject], x[reject]] = 0.0
            adjusted |= reject
        stop = moving & ~stepped
        final = torch.where(adjusted[:, None], residual, raw[index, node + 1])
        cdf = final.cumsum(-1)
        drawn = (cdf < randomness.sample[:, None] * cdf[:, -1:]).sum(-1).clamp(max=p.shape[-1] - 1)
        tokens[stop, level] = drawn[stop]
        node = torch.where(stepped, path[:, min(level, depth - 1)], node)
        moving = stepped
    accepted = (path >= 0).sum(-1)
    return type("Result", (), {"accepted": accepted, "path": path, "tokens": tokens})
