"""Goodness-of-fit for the Monte Carlo check: a Cressie-Read test with pooled sparse cells, and
its power.

``goodness_of_fit`` compares observed counts with the expected distribution by the Cressie-Read
power-divergence statistic (lambda = 2/3), whose chi-square approximation holds in the large,
sparse tables a whole window's tokens make; the G (log-likelihood ratio) statistic's does not: on
a 4,096-cell table of 20,000 samples it rejects a true null about six times as often as its level
says (see ``tests/test_checker_stats.py``). Cells whose expected count is below ``min_expected``
are pooled (the partition depends on the expected distribution only, never on the data). A count
in a cell of expected probability 0 is an impossible outcome: the p-value is then exactly 0.

``detectable_tv`` answers "how big a departure would this test catch?": the smallest total
variation distance (on the test's cells) that the test detects with the given power. For any
alternative at TV distance d, the chi-square divergence sum (r - e)^2 / e is at least (2d)^2 by
Cauchy-Schwarz (equality when the change is proportional to e), so under the noncentral
chi-square approximation every alternative with d >= sqrt(lambda* / (4 N)) is detected with at
least that power, where lambda* is the noncentrality that reaches the power at level alpha.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy import optimize, stats

MIN_EXPECTED = 5.0


STATISTIC = "cressie-read"  # scipy.stats.power_divergence's lambda_ (2/3)


@dataclass(frozen=True)
class FitTest:
    statistic: float | None  # None when an impossible outcome was observed (infinite)
    dof: int
    p_value: float
    cells: int
    impossible_count: int  # samples in cells of expected probability 0


def pooled_cells(expected_probs: np.ndarray, n: int, min_expected: float = MIN_EXPECTED):
    """Map each cell of positive probability to a test cell; sparse cells share pooled cells.

    Returns (labels per flat cell, -1 for zero-probability cells; number of test cells).
    """
    probs = np.asarray(expected_probs, dtype=np.float64).ravel()
    labels = np.full(probs.size, -1, dtype=np.int64)
    support = np.flatnonzero(probs > 0)
    if support.size == 0:
        return labels, 0
    order = support[np.argsort(probs[support], kind="stable")]  # sparsest first
    expected = probs[order] * n
    label, running = 0, 0.0
    for index, e in zip(order, expected, strict=True):
        labels[index] = label
        running += e
        if running >= min_expected:
            label, running = label + 1, 0.0
    cells = label + (1 if running > 0 else 0)
    if running > 0 and cells > 1:
        # The last (largest) group fell short: merge it into its neighbour.
        labels[labels == cells - 1] = cells - 2
        cells -= 1
    return labels, cells


def goodness_of_fit(
    counts: np.ndarray,
    expected_probs: np.ndarray,
    min_expected: float = MIN_EXPECTED,
    statistic: str = STATISTIC,
) -> FitTest:
    """The test of ``counts`` against ``expected_probs`` on pooled cells (``statistic``: a
    ``scipy.stats.power_divergence`` lambda_, for comparisons)."""
    counts = np.asarray(counts, dtype=np.float64).ravel()
    probs = np.asarray(expected_probs, dtype=np.float64).ravel()
    n = int(np.rint(counts.sum()))
    labels, cells = pooled_cells(probs, n, min_expected)
    impossible = int(np.rint(counts[labels < 0].sum()))
    dof = max(cells - 1, 0)
    if impossible:
        return FitTest(None, dof, 0.0, cells, impossible)
    if dof == 0:
        return FitTest(0.0, 0, 1.0, cells, 0)
    inside = labels >= 0
    observed = np.bincount(labels[inside], weights=counts[inside], minlength=cells)
    expected = np.bincount(labels[inside], weights=probs[inside], minlength=cells)
    expected = expected / expected.sum() * n
    value, p_value = stats.power_divergence(observed, expected, lambda_=statistic)
    return FitTest(float(value), dof, float(p_value), cells, 0)


def detectable_tv(
    expected_probs: np.ndarray,
    n: int,
    alpha: float,
    power: float = 0.99,
    min_expected: float = MIN_EXPECTED,
) -> float:
    """Smallest TV distance (on the test's cells) detected with ``power`` at level ``alpha``.

    With a single test cell (a point-mass reference, e.g. greedy decoding) any mass outside the
    support is a certain detection once seen: TV d is seen with probability 1 - (1 - d)^N.
    """
    if n <= 0:
        return 1.0
    _, cells = pooled_cells(expected_probs, n, min_expected)
    dof = cells - 1
    if dof < 1:
        return float(1.0 - (1.0 - power) ** (1.0 / n))
    critical = stats.chi2.isf(alpha, dof)

    def shortfall(lam: float) -> float:
        return float(stats.ncx2.sf(critical, dof, lam)) - power

    upper = 1.0
    while shortfall(upper) < 0:
        upper *= 2.0
    lam = optimize.brentq(shortfall, 0.0, upper, xtol=1e-9, rtol=1e-12)
    return float(min(1.0, np.sqrt(lam / (4.0 * n))))


@dataclass(frozen=True)
class PrefixTest:
    """The test of the first ``tokens`` emitted tokens, one of a window's nested tests."""

    tokens: int
    cells: int  # test cells after pooling
    dof: int
    statistic: float | None
    p_value: float
    impossible_samples: int
    detectable_tv: float  # smallest TV on these tokens detected with `power` at the test's level
    plug_in_tv: float  # TV of the empirical distribution (biased upwards by sampling noise)


def window_tests(
    counts: np.ndarray, expected_probs: np.ndarray, alpha: float, power: float = 0.99
) -> tuple[list[PrefixTest], float]:
    """Tests of the first 1, 2, ..., m emitted tokens of an m-token window, each at level
    alpha / m, and the family's Bonferroni p-value min(1, m * min p_j): lossless at level alpha
    needs every test to pass. The first tokens' tests keep the power of a small table; the last
    one covers every position (a departure anywhere moves the joint of all m tokens)."""
    m = counts.ndim
    n = int(np.rint(counts.sum()))
    level = alpha / m
    tests = []
    for j in range(1, m + 1):
        observed = counts.sum(axis=tuple(range(j, m)))
        expected = expected_probs.sum(axis=tuple(range(j, m)))
        result = goodness_of_fit(observed, expected)
        plug_in = 0.5 * float(np.abs(observed / max(n, 1) - expected).sum())
        tests.append(
            PrefixTest(
                tokens=j,
                cells=result.cells,
                dof=result.dof,
                statistic=result.statistic,
                p_value=result.p_value,
                impossible_samples=result.impossible_count,
                detectable_tv=detectable_tv(expected, n, level, power),
                plug_in_tv=plug_in,
            )
        )
    family = min(1.0, m * min(test.p_value for test in tests))
    return tests, family


def window_result(
    counts: np.ndarray, expected_probs: np.ndarray, alpha: float, power: float = 0.99
) -> dict[str, Any]:
    """The checkers' Monte Carlo result: the family p-value, the whole-window test's figures and
    every prefix's test (``window_tests``)."""
    tests, family = window_tests(counts, expected_probs, alpha, power)
    whole = tests[-1]
    return {
        "p_value": family,
        "statistic": whole.statistic,
        "dof": whole.dof,
        "impossible_samples": whole.impossible_samples,
        "detectable_tv": whole.detectable_tv,
        "window_tests": [asdict(test) for test in tests],
        "monte_carlo_note": None,
        "malformed": None,
    }
