"""The three verifiers: exact rejection sampling, greedy, and (lossy) typical acceptance.

Every verifier is a pure function of explicit inputs, batched over rows ``b``:

- ``p`` ``[B, k+1, V]``: target probabilities at each drafted position plus the bonus position;
- ``q`` ``[B, k, V]``: the drafter's *processed* probabilities, or ``None`` for a deterministic
  drafter (n-gram, prompt lookup, greedy drafter): q is then one-hot at the drafted token;
- ``draft_tokens`` ``[B, k]`` int64;
- ``n_drafts`` ``[B]`` int64 or ``None`` (= k): row b uses only its first ``n_drafts[b]``
  positions (ragged windows); positions beyond it may hold padding (token -1, any p/q values);
- ``randomness``: a ``VerifierRandomness`` (``accept`` ``[B, k]``, ``sample`` ``[B]``).

They return a ``VerifyResult``. Apart from validation, a row's p (and q) is read in full only at
its final position (the first rejection, or the bonus position); the residual is built and sampled
only for rows that rejected.

``validate=True`` (the default) checks shapes, token ids, the window counts and the uniforms, that
every used row of p and q sums to 1 (which exposes NaN, inf, logits, log-probabilities and
unnormalised rows), and the sign of p(x) and q(x) at every tested draft. A negative entry hidden
in a row that still sums to 1 is not searched for: no realistic producer makes one, and finding
it would cost another pass over the rows. The row sums are one read of p and q, about as much as the
verification itself; ``validate=False`` skips all of it for inputs known to be good (e.g. straight
from ``process_logits``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from specsim.sampling.inputs import Step, prepare
from specsim.sampling.logits import inverse_cdf, sample_from_probs
from specsim.sampling.randomness import VerifierRandomness
from specsim.sampling.reference import TYPICAL_DELTA, TYPICAL_EPSILON
from specsim.sampling.validation import SamplingInputError, check_non_negative

# (p rows [R, V], q rows [R, V]) -> unnormalised residual rows [R, V], all >= 0. The p rows are
# a private copy that the function may overwrite.
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
    return _speculative_rows(
        p, q, draft_tokens, n_drafts, randomness, validate, residual=_exact_residual
    )


def _speculative_rows(
    p,
    q,
    draft_tokens,
    n_drafts,
    randomness,
    validate,
    residual,
    shared_uniform=False,
    stale_bonus=False,
) -> VerifyResult:
    """verify_rejection with a swappable residual, optionally one shared accept uniform, and
    optionally the bonus drawn one position early: the negative controls are built from it."""
    step = prepare(p, q, draft_tokens, n_drafts, randomness, validate, True)
    accept_uniforms = None
    if shared_uniform:
        accept_uniforms = randomness.accept[:, :1].expand_as(randomness.accept)
    bonus_shift = 1 if stale_bonus else 0
    return _speculative_step(step, randomness, residual, validate, accept_uniforms, bonus_shift)


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
    step = prepare(p, q, draft_tokens, n_drafts, randomness, validate, False)
    final = torch.empty_like(step.n_drafts)

    def decide(position, rows):
        best = _rows_at(step.p, rows, torch.full_like(rows, position)).argmax(dim=-1)
        passed = torch.zeros_like(rows, dtype=torch.bool)
        if position < step.k:
            drafting = position < step.n_drafts[rows]
            passed = drafting & (best == step.draft[rows, position])
        final[rows[~passed]] = best[~passed]
        return passed

    accepted = _walk_positions(step, decide)
    return _assemble(step, accepted, _prefix_mask(accepted, step.k), final)


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
    step = prepare(p, q, draft_tokens, n_drafts, randomness, validate, True)
    final = torch.empty_like(step.n_drafts)
    tiny = torch.finfo(p.dtype).tiny

    def read(rows, position):
        return _rows_at(step.p, rows, torch.full_like(rows, position))

    def decide(position, rows):
        passed = torch.zeros_like(rows, dtype=torch.bool)
        is_last = position == step.n_drafts[rows]
        if bool(is_last.any()):
            last = rows[is_last]
            bonus = sample_from_probs(read(last, position), randomness.sample[last], validate=False)
            final[last] = bonus
        drafting = (~is_last).nonzero().squeeze(-1)
        if drafting.numel() == 0:
            return passed
        draft_rows = rows[drafting]
        x = step.draft[draft_rows, position]
        p_x = step.p[draft_rows, position, x]
        # The threshold never exceeds epsilon, so p(x) > epsilon passes without the entropy:
        # full rows are read only for the undecided drafts.
        ok = p_x > epsilon
        undecided = (~ok).nonzero().squeeze(-1)
        if undecided.numel():
            p_rows = read(draft_rows[undecided], position)
            # Entropy in nats; 0 * log(tiny) = 0 gives 0 log 0 = 0 without a NaN.
            entropy = -(p_rows * p_rows.clamp_min(tiny).log()).sum(dim=-1)
            threshold = torch.clamp(delta * torch.exp(-entropy), max=epsilon)
            ok_here = p_x[undecided] > threshold
            ok[undecided] = ok_here
            final[draft_rows[undecided][~ok_here]] = p_rows[~ok_here].argmax(dim=-1)
        passed[drafting] = ok
        return passed

    accepted = _walk_positions(step, decide)
    return _assemble(step, accepted, _prefix_mask(accepted, step.k), final)


def acceptance_probabilities(
    p: torch.Tensor, q: torch.Tensor | None, draft_tokens: torch.Tensor | None = None
) -> torch.Tensor:
    """Per-position acceptance probability of exact verification, ``[..., k]``.

    beta_i = sum_x min(p_i(x), q_i(x)) = 1 - TV(p_i, q_i): the chance that a draft sampled from
    q_i passes at position i, given the prefix. ``p`` ``[..., k(+1), V]`` (a bonus position is
    ignored), ``q`` ``[..., k, V]``; with ``q=None`` (deterministic drafter) it is p_i(x_i) for
    the drafted ``draft_tokens`` ``[..., k]``. Chaining these along real steps (not averaging
    over a text) gives the per-position rates the simulator needs.
    """
    if q is None:
        if draft_tokens is None:
            raise SamplingInputError(
                "a deterministic drafter needs its draft tokens", key="draft_tokens"
            )
        k = draft_tokens.shape[-1]
        return p[..., :k, :].gather(-1, draft_tokens.long().unsqueeze(-1)).squeeze(-1)
    k = q.shape[-2]
    return torch.minimum(p[..., :k, :], q).sum(dim=-1)


# ----------------------------------------------------------------------------------------------
# Shared machinery (also used by the negative controls).


def _walk_positions(step: Step, decide) -> torch.Tensor:
    """Visit positions 0..k, each only for the rows still accepting: ``decide(position, rows)``
    returns which of ``rows`` pass (and records the final token of those that stop). A row stops
    at its first failure or at position n_drafts[b], so p is read only where a row gets to.
    Returns the accepted counts."""
    accepted = torch.zeros_like(step.n_drafts)
    rows = torch.arange(step.p.shape[0], device=step.p.device)
    for position in range(step.k + 1):
        if rows.numel() == 0:
            break
        rows = rows[decide(position, rows)]
        accepted[rows] += 1
    return accepted


def _prefix_mask(accepted: torch.Tensor, k: int) -> torch.Tensor:
    return torch.arange(k, device=accepted.device) < accepted.unsqueeze(1)


def _speculative_step(
    step: Step,
    randomness: VerifierRandomness,
    residual: ResidualFn,
    validate: bool,
    accept_uniforms: torch.Tensor | None = None,
    bonus_shift: int = 0,
) -> VerifyResult:
    """Rejection-sampling skeleton with a pluggable residual (the controls swap it).

    The accept test needs only p(x) and q(x), gathered; full rows of p (and q) are read once per
    row, at its final position: the bonus rows sample p there, the rejected rows build and
    sample the residual there.
    """
    p, k = step.p, step.k
    u = randomness.accept if accept_uniforms is None else accept_uniforms
    p_x = p[:, :k].gather(-1, step.draft.unsqueeze(-1)).squeeze(-1)  # [B, k]
    q_x = (
        torch.ones_like(p_x)
        if step.q is None
        else step.q.gather(-1, step.draft.unsqueeze(-1)).squeeze(-1)
    )
    if validate:
        check_non_negative(p_x[step.drafted], "p")
        check_non_negative(q_x[step.drafted], "q")
    # The test runs in float64 (B*k values only): a float64 uniform rounded to float32 could
    # become 1.0 and reject a draft with p(x) = q(x).
    ok = (u.double() * q_x.double() < p_x.double()) & step.drafted
    accepted, mask = _accepted_prefix(ok)
    final = torch.empty_like(accepted)
    rejected = accepted < step.n_drafts
    bonus_rows = (~rejected).nonzero().squeeze(-1)
    if bonus_rows.numel():
        at = (accepted[bonus_rows] - bonus_shift).clamp_(min=0)  # shift: the stale-bonus control
        p_bonus = _rows_at(p, bonus_rows, at)
        final[bonus_rows] = sample_from_probs(
            p_bonus, randomness.sample[bonus_rows], validate=False
        )
    rejected_rows = rejected.nonzero().squeeze(-1)
    if rejected_rows.numel():
        final[rejected_rows] = _sample_residual(step, rejected_rows, accepted, randomness, residual)
    return _assemble(step, accepted, mask, final)


def _sample_residual(step: Step, rows, accepted, randomness, residual) -> torch.Tensor:
    at = accepted[rows]
    p_rej = _rows_at(step.p, rows, at)  # a fresh copy: the residual may overwrite it
    x = step.draft[rows, at].unsqueeze(-1)
    if step.q is None and residual is _exact_residual:
        # max(0, p - onehot(x)) is p with x removed, since p(x) <= 1.
        res = p_rej.scatter_(-1, x, 0.0)
    else:
        if step.q is None:
            q_rej = torch.zeros_like(p_rej).scatter_(-1, x, 1.0)
        else:
            q_rej = _rows_at(step.q, rows, at).to(p_rej.dtype)
        res = residual(p_rej, q_rej)
    u = randomness.sample[rows]
    tokens, mass = inverse_cdf(res, u)
    # Guard: an all-zero residual (p and q equal up to rounding) falls back to p; see
    # verify_rejection. Rare, so only those rows are read again.
    degenerate = ~((mass > 0) & torch.isfinite(mass))
    if bool(degenerate.any()):
        fallback = _rows_at(step.p, rows[degenerate], at[degenerate])
        tokens[degenerate] = sample_from_probs(fallback, u[degenerate], validate=False)
    return tokens


def _rows_at(x: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """``x[rows, positions]`` as a fresh ``[R, V]`` tensor (index_select is the fast gather)."""
    if not x.is_contiguous():
        return x[rows, positions]
    return x.view(-1, x.shape[-1]).index_select(0, rows * x.shape[1] + positions)


def _exact_residual(p_rows: torch.Tensor, q_rows: torch.Tensor) -> torch.Tensor:
    return p_rows.sub_(q_rows).clamp_(min=0)


def _accepted_prefix(ok: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    mask = torch.cumprod(ok.to(torch.int8), dim=1).bool()
    return mask.sum(dim=1), mask


def _assemble(
    step: Step, accepted: torch.Tensor, mask: torch.Tensor, final: torch.Tensor
) -> VerifyResult:
    batch, k = step.draft.shape
    tokens = torch.full((batch, k + 1), -1, dtype=torch.long, device=step.draft.device)
    tokens[:, :k] = torch.where(mask, step.draft, tokens[:, :k])
    tokens.scatter_(1, accepted.unsqueeze(1), final.unsqueeze(1))
    return VerifyResult(accepted=accepted, tokens=tokens, accepted_mask=mask)
