"""Input checks for the sampling core: bad tensors fail loudly, never give a silent wrong answer.

The checks are cheap enough for the hot path: one reduction over each probability tensor (the row
sums, which also expose NaN, ±inf, logits and unnormalised rows) plus checks on the few values a
verifier tests (p(x), q(x), token ids, uniforms). A negative entry hidden in a row whose sum is
still 1 is not searched for: no realistic producer makes one, and it would cost another full pass
over p and q."""

from __future__ import annotations

import torch

from specsim.errors import SpecsimError


class SamplingInputError(SpecsimError, ValueError):
    """A tensor given to the sampling core has the wrong shape, type, range or contents.

    It is both a ``SpecsimError`` (the CLI prints it as one line, exit 2) and a ``ValueError``.
    """


def sum_tolerance(dtype: torch.dtype) -> float:
    """How far a row sum may stray from 1 for probabilities stored in ``dtype``."""
    eps = torch.finfo(dtype).eps
    # Summing V values of relative error eps drifts like sqrt(V) * eps; 4 * sqrt(eps) leaves room
    # for V up to ~10^6 in float32 (1.4e-3) while still catching logits passed as probabilities.
    return 4.0 * eps**0.5


def require_float(x: torch.Tensor, name: str, ndim: int, shape_doc: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise SamplingInputError(
            f"expected a torch.Tensor, got {type(x).__name__}", key=name, fix=f"pass {shape_doc}"
        )
    if not x.is_floating_point():
        raise SamplingInputError(
            f"expected a floating-point tensor, got {x.dtype}", key=name, fix=f"pass {shape_doc}"
        )
    if x.ndim != ndim:
        raise SamplingInputError(
            f"expected {ndim} dimensions, got shape {tuple(x.shape)}", key=name, fix=shape_doc
        )


def check_row_sums(probs: torch.Tensor, name: str, valid: torch.Tensor | None = None) -> None:
    """Every row (last axis) selected by ``valid`` must be finite and sum to 1 within tolerance."""
    sums = probs.sum(dim=-1, dtype=torch.float64 if probs.dtype == torch.float64 else torch.float32)
    bad = ~(sums - 1.0).abs().le(sum_tolerance(probs.dtype))  # NaN compares False: flagged too
    if valid is not None:
        bad &= valid
    if bool(bad.any()):
        index = tuple(int(i) for i in bad.nonzero()[0])
        value = float(sums[index])
        what = "is not finite" if value != value or abs(value) == float("inf") else "sums to"
        detail = f"row {list(index)} {what}" + ("" if what != "sums to" else f" {value:.6g}")
        raise SamplingInputError(
            f"{detail}, not 1",
            key=name,
            fix="pass probabilities (e.g. from process_logits), not logits, with no NaN",
        )


def check_non_negative(values: torch.Tensor, name: str) -> None:
    # amin is one cheap reduction; (values < 0).any() would build a bool tensor first. NaN
    # propagates through amin and is reported too.
    if values.numel() and not bool(values.amin() >= 0):
        raise SamplingInputError(
            "has negative (or NaN) probabilities", key=name, fix="pass probabilities, not logits"
        )


def check_tokens(
    tokens: torch.Tensor,
    vocab: int,
    name: str,
    valid: torch.Tensor | None = None,
) -> None:
    """Token ids at ``valid`` positions must lie in [0, vocab)."""
    if not isinstance(tokens, torch.Tensor) or tokens.is_floating_point() or tokens.is_complex():
        raise SamplingInputError(
            "expected an integer tensor of token ids", key=name, fix="pass torch.long token ids"
        )
    outside = (tokens < 0) | (tokens >= vocab)
    if valid is not None:
        outside &= valid
    if bool(outside.any()):
        index = tuple(int(i) for i in outside.nonzero()[0])
        token = int(tokens[index])
        raise SamplingInputError(
            f"token {token} at {list(index)} is outside the vocabulary [0, {vocab})",
            key=name,
            fix="draft tokens must index the last axis of p; pad unused positions with -1",
        )


def check_uniforms(u: torch.Tensor, name: str, shape: tuple[int, ...]) -> None:
    if not isinstance(u, torch.Tensor) or not u.is_floating_point():
        raise SamplingInputError(
            "expected a floating-point tensor of uniforms", key=name, fix="use draw_randomness"
        )
    if tuple(u.shape) != shape:
        raise SamplingInputError(
            f"expected shape {shape}, got {tuple(u.shape)}", key=name, fix="use draw_randomness"
        )
    if u.numel() and not bool(((u >= 0) & (u < 1)).all()):
        raise SamplingInputError(
            "uniforms must lie in [0, 1)", key=name, fix="use draw_randomness or torch.rand"
        )
