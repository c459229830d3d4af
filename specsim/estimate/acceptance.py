"""What a step of window k emits, in expectation: the simulator's own acceptance chains.

The chains are ``specsim.simulation.acceptance.RateAcceptance``'s survival table (the rates that
reproduce the profile's mean acceptance length per window, one chain per acceptance level when
requests differ), so the estimate and the simulation cannot drift apart. Replayed sequences are
estimated by the rate chain of the same profile entry.

``AcceptanceChains.steps(remaining)`` is the expected number of steps a row needs to emit its
remaining tokens, per level: a row drafts min(k, tokens it still needs - 1), so the last steps
of a request are shorter than a free-running window's, and short outputs need more steps per
token than ``tokens_per_step`` says.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from specsim.profile import Acceptance
from specsim.simulation.acceptance import RateAcceptance, extend_rates, window_rates

# Beyond this many remaining tokens a row's expected steps grow by exactly 1 / tokens_per_step
# per token (its window is no longer capped by its end).
EXACT_STEPS = 256


class AcceptanceChains:
    """The survival of a k-draft window per acceptance level: ``survival[level, i - 1]`` is
    the probability that a step accepts its first i drafts, given it proposes (with
    probability ``proposal_rate``)."""

    def __init__(self, rates: np.ndarray, proposal_rate: float, concentration: float | None):
        model = RateAcceptance(np.asarray(rates, dtype=np.float64), proposal_rate, concentration)
        self.k = model.k_max
        self.proposal_rate = model.proposal_rate
        self.survival = model.survival
        self.levels = model.levels
        self._steps, self._drafts = self._exact_steps()

    @property
    def level_tokens_per_step(self) -> np.ndarray:
        """Each level's mean tokens per step of a free-running window."""
        return 1.0 + self.proposal_rate * self.survival.sum(axis=1)

    @property
    def tokens_per_step(self) -> float:
        """A running row's mean tokens per step: the harmonic mean over levels (a request that
        accepts poorly stays in the batch longer, so a batch holds more of them)."""
        return float(1.0 / np.mean(1.0 / self.level_tokens_per_step))

    def _exact_steps(self) -> tuple[np.ndarray, np.ndarray]:
        """Expected steps, and positions drafted, to emit r = 0..EXACT_STEPS tokens, per level
        (dynamic programming over the emitted count of one step, its window capped at r - 1
        drafts)."""
        p = self.proposal_rate
        steps = np.zeros((EXACT_STEPS + 1, self.levels))
        drafts = np.zeros((EXACT_STEPS + 1, self.levels))
        chain = np.concatenate([np.ones((self.levels, 1)), self.survival], axis=1)  # P(>= j)
        for r in range(1, EXACT_STEPS + 1):
            d = min(self.k, r - 1)
            at_least = chain[:, : d + 1]
            exactly = at_least.copy()
            exactly[:, :d] -= at_least[:, 1 : d + 1]
            exactly *= p
            exactly[:, 0] += 1.0 - p
            left = r - 1 - np.arange(d + 1)  # emitting j + 1 tokens leaves r - 1 - j
            steps[r] = 1.0 + (exactly * steps[left].T).sum(axis=1)
            drafts[r] = p * d + (exactly * drafts[left].T).sum(axis=1)
        return steps, drafts

    def steps(self, remaining: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Expected steps, and positions drafted, per (request, level) to emit ``remaining``
        tokens (one count per request)."""
        remaining = np.asarray(remaining, dtype=np.int64)
        capped = np.minimum(remaining, EXACT_STEPS)
        beyond = (remaining - capped)[:, None] / self.level_tokens_per_step[None, :]
        free_drafts = self.proposal_rate * self.k
        return self._steps[capped] + beyond, self._drafts[capped] + beyond * free_drafts


def chain_rates(entry: Acceptance, model: str, k: int, rate: float | None) -> np.ndarray:
    """The per-position rates of a k-draft window under acceptance ``model`` (as
    ``build_acceptance`` chains them; ``sequences`` as ``per_position``)."""
    if k == 0:
        return np.zeros(0)
    if model == "iid":
        alpha = entry.per_position[0] if rate is None else rate
        return np.full(k, alpha, dtype=np.float64)
    return extend_rates(window_rates(entry), k)


@lru_cache(maxsize=256)
def _chains(
    rates: tuple[float, ...], proposal_rate: float, concentration: float | None
) -> AcceptanceChains:
    return AcceptanceChains(np.asarray(rates, dtype=np.float64), proposal_rate, concentration)


def acceptance_chains(
    entry: Acceptance | None,
    model: str = "per_position",
    k: int = 0,
    rate: float | None = None,
    heterogeneity: bool = True,
) -> AcceptanceChains:
    """The chains of window k for an acceptance entry (None, or k = 0: speculation off)."""
    if entry is None or k == 0:
        return _chains((), 1.0, None)
    concentration = entry.request_concentration if heterogeneity else None
    rates = tuple(chain_rates(entry, model, k, rate).tolist())
    return _chains(rates, float(entry.proposal_rate), concentration)
