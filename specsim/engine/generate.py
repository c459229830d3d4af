"""Offline batched generation through the engine's own step, and a cache audit.

``generate`` runs many rows at once, without arrivals or wall-clock time, through the same
``Batch`` and ``speculative_step`` the serving engine uses (prefill, then speculative steps with
per-row rollback). The end-to-end losslessness tests and ``check rollout`` examples use it.
With a ``tree`` shape every step is a tree step (``specsim.engine.tree_step``) instead.

``audit_caches`` checks the cache invariants after any step: the target's cache holds exactly the
row's sequence but its last token, the drafter's at most that, and feeding the missing tokens
through each cache gives the logits a cache-free pass over the sequence gives.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specsim.engine.batch import Batch
from specsim.engine.mtp_step import is_mtp
from specsim.engine.step import (
    Faults,
    Rows,
    Sampling,
    StepUniforms,
    prefill_step,
    speculative_step,
)
from specsim.engine.tree_step import TreeFaults, TreeUniforms, tree_step
from specsim.errors import SpecsimError
from specsim.models import DecoderModel
from specsim.tree import TreeShape


@dataclass
class Generation:
    """``tokens [B, n]`` generated per row; acceptance counts; ``audit`` problems found."""

    tokens: torch.Tensor
    steps: int
    drafted: int
    accepted: int
    audit: list[str]

    @property
    def mean_acceptance_length(self) -> float:
        return 1.0 + self.accepted / self.steps if self.steps else 1.0


@torch.inference_mode()
def generate(
    target: DecoderModel,
    drafter: DecoderModel | None,
    prompts: list[list[int]],
    n_tokens: int,
    k: int,
    sampling: Sampling,
    seed: int,
    faults: Faults | None = None,
    audit: bool = False,
    tree: TreeShape | None = None,
    tree_faults: TreeFaults | None = None,
    tree_drafts: str = "top-k",
) -> Generation:
    """Generate ``n_tokens`` per prompt (all rows at once), speculatively when ``k > 0``; with a
    ``tree``, by tree steps whose children are drafted ``tree_drafts`` (``k`` must then be the
    tree's depth)."""
    faults = faults or Faults()
    if tree is not None and is_mtp(drafter):
        raise SpecsimError(
            "the MTP drafter drafts chains only", key="tree", fix="remove the tree, or use k"
        )
    if tree is not None and k != tree.depth:
        raise SpecsimError(
            f"k = {k} with a tree of depth {tree.depth}", key="k", fix="give k = the depth"
        )
    rows_n = len(prompts)
    # A tree's verification pass lays out all its nodes before the path is kept.
    width = tree.num_nodes if tree else k
    max_len = max(len(p) for p in prompts) + n_tokens + width + 1
    # Planted faults leave extra tokens in a cache every step; give them the room.
    draft_len = max_len + (n_tokens * width if faults.skip_draft_rollback else 0)
    max_len += n_tokens * faults.target_rollback_extra
    batch = Batch(target, drafter if k else None, rows_n, max_len, draft_len)
    generator = torch.Generator().manual_seed(seed)
    batch.add(prompts)
    rows = batch.rows()
    uniforms = torch.rand(rows_n, generator=generator, dtype=torch.float64)
    first = prefill_step(target, drafter, rows, sampling, uniforms, faults).tokens
    _append(batch, first[:, None].cpu(), torch.ones(rows_n, dtype=torch.long))
    produced = torch.ones(rows_n, dtype=torch.long)
    steps = drafted = accepted = 0
    problems: list[str] = []
    while bool((produced < n_tokens).any()):
        owed = n_tokens - produced
        active = owed > 0
        n_drafts = torch.clamp(torch.minimum(owed - 1, torch.full_like(owed, k)), min=0)
        n_drafts = torch.where(active, n_drafts, torch.zeros_like(n_drafts))
        if tree is not None:
            uniforms = TreeUniforms.draw(generator, rows_n, tree.num_nodes)
            result = tree_step(
                target,
                drafter,
                batch.rows(),
                tree,
                sampling,
                faults,
                tree_faults,
                owed,
                tree_drafts,
                uniforms,
            )
            n_drafts = result.drafted.cpu()
        else:
            result = speculative_step(
                target,
                drafter if k else None,
                batch.rows(),
                n_drafts,
                sampling,
                StepUniforms.draw(generator, rows_n, k),
                faults,
            )
        accepted_rows = result.accepted.cpu()
        emitted = torch.where(active, accepted_rows + 1, torch.zeros_like(accepted_rows))
        _append(batch, result.tokens.cpu(), emitted)
        produced += emitted
        steps += int(active.sum())
        drafted += int(n_drafts[active].sum())
        accepted += int(accepted_rows[active].sum())
        # Finished rows still ride along (a uniform batch keeps the loop simple); their
        # caches are rolled back to where they were, so nothing they compute is kept.
        if not bool(active.all()):
            _freeze(batch, ~active)
        if audit:
            problems += audit_caches(target, drafter if k else None, batch.rows())
    tokens = torch.stack(
        [batch.seq[b, len(prompts[b]) : len(prompts[b]) + n_tokens] for b in range(rows_n)]
    ).cpu()
    return Generation(tokens, steps, drafted, accepted, problems)


def _append(batch: Batch, tokens: torch.Tensor, counts: torch.Tensor) -> None:
    for b in range(tokens.shape[0]):
        n = int(counts[b])
        if n:
            batch.append(b, tokens[b, :n].tolist())


def _freeze(batch: Batch, rows: torch.Tensor) -> None:
    """Finished rows: undo what the last step put in their caches beyond their sequence."""
    s_len = batch.s_len
    for cache in (batch.target_cache, batch.draft_cache):
        if cache is not None:
            mask = rows.to(cache.device)
            keep = torch.where(mask, torch.minimum(cache.lengths, s_len - 1), cache.lengths)
            cache.rollback(keep)


def audit_caches(target: DecoderModel, drafter: DecoderModel | None, rows: Rows) -> list[str]:
    """Problems with the caches of ``rows`` (empty when every invariant holds)."""
    problems = []
    problems += _audit_one("target", target, rows.target_cache, rows, exact_lag=True)
    if is_mtp(drafter) and rows.draft_cache is not None:
        problems += _audit_mtp(target, drafter, rows)
    elif drafter is not None and rows.draft_cache is not None:
        problems += _audit_one("drafter", drafter, rows.draft_cache, rows, exact_lag=False)
    return problems


def _audit_mtp(target, drafter, rows: Rows, tol: float = 1e-3) -> list[str]:
    """The MTP module's cache holds entries 0 .. at most s_len - 2, each made from the target's
    hidden state (``mtp_step``): feeding the rest through it gives the logits of a fresh pass
    over the entries a cache-free target pass implies."""
    problems = []
    for b in range(rows.seq.shape[0]):
        s_len, held = int(rows.s_len[b]), int(rows.draft_cache.lengths[b])
        if held > s_len - 2:
            problems.append(f"row {b}: MTP cache holds {held} entries, sequence {s_len}")
            continue
        seq = rows.seq[b : b + 1, :s_len]
        _, hidden = target(seq, return_hidden=True)
        entries = torch.tensor([s_len - 1])
        fresh = drafter(seq[:, 1:], hidden[:, :-1], drafter.new_cache(1, s_len), entries)[0]
        one = rows.draft_cache.view(b, b + 1)
        cached = drafter(seq[:, held + 1 :], hidden[:, held:-1], one, entries - held)[0]
        one.rollback([held])
        gap = float((fresh[0, -1] - cached[0, -1]).abs().max())
        if gap > tol:
            problems.append(f"row {b}: MTP cached logits differ from a fresh pass by {gap:.3g}")
    return problems


def _audit_one(name, model, cache, rows: Rows, exact_lag: bool, tol: float = 1e-3) -> list[str]:
    problems = []
    for b in range(rows.seq.shape[0]):
        s_len, held = int(rows.s_len[b]), int(cache.lengths[b])
        if held > s_len - 1 or (exact_lag and held != s_len - 1):
            problems.append(f"row {b}: {name} cache holds {held} tokens, sequence {s_len}")
            continue
        seq = rows.seq[b : b + 1, :s_len]
        fresh = model(seq)[0, -1]
        one = cache.view(b, b + 1)
        cached = model(seq[:, held:], one)[0, -1]
        one.rollback([held])
        gap = float((fresh - cached).abs().max())
        if gap > tol:
            problems.append(f"row {b}: {name} cached logits differ from a fresh pass by {gap:.3g}")
    return problems
