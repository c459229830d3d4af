"""The random numbers a verifier consumes, drawn in one documented order from a torch.Generator.

Verifiers never draw random numbers themselves: they take a ``VerifierRandomness`` so that a
result can be reproduced, compared row by row, or driven by hand-picked uniforms in tests.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class VerifierRandomness:
    """Uniforms in [0, 1) for one verification step of ``B`` rows and window ``k``.

    ``accept`` ``[B, k]``: one uniform per drafted position, for the accept test.
    ``sample`` ``[B]``: one uniform per row, for the single token sampled after the accepted
    prefix (from the residual on a rejection, or the bonus token from p when all drafts pass).
    One is enough because each row samples at most one such token per step.
    """

    accept: torch.Tensor
    sample: torch.Tensor

    def rows(self, index: torch.Tensor | slice | int) -> VerifierRandomness:
        """The uniforms of a subset of rows (for per-row comparisons)."""
        if isinstance(index, int):
            index = slice(index, index + 1)
        return VerifierRandomness(self.accept[index], self.sample[index])


def draw_randomness(
    generator: torch.Generator,
    batch: int,
    k: int,
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float64,
) -> VerifierRandomness:
    """Draw ``accept`` ``[batch, k]`` then ``sample`` ``[batch]`` from ``generator``.

    The draw order is fixed, so the same generator state gives the same step. float64 uniforms
    keep the accept test unbiased to ~1e-16; verifiers cast them to p's dtype where needed.
    """
    accept = torch.rand((batch, k), generator=generator, device=device, dtype=dtype)
    sample = torch.rand((batch,), generator=generator, device=device, dtype=dtype)
    return VerifierRandomness(accept, sample)
