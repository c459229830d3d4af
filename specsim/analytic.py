"""Closed forms for speculative decoding with an i.i.d. per-draft acceptance rate alpha.

With each of k drafts accepted independently with probability alpha, a step emits the accepted
prefix plus one token, so (Leviathan et al., 2023, "Fast inference from transformers via
speculative decoding"):

- expected tokens per step: (1 - alpha^(k+1)) / (1 - alpha)
- walltime improvement over plain decoding, when a draft pass costs c target passes and a
  verification pass costs one: (1 - alpha^(k+1)) / ((1 - alpha) (k c + 1))
- increase in arithmetic operations, with c_hat = drafter / target operations per token:
  (1 - alpha) (k c_hat + k + 1) / (1 - alpha^(k+1))
- the optimal k maximises the walltime improvement.

These hold at batch 1 with memory-bound passes (verification costs one pass whatever k); the
simulator reproduces them there and departs from them as batches grow.
"""

from __future__ import annotations

import numpy as np


def _check(alpha: float, k: int) -> None:
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")


def expected_tokens_per_step(alpha: float, k: int) -> float:
    """E[tokens emitted by one step] = 1 + alpha + ... + alpha^k."""
    _check(alpha, k)
    if alpha == 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def walltime_improvement(alpha: float, k: int, c: float) -> float:
    """Speedup over plain decoding when a draft pass costs ``c`` target passes."""
    if c < 0:
        raise ValueError(f"c must be >= 0, got {c}")
    return expected_tokens_per_step(alpha, k) / (k * c + 1.0)


def arithmetic_operations_increase(alpha: float, k: int, c_hat: float) -> float:
    """Factor by which total arithmetic grows (target verifies k + 1 positions per step)."""
    if c_hat < 0:
        raise ValueError(f"c_hat must be >= 0, got {c_hat}")
    return (k * c_hat + k + 1.0) / expected_tokens_per_step(alpha, k)


def optimal_k(alpha: float, c: float, k_max: int = 32) -> int:
    """The k in 0..k_max with the largest walltime improvement (ties go to the smaller k)."""
    gains = [walltime_improvement(alpha, k, c) for k in range(k_max + 1)]
    return int(np.argmax(gains))
