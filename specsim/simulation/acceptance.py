"""Acceptance models: how many of a step's drafts the verifier accepts, drawn per row with numpy.

Every model works on the running batch as arrays. Each request carries an integer *level* chosen
when it is first admitted (its acceptance class, or its profiled sequence); a step draws one
uniform per row and turns it into an accepted count. Counts are "raw": the engine caps them at
the row's window (k, or fewer drafts near the end of a request).

- ``RateAcceptance``: per-position conditional rates a_1..a_K (``per_position``), or one rate for
  every position (``iid``). A step accepts drafts 1..i iff w > 1 - S_i with S_i = a_1 ... a_i and
  w uniform, so one uniform per row gives the whole chain. With ``request_concentration`` c, each
  request gets one quantile u, and its rate at position i is the u-quantile of
  Beta(c a_i, c (1 - a_i)): rates vary across requests with mean a_i, and a request that accepts
  well at one position accepts well at all (levels are ``LEVELS`` equally likely quantiles).
  Drafters that do not always propose (n-gram lookup) propose with probability ``proposal_rate``
  per row and step; a row without a proposal drafts nothing that step.
- ``SequenceAcceptance``: replays profiled per-request sequences. ``run_length`` values say how
  many tokens a step starting at that generated position emits with unlimited k; ``beta`` values
  are per-position acceptance probabilities, chained over the step's drafts.
"""

from __future__ import annotations

import numpy as np
from scipy.special import betaincinv

from specsim.bounds import MAX_TOKENS
from specsim.errors import SpecsimError
from specsim.fileio import read_text
from specsim.policy_settings import AcceptanceShift
from specsim.profile import Acceptance, LoadedProfile

LEVELS = 64


def extend_rates(per_position: list[float], k_max: int) -> np.ndarray:
    """The conditional rates for positions 1..k_max; beyond the profile's list, its last rate."""
    rates = list(per_position[:k_max])
    rates += [per_position[-1]] * (k_max - len(rates))
    return np.asarray(rates, dtype=np.float64)


def window_rates(entry: Acceptance) -> list[float]:
    """The conditional rates the simulator chains: those that give every window k the mean
    acceptance length the profile measured for it, where it measured one for each k from 1 up.

    ``per_position`` comes from the widest window's walk, and a window's steps start elsewhere
    than a narrower one's (after a rejection, or after k accepted drafts), so its chain
    understates a narrower window (docs/notes/2026-11-30-acceptance-per-window.md).

    With ``L_k`` the measured lengths (``L_0 = 1``) and gains ``g_i = L_i - L_(i-1)``, the
    chain's probability of accepting the first i drafts must be ``g_i``, so
    ``a_i = g_i / (a_1 ... a_(i-1))``: ``1 + a_1 + a_1 a_2 + ... = L_k`` for every k at once,
    and one list serves a window policy that changes k. Where a gain exceeds the one before (a
    rate above 1: the per-k walks differ by a little noise) the rate is 1 and the chain stays
    as close as it can. Drafters that do not always propose (prompt lookup, whose lengths mix
    proposal sizes) and tables that do not start at k = 1 keep ``per_position``."""
    lengths = entry.mean_acceptance_length
    if entry.proposal_rate < 1.0 or 1 not in lengths:
        return list(entry.per_position)
    rates, reached, previous = [], 1.0, 1.0  # chain probability so far; L_(i-1)
    k = 1
    while k in lengths:
        gain = lengths[k] - previous
        rate = 0.0 if reached <= 0.0 else min(max(gain / reached, 0.0), 1.0)
        rates.append(rate)
        reached *= rate
        previous = lengths[k]
        k += 1
    return rates + list(entry.per_position[len(rates) :])


def _level_rates(rates: np.ndarray, concentration: float | None) -> np.ndarray:
    """Each level's conditional rates (one level without a concentration)."""
    if concentration is None or rates.shape[0] == 0:
        return rates[None, :]
    quantiles = (np.arange(LEVELS) + 0.5) / LEVELS
    a = np.clip(rates, 1e-9, 1 - 1e-9)
    level_rates = betaincinv(
        concentration * a[None, :], concentration * (1 - a[None, :]), quantiles[:, None]
    )
    # Exact rates of 0 or 1 stay exact for every request.
    level_rates = np.where(rates[None, :] >= 1.0, 1.0, level_rates)
    return np.where(rates[None, :] <= 0.0, 0.0, level_rates)


class RateAcceptance:
    """Rate-based acceptance: i.i.d. or per-position, optionally heterogeneous across requests."""

    needs_position = False

    def __init__(
        self,
        rates: np.ndarray,
        proposal_rate: float = 1.0,
        concentration: float | None = None,
        shift: AcceptanceShift | None = None,
    ):
        self.k_max = int(rates.shape[0])
        self.proposal_rate = float(proposal_rate)
        level_rates = _level_rates(rates, concentration)
        # Requests drawn before the shift take levels 0..base-1; after it, the same quantile
        # of the shifted rates, ``base`` levels further on (so draws never change with it).
        self.base_levels = level_rates.shape[0]
        self.shift = shift
        if shift is not None:
            shifted = _level_rates(np.minimum(rates * shift.factor, 1.0), concentration)
            level_rates = np.concatenate([level_rates, shifted])
        self.levels = level_rates.shape[0]
        survival = np.cumprod(level_rates, axis=1)  # S[level, i-1] = P(first i accepted)
        self.survival = survival
        # What the profile says (the expectations a policy or a stretch plans with): the levels
        # before any shift, which the workload springs on the engine unannounced.
        self._planned = survival[: self.base_levels]
        # thresholds[k][level] = 1 - S[level, :k], ascending; contiguous per k for fast gathers.
        self._thresholds = [
            np.ascontiguousarray(1.0 - survival[:, :k]) for k in range(self.k_max + 1)
        ]
        self._homogeneous = self.base_levels == 1
        # Flat search tables: level l's thresholds shifted by 2 l, then a sentinel above any
        # uniform, so searchsorted(2 l + w) - l (k + 1) counts the accepted drafts; counts[k]
        # maps a search index straight to that count. One search serves every level at once.
        self.flat_thresholds = []
        self.flat_counts = []
        for k in range(self.k_max + 1):
            shifted = self._thresholds[k] + 2.0 * np.arange(self.levels)[:, None]
            sentinel = 2.0 * np.arange(self.levels)[:, None] + 1.5
            self.flat_thresholds.append(np.concatenate([shifted, sentinel], axis=1).ravel())
            self.flat_counts.append(np.tile(np.arange(k + 1, dtype=np.float64), self.levels))

    def assign_levels(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self._homogeneous:
            return np.zeros(n, dtype=np.int64)
        return rng.integers(0, self.base_levels, size=n, dtype=np.int64)

    def request_level(self, level: int, rid: int, arrival: float) -> int:
        """A drawn level as the request keeps it: moved to the shifted rates when the
        workload's acceptance has shifted by its index or its arrival."""
        shift = self.shift
        if shift is not None and shift.applies(rid, arrival):
            return level + self.base_levels
        return level

    def expected_emitted(self, k: int) -> float:
        """Mean tokens a step of window k emits, over requests (before end-of-request caps)."""
        if k == 0:
            return 1.0
        return 1.0 + self.proposal_rate * float(self._planned[:, :k].sum(axis=1).mean())

    def row_expected_emitted(self, k: int) -> float:
        """Mean tokens a step of window k emits for a row of the running batch.

        Requests that accept poorly need more steps for the same output, so they stay in the
        batch longer: a level's share of the batch is proportional to 1 / its tokens per step,
        and the batch's mean is the harmonic mean over levels (equal to ``expected_emitted``
        when requests are homogeneous). This is what a window policy should expect per row.
        """
        if k == 0:
            return 1.0
        per_level = 1.0 + self.proposal_rate * self._planned[:, :k].sum(axis=1)
        return float(1.0 / np.mean(1.0 / per_level))

    def draw(
        self, rng: np.random.Generator, k: int, level: np.ndarray, position: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Raw accepted counts per row, and which rows proposed (None: all of them)."""
        return self.draw_slots(rng, k, 2.0 * level, level.shape[0])

    def draw_slots(
        self, rng: np.random.Generator, k: int, shift: np.ndarray, capacity: int
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """``draw`` for the first ``len(shift)`` slots of a batch of ``capacity`` slots, with
        ``shift`` = 2 x each slot's level (0 in empty slots).

        The uniforms are drawn for every slot and the unused tail is dropped: a row's uniform
        then depends on its slot only, so the engine can work on the occupied prefix of its batch
        arrays and still draw exactly what a whole-array step draws.
        """
        used = shift.shape[0]
        index = self.flat_thresholds[k].searchsorted(shift + rng.random(capacity)[:used])
        accepted = self.flat_counts[k][index]
        if self.proposal_rate >= 1.0:
            return accepted, None
        proposed = rng.random(capacity)[:used] < self.proposal_rate
        return accepted, proposed


class SequenceAcceptance:
    """Trace-driven acceptance from a profile's per-request sequences (wrapping around)."""

    needs_position = True

    def __init__(self, sequences: list[np.ndarray], kind: str, k_max: int):
        self.kind = kind
        self.k_max = k_max
        self.proposal_rate = 1.0
        self.levels = len(sequences)
        lengths = np.asarray([s.shape[0] for s in sequences], dtype=np.int64)
        self.flat = np.concatenate(sequences).astype(np.float64)
        self.base = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        self.length = lengths
        self._offsets = np.arange(max(k_max, 1), dtype=np.int64)
        per_sequence = [self._per_sequence_emitted(k) for k in range(k_max + 1)]
        self._expected = [float((m * self.length).sum() / self.length.sum()) for m in per_sequence]
        # Per-row mean in the running batch: the harmonic mean over sequences (a request that
        # emits fewer tokens per step stays longer; see RateAcceptance.row_expected_emitted).
        self._row_expected = [float(1.0 / np.mean(1.0 / m)) for m in per_sequence]

    def _per_sequence_emitted(self, k: int) -> np.ndarray:
        """Each sequence's mean tokens per step of window k, over its start positions."""
        if k == 0:
            return np.ones(self.levels)
        means = []
        for base, length in zip(self.base.tolist(), self.length.tolist(), strict=True):
            seq = self.flat[base : base + length]
            if self.kind == "run_length":
                means.append(float(np.minimum(seq, k + 1).mean()))
                continue
            # beta: average over every start position of 1 + sum_i prod_{j<=i} beta_j.
            idx = (np.arange(length)[:, None] + np.arange(k)[None, :]) % length
            means.append(float((1.0 + np.cumprod(seq[idx], axis=1).sum(axis=1)).mean()))
        return np.asarray(means)

    def assign_levels(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.integers(0, self.levels, size=n, dtype=np.int64)

    def expected_emitted(self, k: int) -> float:
        return self._expected[k]

    def row_expected_emitted(self, k: int) -> float:
        return self._row_expected[k]

    def draw(
        self, rng: np.random.Generator, k: int, level: np.ndarray, position: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray | None]:
        base = self.base[level]
        length = self.length[level]
        position = position.astype(np.int64)
        if self.kind == "run_length":
            values = self.flat[base + position % length]
            return values.astype(np.int64) - 1, None
        idx = base[:, None] + (position[:, None] + self._offsets[None, :k]) % length[:, None]
        accepted_each = rng.random(idx.shape) < self.flat[idx]
        return np.cumprod(accepted_each, axis=1).sum(axis=1), None


def read_sequences(path, kind: str, profile_path: str) -> list[np.ndarray]:
    text = read_text(path, "acceptance sequences file")
    sequences = []
    for line_no, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            values = np.asarray([float(v) for v in line.split()], dtype=np.float64)
        except ValueError:
            raise SpecsimError(
                f"line {line_no}: values must be numbers", file=str(path), fix="repair the row"
            ) from None
        if kind == "run_length":
            bad = ~((values >= 1) & (values <= MAX_TOKENS) & (values == np.round(values)))
        else:
            bad = ~((values >= 0) & (values <= 1))
        if bad.any():
            expect = (
                f"whole numbers from 1 to {MAX_TOKENS:,}"
                if kind == "run_length"
                else "probabilities in [0, 1]"
            )
            raise SpecsimError(
                f"line {line_no}: {kind} values must be {expect}", file=str(path), fix="repair it"
            )
        sequences.append(values)
    if not sequences:
        raise SpecsimError(
            f"acceptance sequences file has no rows (named by {profile_path})",
            file=str(path),
            fix="write one request per line: its values, one per generated position",
        )
    return sequences


def build_acceptance(
    profile: LoadedProfile,
    entry: Acceptance,
    model: str,
    k_max: int,
    rate: float | None = None,
    heterogeneity: bool = True,
    shift: AcceptanceShift | None = None,
) -> RateAcceptance | SequenceAcceptance:
    """The acceptance model a pool's speculation settings ask for (``shift``: rate models)."""
    concentration = entry.request_concentration if heterogeneity else None
    if model == "sequences":
        path = profile.sequences_path(entry)
        kind = entry.sequences.kind
        return SequenceAcceptance(read_sequences(path, kind, str(profile.path)), kind, k_max)
    if model == "iid":
        alpha = entry.per_position[0] if rate is None else rate
        rates = np.full(k_max, alpha, dtype=np.float64)
    else:
        rates = extend_rates(window_rates(entry), k_max)
    return RateAcceptance(rates, entry.proposal_rate, concentration, shift)
