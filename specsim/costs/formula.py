"""The step-cost formula, written once: what an engine iteration costs, from a flat vector of
the profile's terms.

``StepCosts`` (the per-iteration reference, the planners, the profiler's fits) calls these
functions interpreted, on the vector as a list of floats; the compiled kernels compile the same
source (``simulation/compiled_step_kernel.py`` registers each function with numba), so a cost
change lands here and every path follows. The functions use only scalar arithmetic, indexing
and calls to each other, the subset both run alike, to the bit.

The vector (``cost_vector``): the target's latency block, the overhead's six terms, the
drafter's latency block, nine constants and the five flags of its passes (``DraftPasses``: 1.0
or 0.0), the engine's seconds per admitted request, where a tree step's section starts (0.0:
chain steps), then the captured CUDA-graph sizes (the target's, then the drafter's), then the
tree's section (``with_tree``). A latency block is ``COST_LATENCY`` values
(``profile.latency.latency_s`` reads one).
"""

from __future__ import annotations

from specsim.profile.latency import LATENCY_BLOCK as COST_LATENCY
from specsim.profile.latency import latency_s as latency

TARGET, OVERHEAD = 0, COST_LATENCY
DRAFTER = OVERHEAD + 6
PER_DRAFT, HAS_LATENCY, STEP_S, D_FLOPS, D_ATTN = range(
    DRAFTER + COST_LATENCY, DRAFTER + COST_LATENCY + 5
)
T_FLOPS, T_ATTN, PREFILL_S, PREFILL_TOKEN_S = range(D_ATTN + 1, D_ATTN + 5)
DRAFTS, BLOCK, OWN_CACHE, MODEL, MLP_HEADS = range(PREFILL_TOKEN_S + 1, PREFILL_TOKEN_S + 6)
ADMIT_S = MLP_HEADS + 1  # ``Overhead.per_request_engine_s``
TREE_AT = ADMIT_S + 1  # where the tree's section starts (``with_tree``), or 0.0
COST_SIZES = TREE_AT + 1  # where the graph sizes start


def pass_count(c, k):
    """The drafter's forward passes per step at window ``k``."""
    if k == 0:
        return 1 if c[OWN_CACHE] != 0.0 else 0
    return k if c[PER_DRAFT] != 0.0 else 1


def pass_totals(c, rows, k, kv, passes):
    """(tokens, mean KV read, query-key pairs) of each of a step's ``passes`` drafter passes:
    passes one per drafted token read a context one token longer per row each time (their mean
    is exact, the fit being linear in context)."""
    queries = k + 1 if c[BLOCK] != 0.0 and k else 1
    mean_kv = kv + rows * (passes - 1) / 2.0 if c[PER_DRAFT] != 0.0 else kv
    return rows * queries, mean_kv, queries * mean_kv + rows * queries * (queries + 1) / 2.0


def chain_draft_s(c, rows, k, kv):
    """Seconds of one chain step's drafting for ``rows`` > 0 sequences holding ``kv`` context."""
    passes = pass_count(c, k) if c[DRAFTS] != 0.0 else 0
    if passes == 0:
        return 0.0
    tokens, mean_kv, pairs = pass_totals(c, rows, k, kv, passes)
    if c[HAS_LATENCY] == 0.0:
        return passes * c[STEP_S]
    return passes * latency(c, DRAFTER, rows, tokens, mean_kv, pairs, 0.0)


def chain_draft_flops(c, rows, k, kv):
    """The drafter's FLOPs of one chain step for ``rows`` > 0 sequences."""
    passes = pass_count(c, k) if c[MODEL] != 0.0 else 0
    if passes == 0:
        return 0.0
    if c[MLP_HEADS] != 0.0:
        return c[D_FLOPS] * rows * k
    tokens, _, pairs = pass_totals(c, rows, k, kv, passes)
    return passes * (c[D_FLOPS] * tokens + c[D_ATTN] * pairs)


def draft_s(c, rows, k, kv):
    """Seconds of one step's drafting for ``rows`` > 0 sequences holding ``kv`` context: a
    tree's passes (``costs.tree``; each group of equal-width passes as its count times its mean
    pass, exact as the fit is linear), or the chain's at window k."""
    at = int(c[TREE_AT])
    if at == 0:
        return chain_draft_s(c, rows, k, kv)
    depth = int(c[at])
    if c[at + 1] != 0.0:  # the whole tree in one pass: the chain of its depth
        return chain_draft_s(c, rows, depth, kv)
    if c[HAS_LATENCY] == 0.0:  # heads without a fit: their fixed pass, once per depth
        return depth * c[STEP_S]
    seconds = 0.0
    g = at + 3 + 2 * (depth + 2)
    for _ in range(int(c[at + 2])):
        count, width, fed, reach = c[g], c[g + 1], c[g + 2], c[g + 3]
        mean_kv = kv + rows * (fed + width * (count - 1) / 2.0)
        pairs = width * kv + rows * width * reach
        seconds += count * latency(c, DRAFTER, rows, rows * width, mean_kv, pairs, 0.0)
        g += 4
    return seconds


def draft_flops(c, rows, k, kv):
    """The drafter's FLOPs of one step for ``rows`` > 0 sequences (a tree's, as ``draft_s``)."""
    at = int(c[TREE_AT])
    if at == 0:
        return chain_draft_flops(c, rows, k, kv)
    depth = int(c[at])
    if c[at + 1] != 0.0:
        return chain_draft_flops(c, rows, depth, kv)
    flops = 0.0
    g = at + 3 + 2 * (depth + 2)
    for _ in range(int(c[at + 2])):
        count, width, reach = c[g], c[g + 1], c[g + 3]
        pairs = width * kv + rows * width * reach
        flops += count * (c[D_FLOPS] * (rows * width) + c[D_ATTN] * pairs)
        g += 4
    return flops


def wasted_per_position(c, mean_context):
    """FLOPs of one rejected position: the target's verification plus the draft's pass."""
    target = c[T_FLOPS] + c[T_ATTN] * mean_context
    if c[MODEL] == 0.0:
        return target + 0.0
    if c[MLP_HEADS] != 0.0:
        return target + c[D_FLOPS]
    draft = c[D_FLOPS]
    draft += c[D_ATTN] * mean_context
    return target + draft


def overhead_s(c, sequences, k, drafting):
    """The engine's own work (``Overhead``): ``sequences`` in the iteration, ``drafting`` of
    them through ``k`` draft passes."""
    seconds = c[OVERHEAD] + c[OVERHEAD + 1] * sequences
    if k and drafting:
        seconds += c[OVERHEAD + 2] + c[OVERHEAD + 3] * drafting
        seconds += k * (c[OVERHEAD + 4] + c[OVERHEAD + 5] * drafting)
    return seconds


def draft_prefill_s(c, rows, tokens, kv, pairs):
    """Seconds of the drafter's own pass over prompt chunks: one with its own cache builds it
    over them; others take nothing."""
    if rows and c[OWN_CACHE] != 0.0:
        return latency(c, DRAFTER, rows, tokens, kv, 0.0, pairs)
    return 0.0


def draft_prefill_flops(c, tokens, pairs):
    """The drafter's FLOPs over prompt chunks (those of a drafter with its own cache)."""
    if c[OWN_CACHE] == 0.0:
        return 0.0
    return c[D_FLOPS] * tokens + c[D_ATTN] * pairs


def pass_parts(c, k, rows, tokens, kv, pairs, p_rows, p_tokens, p_kv, p_pairs):
    """One iteration's (target pass, engine's own work, drafter's pass over prompt chunks)
    seconds: ``rows`` decoding sequences verify ``tokens`` positions over ``kv`` cached tokens
    after k draft passes, and ``p_rows`` prompt chunks ride in the same target pass (the
    prefill overhead terms apply, their pairs at the prefill cost, and a drafter with its own
    cache builds it over them)."""
    batch = rows + p_rows
    target = latency(c, TARGET, batch, tokens + p_tokens, kv + p_kv, pairs, p_pairs)
    host = overhead_s(c, batch, k, rows)
    prefill_draft = 0.0
    if p_rows:
        host += c[PREFILL_S] + c[PREFILL_TOKEN_S] * p_tokens
        prefill_draft = draft_prefill_s(c, p_rows, p_tokens, p_kv, p_pairs)
    return target, host, prefill_draft


def iteration_parts(c, k, rows, tokens, kv, pairs, p_rows, p_tokens, p_kv, p_pairs):
    """One iteration's (target pass, drafter's passes, engine's own work) seconds
    (``pass_parts``, the decoding rows' drafting added)."""
    target, host, prefill_draft = pass_parts(
        c, k, rows, tokens, kv, pairs, p_rows, p_tokens, p_kv, p_pairs
    )
    draft = draft_s(c, rows, k, kv) if rows else 0.0
    return target, draft + prefill_draft, host


def mixed_s(c, k, rows, tokens, kv, pairs, p_rows, p_tokens, p_kv, p_pairs):
    """Seconds of one iteration (``iteration_parts`` summed): what the engine charges and the
    adaptive window policy maximises against."""
    target, draft, host = iteration_parts(
        c, k, rows, tokens, kv, pairs, p_rows, p_tokens, p_kv, p_pairs
    )
    return target + draft + host


def admitted_s(c, admitted):
    """The engine loop's own work on the ``admitted`` requests an iteration admits (new ones and
    ones preempted before, or a decode replica's joins: ``Overhead.per_request_engine_s``)."""
    return c[ADMIT_S] * admitted


def decode_s(c, k, rows, tokens, kv, pairs):
    """Seconds of a decode-only iteration with ``rows`` > 0 (no prompt chunk: the terms one
    would add are left out, not 0.0 added)."""
    target = latency(c, TARGET, rows, tokens, kv, pairs, 0.0)
    return target + draft_s(c, rows, k, kv) + overhead_s(c, rows, k, rows)


# Every function above, for the kernels to compile (``compiled_step_kernel``).
FUNCTIONS = (
    latency,
    pass_count,
    pass_totals,
    chain_draft_s,
    chain_draft_flops,
    draft_s,
    draft_flops,
    wasted_per_position,
    overhead_s,
    draft_prefill_s,
    draft_prefill_flops,
    pass_parts,
    iteration_parts,
    mixed_s,
    admitted_s,
    decode_s,
)


def cost_vector(target, overhead, drafter, own, prefill, admit_s: float = 0.0) -> list[float]:
    """The vector of a target's ``LatencyModel``, the overhead's six per-iteration terms
    (``overhead``: step, sequence, speculative step and sequence, draft step and token), a
    drafter's cost (``costs.drafters``), the target's (FLOPs per token, attention FLOPs per
    context token) ``own``, the prefill overhead's (per chunk, per token) ``prefill`` and the
    engine's seconds per admitted request ``admit_s``."""
    latency_model = drafter.latency
    target_block, target_sizes = target.block_at(COST_SIZES)
    draft_block, draft_sizes = (
        ([0.0] * COST_LATENCY, ())
        if latency_model is None
        else latency_model.block_at(COST_SIZES + len(target_sizes))
    )
    passes = drafter.passes
    flags = (
        (1.0, passes.block, passes.own_cache, passes.model, passes.mlp_heads)
        if passes is not None
        else (0.0,) * 5
    )
    values = [
        *target_block,
        *overhead,
        *draft_block,
        passes is not None and passes.per_draft,
        0.0 if latency_model is None else 1.0,
        drafter.step_s,
        drafter.flops_per_token,
        drafter.attn_flops,
        *own,
        *prefill,
        *flags,
        admit_s,
        0.0,  # chain steps (``with_tree``)
        *target_sizes,
        *draft_sizes,
    ]
    return [float(v) for v in values]


def with_tree(terms: list[float], depth: int, one_pass: bool, rows, groups) -> list[float]:
    """``terms`` for tree steps: its section appended (depth, one-pass flag, group count, the
    ``TreeRows`` tables ``verified`` and ``own_pairs``, then each group of the drafter's passes
    as count, width, nodes fed before, mean depth + 1), where ``TREE_AT`` says."""
    section = [depth, one_pass, len(groups), *rows.verified, *rows.own_pairs]
    section += [value for group in groups for value in group]
    return [*terms[:TREE_AT], float(len(terms)), *terms[TREE_AT + 1 :], *map(float, section)]
