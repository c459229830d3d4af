"""Sequoia's tree verification (SpecTree), as adapters for ``specsim check``.

Written from the published algorithm, ``SpecTree.accept_step`` and ``SpecTree.verify`` in
Infini-AI-Lab/Sequoia, Tree/SpecTree.py at commit 530d1bf35b9b4f6632259b5e9c518cd399124956,
re-expressed batched in specsim's tree signature (processed probabilities):

- at the node the walk has reached, the children are tried in rank order: accept x when
  p'(x) > r * q'(x), q' the drafter's distribution with the rejected siblings' logits set to
  -inf (removed, renormalised: the children were drafted without replacement);
- on a rejection p' <- norm(max(0, p' - q')) (``residual_graph``);
- where every child is rejected, or the node is a leaf, the token is drawn from p'.

``verify``: one step with fresh uniforms, as the algorithm is meant to run: exact.

``verify_uniforms_drawn_once``: SpecTree draws its accept uniforms once, ``self.r =
torch.rand(...)`` in ``__init__``, and every later ``verify`` call of the same generation
reads them again (indexed by buffer position). This adapter reproduces the reuse: it keeps the
uniforms of its first call and hands them to every later step. Each step alone is still exact;
the sequence is not (``specsim check rollout --verifier ...`` flags it).
"""

import torch


def verify(p, q, draft_tokens, tree, randomness):
    rows, depth = draft_tokens.shape[0], tree.depth
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
        residual = p[index, node + 1].double()
        proposal = q[index, node + 1].double()
        stepped = torch.zeros(rows, dtype=torch.bool)
        width = int((table[node[moving] + 1] >= 0).sum(-1).max()) if moving.any() else 0
        for rank in range(width):
            child = table[node + 1, rank]
            live = moving & ~stepped & (child >= 0)
            x = draft_tokens[index, child.clamp(min=0)]
            normed = proposal / proposal.sum(-1, keepdim=True)
            r = randomness.accept[index, child.clamp(min=0)]
            take = live & (residual[index, x] > r * normed[index, x])
            stepped |= take
            if level < depth:
                path[take, level] = child[take]
            tokens[take, level] = x[take]
            reject = live & ~take
            cut = (residual - normed).clamp(min=0)
            cut = cut / cut.sum(-1, keepdim=True).clamp(min=1e-300)
            residual = torch.where(reject[:, None], cut, residual)
            proposal[index[reject], x[reject]] = 0.0
        stop = moving & ~stepped
        cdf = residual.cumsum(-1)
        drawn = (cdf < randomness.sample[:, None] * cdf[:, -1:]).sum(-1)
        tokens[stop, level] = drawn.clamp(max=p.shape[-1] - 1)[stop]
        node = torch.where(stepped, path[:, min(level, depth - 1)], node)
        moving = stepped
    accepted = (path >= 0).sum(-1)
    return type("Result", (), {"accepted": accepted, "path": path, "tokens": tokens})


class UniformsDrawnOnce:
    """``verify`` fed the uniforms of its first call at every later call of the same batch."""

    def __init__(self):
        self.first = None

    def __call__(self, p, q, draft_tokens, tree, randomness):
        same = self.first is not None and self.first.accept.shape == randomness.accept.shape
        if not same:
            self.first = randomness
        return verify(p, q, draft_tokens, tree, self.first)


verify_uniforms_drawn_once = UniformsDrawnOnce()
