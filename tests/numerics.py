"""Tolerances derived from the floating-point format and the magnitudes compared.

Two evaluations of one computation that differ only in the order of their sums (batched against
one row at a time, chunked against whole, another CPU's kernels) agree to within their rounding.
A sum of n terms of magnitude at most ``scale`` carries at most n * u * scale rounding error, with
u = eps / 2 the unit roundoff (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed.,
section 3.1); each evaluation carries its own, so they differ by at most 2 n u scale, and
``stages`` stacked reductions (a network's layers) add one such term each.
"""

from __future__ import annotations

import torch


def rounding_tolerance(
    dtype: torch.dtype, scale: float, reduction_length: int, stages: int = 1
) -> float:
    """Largest difference two summation orders may give: 2 * n * u * scale per stage."""
    unit_roundoff = torch.finfo(dtype).eps / 2
    return 2.0 * reduction_length * unit_roundoff * max(1.0, scale) * stages


def decoder_tolerance(config, expected: torch.Tensor, dtype: torch.dtype = torch.float32) -> float:
    """The bound for a decoder's logits: its longest reduction (hidden, MLP or context length),
    scaled by the largest logit, once per layer and once for the output head."""
    longest = max(config.hidden_size, config.intermediate_size, config.max_position)
    scale = float(expected.abs().max()) if expected.numel() else 0.0
    return rounding_tolerance(dtype, scale, longest, config.num_layers + 1)
