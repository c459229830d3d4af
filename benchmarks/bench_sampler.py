"""Speed of the exact verifier against one read of its inputs and a straightforward implementation,
and of the tree verifiers against the chain one.

CPU, one thread, B = 64 rows, k = 4, V = 32000, float32. Reported as ratios of median times
measured in the same process (the machine is shared and absolute times drift):

- read: reading p and q once (``p.sum(); q.sum()``), what any pass over the full inputs costs
  (input validation is one such pass);
- straightforward: build the residual norm(max(0, p - q)) and sample it at every position, then
  pick each row's first rejection (what a direct transcription of the algorithm does).

verify_rejection builds and samples the residual only for rows that rejected, at one position
each, and otherwise reads only p(x) and q(x) at the drafted tokens: without validation it costs
less than one read of its inputs. Validation (the row sums of p and q) adds about one read.

Trees (``specsim.sampling.tree_verifiers``), same B and V: the tree verifier on the chain shape
(k = 4, the chain's inputs and uniforms; its output is checked equal to the chain's) against the
chain verifier, and the four tree verifiers on the 2,2,1 tree (10 nodes, depth 3, children drawn
i.i.d. from their parent's q) against one read of their own inputs and against the chain
verifier at k = 4. The last stdout line is the JSON summary.
"""

from __future__ import annotations

import json
import statistics
import time

import torch

from specsim.sampling import (
    draw_randomness,
    sample_from_probs,
    verify_greedy,
    verify_rejection,
    verify_typical,
)
from specsim.sampling.tree_verifiers import (
    verify_tree_greedy,
    verify_tree_rejection,
    verify_tree_typical,
    verify_tree_without_replacement,
)
from specsim.tree import TreeShape

B, K, V = 64, 4, 32_000
REPEATS = 31


def straightforward_rejection(p, q, draft, randomness):
    """Residual and its sample at every position; then each row's first rejection decides."""
    p_x = p[:, :K].gather(-1, draft[..., None])[..., 0]
    q_x = q.gather(-1, draft[..., None])[..., 0]
    ok = randomness.accept * q_x.double() < p_x.double()
    mask = torch.cumprod(ok.to(torch.int8), dim=1).bool()
    accepted = mask.sum(dim=1)
    residual = torch.clamp(p[:, :K] - q, min=0)
    mass = residual.sum(dim=-1, keepdim=True)
    residual = torch.where(mass > 0, residual / mass, p[:, :K])
    u = randomness.sample[:, None].expand(B, K)
    corrected = sample_from_probs(residual, u, validate=False)  # [B, K]
    bonus = sample_from_probs(p[:, K], randomness.sample, validate=False)
    final = torch.cat([corrected, bonus[:, None]], dim=1).gather(1, accepted[:, None])[:, 0]
    tokens = torch.full((B, K + 1), -1, dtype=torch.long)
    tokens[:, :K] = torch.where(mask, draft, tokens[:, :K])
    tokens.scatter_(1, accepted[:, None], final[:, None])
    return tokens


def tree_inputs(gen, tree: TreeShape):
    """p and q at the root and every node; each node's token drawn from its parent's q."""
    n = tree.num_nodes
    target_logits = torch.randn(B, n + 1, V, generator=gen) * 3
    p = torch.softmax(target_logits, dim=-1)
    q = torch.softmax(target_logits + torch.randn(B, n + 1, V, generator=gen), dim=-1)
    parent_rows = q[:, torch.from_numpy(tree.parents) + 1]
    draft = sample_from_probs(parent_rows, torch.rand(B, n, generator=gen, dtype=torch.float64))
    return p, q, draft, draw_randomness(gen, B, n)


def median_ms(fn, repeats=REPEATS) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def main() -> None:
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    target_logits = torch.randn(B, K + 1, V, generator=gen) * 3
    p = torch.softmax(target_logits, dim=-1)
    # A drafter that agrees with the target most of the time, as a real pair does.
    q = torch.softmax(target_logits[:, :K] + torch.randn(B, K, V, generator=gen), dim=-1)
    draft = sample_from_probs(q, torch.rand(B, K, generator=gen, dtype=torch.float64))
    randomness = draw_randomness(gen, B, K)

    ours = verify_rejection(p, q, draft, None, randomness)
    assert torch.equal(ours.tokens, straightforward_rejection(p, q, draft, randomness))
    chain = TreeShape.chain(K)
    q_chain = torch.cat([q, q[:, -1:]], dim=1)  # a leaf's q row is not read
    on_chain = verify_tree_rejection(p, q_chain, draft, chain, randomness)
    assert torch.equal(on_chain.tokens, ours.tokens)
    tree = TreeShape.branching([2, 2, 1])
    tp, tq, tdraft, trand = tree_inputs(gen, tree)
    tree_accepted = verify_tree_rejection(tp, tq, tdraft, tree, trand).accepted

    cases = {
        "read": lambda: (p.sum(), q.sum()),
        "rejection": lambda: verify_rejection(p, q, draft, None, randomness),
        "rejection_unvalidated": lambda: verify_rejection(
            p, q, draft, None, randomness, validate=False
        ),
        "straightforward": lambda: straightforward_rejection(p, q, draft, randomness),
        "greedy": lambda: verify_greedy(p, q, draft, None, randomness),
        "typical": lambda: verify_typical(p, q, draft, None, randomness),
        "tree_on_chain": lambda: verify_tree_rejection(p, q_chain, draft, chain, randomness),
        "tree_read": lambda: (tp.sum(), tq.sum()),
        "tree_rejection": lambda: verify_tree_rejection(tp, tq, tdraft, tree, trand),
        "tree_rejection_unvalidated": lambda: verify_tree_rejection(
            tp, tq, tdraft, tree, trand, validate=False
        ),
        "tree_without_replacement": lambda: verify_tree_without_replacement(
            tp, tq, tdraft, tree, trand
        ),
        "tree_greedy": lambda: verify_tree_greedy(tp, tq, tdraft, tree, trand),
        "tree_typical": lambda: verify_tree_typical(tp, tq, tdraft, tree, trand),
    }
    for fn in cases.values():  # warm-up
        fn()
    # Interleave the cases in rounds so drift on a shared machine hits all of them alike.
    samples = {name: [] for name in cases}
    for _ in range(5):
        for name, fn in cases.items():
            samples[name].append(median_ms(fn, REPEATS // 5 + 1))
    ms = {name: statistics.median(values) for name, values in samples.items()}
    read = ms["read"]
    figures = {f"{name}_ms": round(value, 3) for name, value in ms.items()}
    for name in ("rejection", "rejection_unvalidated", "straightforward", "greedy", "typical"):
        figures[f"{name}_vs_read"] = round(ms[name] / read, 3)
    figures["rejection_vs_straightforward"] = round(ms["rejection"] / ms["straightforward"], 3)
    figures["accepted_mean"] = round(float(ours.accepted.float().mean()), 3)
    figures["shape"] = f"B={B} k={K} V={V} float32, 1 thread"
    figures["tree_on_chain_vs_chain"] = round(ms["tree_on_chain"] / ms["rejection"], 3)
    tree_cases = ("tree_rejection", "tree_rejection_unvalidated", "tree_without_replacement",
                  "tree_greedy", "tree_typical")  # fmt: skip
    for name in tree_cases:
        figures[f"{name}_vs_tree_read"] = round(ms[name] / ms["tree_read"], 3)
        figures[f"{name}_vs_chain"] = round(ms[name] / ms["rejection"], 3)
    figures["tree_accepted_mean"] = round(float(tree_accepted.float().mean()), 3)
    figures["tree_shape"] = f"2,2,1: {tree.num_nodes} nodes, depth {tree.depth}"
    print(
        json.dumps(
            {
                "name": "sampler",
                "figures": figures,
                "baseline": "one read of the inputs: p.sum() + q.sum()",
                "ratio": round(ms["rejection"] / read, 3),
            }
        )
    )


if __name__ == "__main__":
    main()
