"""The three verifiers: exact rejection sampling, greedy, and (lossy) typical acceptance.

Every verifier is a pure function of explicit inputs, batched over rows ``b``:

- ``p`` ``[B, k+1, V]``: target probabilities at each drafted position plus the bonus position;
- ``q`` ``[B, k, V]``: the drafter's *processed* probabilities, or ``None`` for a deterministic
  drafter (n-gram, prompt lookup, greedy drafter): q is then one-hot at the drafted token;
- ``draft_tokens`` ``[B, k]`` int64;
- ``n_drafts`` ``[B]`` int64 or ``None`` (= k): row b uses only its first ``n_drafts[b]``
  positions (ragged windows); positions beyond it may hold padding (token -1, any p/q values);
- ``randomness``: a ``VerifierRandomness`` (``accept`` ``[B, k]``, ``sample`` ``[B]``).

They return a ``VerifyResult``. Only the row's final position (the first rejection, or the bonus
position) is read in full; the residual is built and sampled only for rows that rejected.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from specsim.sampling.logits import sample_from_probs
from specsim.sampling.randomness import VerifierRandomness
from specsim.sampling.validation import (
    SamplingInputError,
    check_non_negative,
    check_row_sums,
    check_tokens,
    check_uniforms,
    require_float,
)

TYPICAL_EPSILON = 0.09
TYPICAL_DELTA = 0.3

# (p rows [R, V], q rows [R, V]) -> unnormalised residual rows [R, V], all >= 0.
ResidualFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class VerifyResult:
    """What one verification step emitted, per row.

    ``accepted`` ``[B]`` int64: drafts accepted (0..n_drafts[b]).
    ``tokens`` ``[B, k+1]`` int64: the accepted drafts then one corrected or bonus token, i.e.
    ``accepted[b] + 1`` tokens, padded with -1.
    ``accepted_mask`` ``[B, k]`` bool: True at the accepted prefix only (counted causally, as
    vLLM does: a draft after the first rejection is never counted as accepted).
    """

    accepted: torch.Tensor
    tokens: torch.Tensor
    accepted_mask: torch.Tensor

    @property
    def emitted(self) -> torch.Tensor:
        """Tokens emitted per row, ``accepted + 1``."""
        return self.accepted + 1


@dataclass(frozen=True)
class _Step:
    """Validated inputs plus the quantities every verifier needs."""

    p: torch.Tensor
    q: torch.Tensor | None
    draft: torch.Tensor  # padding replaced by 0 so it can index
    n_drafts: torch.Tensor
    drafted: torch.Tensor  # [B, k] bool: position i < n_drafts[b]

    @property
    def k(self) -> int:
        return self.draft.shape[1]


def verify_rejection(
    p: torch.Tensor,
    q: torch.Tensor | None,
    draft_tokens: torch.Tensor,
    n_drafts: torch.Tensor | None = None,
    randomness: VerifierRandomness | None = None,
    *,
    validate: bool = True,
) -> VerifyResult:
    """Exact modified rejection sampling: the emitted tokens are distributed exactly as p.

    Accept draft x at position i with probability min(1, p(x)/q(x)) (``u * q(x) < p(x)``, so no
    division); on the first rejection sample from norm(max(0, p - q)) there and stop; if all
    drafts pass, sample a bonus token from p at position ``n_drafts[b]``. With ``q=None`` the
    drafter is deterministic (one-hot q): accept with probability p(x); the residual is p with x
    removed, renormalised. A drafted token with q(x) = 0 (the drafter could not have proposed it,
    usually a sign that q is not the distribution the draft came from) is accepted iff p(x) > 0.

    The residual cannot be all zeros at a rejection: rejecting x means p(x) < q(x), so p != q and
    sum(max(0, p - q)) = TV(p, q) > 0. In floating point it can round to zero when p and q agree
    to within rounding; the row then falls back to p, which is then equal to the exact answer up
    to that rounding.
    """
    step = _prepare(p, q, draft_tokens, n_drafts, randomness, validate, needs_uniforms=True)
    return _speculative_step(step, randomness, _exact_residual, validate)


def verify_greedy(
    p: torch.Tensor,
    q: torch.Tensor | None,
    draft_tokens: torch.Tensor,
    n_drafts: torch.Tensor | None = None,
    randomness: VerifierRandomness | None = None,
    *,
    validate: bool = True,
) -> VerifyResult:
    """Greedy verification: accept while draft == argmax p; the corrected/bonus token is argmax p.

    Lossless in the greedy sense: the emitted stream equals target-only greedy decoding (argmax
    at every step), whatever the drafter. q and ``randomness`` are accepted for a uniform
    signature and ignored. Ties in argmax go to the lowest token id, as ``torch.argmax``.
    """
    step = _prepare(p, q, draft_tokens, n_drafts, randomness, validate, needs_uniforms=False)
    best = step.p.argmax(dim=-1)  # [B, k+1]
    ok = (step.draft == best[:, : step.k]) & step.drafted
    accepted, mask = _accepted_prefix(ok)
    final = best.gather(1, accepted.unsqueeze(1)).squeeze(1)
    return _assemble(step, accepted, mask, final)


def verify_typical(
    p: torch.Tensor,
    q: torch.Tensor | None,
    draft_tokens: torch.Tensor,
    n_drafts: torch.Tensor | None = None,
    randomness: VerifierRandomness | None = None,
    *,
    epsilon: float = TYPICAL_EPSILON,
    delta: float = TYPICAL_DELTA,
    validate: bool = True,
) -> VerifyResult:
    """Medusa typical acceptance. LOSSY: the output is NOT distributed as p.

    Accept x iff p(x) > min(epsilon, delta * exp(-H(p))) with H the entropy of p (nats) at that
    position; at the first failure emit argmax p and stop; if all drafts pass, sample the bonus
    token from p (as vLLM does). It trades exactness for acceptance; the checker reports its
    total-variation distance from the target. q is ignored.
    """
    step = _prepare(p, q, draft_tokens, n_drafts, randomness, validate, needs_uniforms=True)
    drafted_p = step.p[:, : step.k]
    entropy = torch.special.entr(drafted_p).sum(dim=-1)  # [B, k], 0 log 0 = 0
    threshold = torch.clamp(delta * torch.exp(-entropy), max=epsilon)
    p_x = drafted_p.gather(-1, step.draft.unsqueeze(-1)).squeeze(-1)
    ok = (p_x > threshold) & step.drafted
    accepted, mask = _accepted_prefix(ok)
    final_p = _final_rows(step.p, accepted)
    if validate:
        check_non_negative(final_p, "p")
    rejected = accepted < step.n_drafts
    bonus = sample_from_probs(final_p, randomness.sample, validate=False)
    final = torch.where(rejected, final_p.argmax(dim=-1), bonus)
    return _assemble(step, accepted, mask, final)


# ----------------------------------------------------------------------------------------------
# Shared machinery (also used by the negative controls).


def _speculative_step(
    step: _Step,
    randomness: VerifierRandomness,
    residual: ResidualFn,
    validate: bool,
    accept_uniforms: torch.Tensor | None = None,
) -> VerifyResult:
    """Rejection-sampling skeleton with a pluggable residual (the controls swap it)."""
    p, k = step.p, step.k
    u = randomness.accept if accept_uniforms is None else accept_uniforms
    p_x = p[:, :k].gather(-1, step.draft.unsqueeze(-1)).squeeze(-1)  # [B, k]
    q_x = (
        torch.ones_like(p_x)
        if step.q is None
        else step.q.gather(-1, step.draft.unsqueeze(-1)).squeeze(-1).to(p.dtype)
    )
    if validate:
        check_non_negative(p_x[step.drafted], "p")
        check_non_negative(q_x[step.drafted], "q")
    # The test runs in float64 (B*k values only): a float64 uniform rounded to float32 could
    # become 1.0 and reject a draft with p(x) = q(x).
    ok = (u.double() * q_x.double() < p_x.double()) & step.drafted
    accepted, mask = _accepted_prefix(ok)
    final_p = _final_rows(p, accepted)  # [B, V]: position accepted[b] of each row
    if validate:
        check_non_negative(final_p, "p")
    rejected_rows = (accepted < step.n_drafts).nonzero().squeeze(-1)
    if rejected_rows.numel():
        at = accepted[rejected_rows]
        p_rej = final_p[rejected_rows]
        if step.q is None:
            q_rej = torch.zeros_like(p_rej)
            q_rej.scatter_(-1, step.draft[rejected_rows, at].unsqueeze(-1), 1.0)
        else:
            q_rej = step.q[rejected_rows, at].to(p.dtype)
            if validate:
                check_non_negative(q_rej, "q")
        res = residual(p_rej, q_rej)
        mass = res.sum(dim=-1, keepdim=True)
        res = torch.where((mass > 0) & torch.isfinite(mass), res, p_rej)
        final_p[rejected_rows] = res
    final = sample_from_probs(final_p, randomness.sample, validate=False)
    return _assemble(step, accepted, mask, final)


def _exact_residual(p_rows: torch.Tensor, q_rows: torch.Tensor) -> torch.Tensor:
    return torch.clamp(p_rows - q_rows, min=0)


def _accepted_prefix(ok: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    mask = torch.cumprod(ok.to(torch.int8), dim=1).bool()
    return mask.sum(dim=1), mask


def _final_rows(p: torch.Tensor, accepted: torch.Tensor) -> torch.Tensor:
    rows = torch.arange(p.shape[0], device=p.device)
    return p[rows, accepted]  # advanced indexing copies: safe to modify in place


def _assemble(
    step: _Step, accepted: torch.Tensor, mask: torch.Tensor, final: torch.Tensor
) -> VerifyResult:
    batch, k = step.draft.shape
    tokens = torch.full((batch, k + 1), -1, dtype=torch.long, device=step.draft.device)
    tokens[:, :k] = torch.where(mask, step.draft, tokens[:, :k])
    tokens.scatter_(1, accepted.unsqueeze(1), final.unsqueeze(1))
    return VerifyResult(accepted=accepted, tokens=tokens, accepted_mask=mask)


def _prepare(
    p: torch.Tensor,
    q: torch.Tensor | None,
    draft_tokens: torch.Tensor,
    n_drafts: torch.Tensor | int | None,
    randomness: VerifierRandomness | None,
    validate: bool,
    needs_uniforms: bool,
) -> _Step:
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
    return _Step(p=p, q=q, draft=draft, n_drafts=n, drafted=drafted)


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
