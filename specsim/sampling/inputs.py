"""Checking and normalising a verifier's inputs (shared by the verifiers and the controls)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specsim.sampling.randomness import VerifierRandomness
from specsim.sampling.validation import (
    SamplingInputError,
    check_row_sums,
    check_tokens,
    check_uniforms,
    require_float,
)


@dataclass(frozen=True)
class Step:
    """Validated inputs plus the quantities every verifier needs."""

    p: torch.Tensor
    q: torch.Tensor | None
    draft: torch.Tensor  # padding replaced by 0 so it can index
    n_drafts: torch.Tensor
    drafted: torch.Tensor  # [B, k] bool: position i < n_drafts[b]

    @property
    def k(self) -> int:
        return self.draft.shape[1]


def prepare(
    p: torch.Tensor,
    q: torch.Tensor | None,
    draft_tokens: torch.Tensor,
    n_drafts: torch.Tensor | int | None,
    randomness: VerifierRandomness | None,
    validate: bool,
    needs_uniforms: bool,
) -> Step:
    """Check shapes (always) and contents (with ``validate``) and build the ``Step``.

    Shapes are always checked because they are free; contents (token range, row sums, uniforms)
    only with ``validate``. Padded draft tokens become 0 so that they can index.
    """
    require_float(p, "p", 3, "p as [B, k+1, V]")
    batch, positions, vocab = p.shape
    k = positions - 1
    if not isinstance(draft_tokens, torch.Tensor) or tuple(draft_tokens.shape) != (batch, k):
        shape = getattr(draft_tokens, "shape", None)
        raise SamplingInputError(
            f"expected shape {(batch, k)} to match p {tuple(p.shape)}, got {shape}",
            key="draft_tokens",
            fix="p has one more position than there are drafts: [B, k+1, V] vs [B, k]",
        )
    if q is not None:
        require_float(q, "q", 3, "q as [B, k, V], or None for a deterministic drafter")
        if tuple(q.shape) != (batch, k, vocab):
            raise SamplingInputError(
                f"expected shape {(batch, k, vocab)} to match p {tuple(p.shape)}, "
                f"got {tuple(q.shape)}",
                key="q",
                fix="q covers the k drafted positions: [B, k, V]",
            )
    n = _n_drafts(n_drafts, batch, k, p.device)
    drafted = torch.arange(k, device=p.device) < n.unsqueeze(1)
    if validate:
        check_tokens(draft_tokens, vocab, "draft_tokens", drafted)
        scored = torch.arange(k + 1, device=p.device) <= n.unsqueeze(1)
        check_row_sums(p, "p", scored)
        if q is not None:
            check_row_sums(q, "q", drafted)
    if needs_uniforms:
        if randomness is None:
            raise SamplingInputError(
                "this verifier needs its random numbers",
                key="randomness",
                fix="pass draw_randomness(generator, B, k)",
            )
        if validate:
            check_uniforms(randomness.accept, "randomness.accept", (batch, k))
            check_uniforms(randomness.sample, "randomness.sample", (batch,))
    draft = torch.where(drafted, draft_tokens.long(), torch.zeros_like(draft_tokens.long()))
    return Step(p=p, q=q, draft=draft, n_drafts=n, drafted=drafted)


def _n_drafts(
    n_drafts: torch.Tensor | int | None, batch: int, k: int, device: torch.device
) -> torch.Tensor:
    if n_drafts is None:
        return torch.full((batch,), k, dtype=torch.long, device=device)
    n = torch.as_tensor(n_drafts, device=device)
    if n.is_floating_point() or n.is_complex():
        raise SamplingInputError("expected integers", key="n_drafts", fix="pass int64 counts")
    n = n.long().expand(batch) if n.ndim == 0 else n.long()
    if tuple(n.shape) != (batch,) or bool(((n < 0) | (n > k)).any()):
        raise SamplingInputError(
            f"expected {batch} counts in [0, {k}]",
            key="n_drafts",
            fix="one count per row, at most the window k",
        )
    return n
