"""Tree steps' acceptance: each step's accepted length drawn from the profile's distribution.

A tree entry gives P(a step accepts j nodes), j = 0 .. depth (``TreeAcceptance``). With
S_j = P(at least j accepted), the chain model with conditional rates a_j = S_j / S_(j-1)
accepts at least j drafts with probability a_1 ... a_j = S_j: so ``RateAcceptance`` on those
rates draws exactly the tree's distribution, one uniform per row and step from the pool's
acceptance stream as a chain's draws are, and rows near the end of a request are capped at the
drafts they have room for as chains are. Trees carry no per-request heterogeneity (the table
has no concentration): every request draws from the same distribution.
"""

from __future__ import annotations

import numpy as np

from specsim.profile.acceptance import TreeAcceptance
from specsim.simulation.acceptance import RateAcceptance


def tree_rates(accepted_length: list[float]) -> np.ndarray:
    """Conditional rates a_1..a_depth whose chain gives ``accepted_length``."""
    dist = np.asarray(accepted_length, dtype=np.float64)
    survival = np.clip(dist[::-1].cumsum()[::-1], 0.0, 1.0)  # survival[j] = P(accepted >= j)
    rates = np.zeros(dist.shape[0] - 1)
    reached = survival[:-1]
    np.divide(survival[1:], reached, out=rates, where=reached > 0.0)
    return np.minimum(rates, 1.0)


class TreeLengthAcceptance(RateAcceptance):
    """``RateAcceptance`` on a tree entry's accepted-length distribution (see the module)."""

    def __init__(self, entry: TreeAcceptance):
        super().__init__(tree_rates(entry.accepted_length))
        self.entry = entry
