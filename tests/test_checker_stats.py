"""The Cressie-Read test with pooled cells and its stated power, checked by simulation (numpy only).

Simulations use numpy's multinomial with fixed seeds; each states its sample size and tolerance.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as sps

from specsim.sampling.stats import detectable_tv, goodness_of_fit, pooled_cells

# A reference with heavy, light and zero-probability cells, like a top-k/top-p joint table.
REFERENCE = np.array([0.3, 0.2, 0.15, 0.1, 0.08, 0.06, 0.04, 0.03] + [0.002] * 15 + [0.0] * 3)
REFERENCE = REFERENCE / REFERENCE.sum()


def test_pooling_gives_every_test_cell_an_expected_count_of_at_least_five():
    n = 1000
    labels, cells = pooled_cells(REFERENCE, n)
    assert (labels[REFERENCE == 0] == -1).all() and (labels[REFERENCE > 0] >= 0).all()
    expected = np.bincount(labels[labels >= 0], weights=REFERENCE[labels >= 0] * n)
    assert len(expected) == cells and expected.min() >= 5
    assert cells < int((REFERENCE > 0).sum())  # the sparse cells were pooled


def test_a_sample_in_a_zero_probability_cell_is_an_impossible_outcome():
    counts = np.round(REFERENCE * 1000)
    counts[-1] = 1
    result = goodness_of_fit(counts, REFERENCE)
    assert result.p_value == 0.0 and result.statistic is None and result.impossible_count == 1


def test_exact_expected_counts_give_statistic_zero():
    reference = np.array([0.25, 0.25, 0.5])
    result = goodness_of_fit(reference * 400, reference)
    assert result.statistic == pytest.approx(0.0, abs=1e-12) and result.p_value == 1.0


def test_point_mass_reference_has_no_degrees_of_freedom():
    reference = np.array([0.0, 1.0, 0.0])
    assert goodness_of_fit(np.array([0, 50, 0]), reference).p_value == 1.0
    assert goodness_of_fit(np.array([1, 49, 0]), reference).p_value == 0.0
    # One miss in N is seen with 99% power once the miss rate d has 1 - (1-d)^N >= 0.99.
    d = detectable_tv(reference, 1000, 0.01)
    assert 1 - (1 - d) ** 1000 == pytest.approx(0.99)


def test_p_values_are_uniform_under_the_null():
    # 1000 multinomial samples of N = 2000 (seed 0) from REFERENCE itself. The rejection count at
    # alpha = 0.05 must lie in the binomial(1000, 0.05) 99.9% range [28, 74], and a KS test of
    # the p-values against uniform must not reject at 0.001 (pooling keeps them near-uniform).
    # Planted bug on the same draws: a test that forgets the pooling-reduced dof (uses dof + 5)
    # is over-conservative, and the same two checks catch it.
    rng = np.random.default_rng(0)
    results = [goodness_of_fit(rng.multinomial(2000, REFERENCE), REFERENCE) for _ in range(1000)]
    p_values = np.array([r.p_value for r in results])
    assert 28 <= int((p_values < 0.05).sum()) <= 74
    assert sps.kstest(p_values, "uniform").pvalue > 1e-3
    wrong = np.array([sps.chi2.sf(r.statistic, r.dof + 5) for r in results])
    assert int((wrong < 0.05).sum()) < 28 and sps.kstest(wrong, "uniform").pvalue < 1e-3


def test_the_level_holds_on_a_large_sparse_table():
    # A whole window's joint table: 4,096 cells with log-normal (sigma 1.5) probabilities, seed 2,
    # N = 20,000 per sample, 300 samples drawn from the table itself. At alpha = 0.01 a
    # calibrated test rejects binomial(300, 0.01) times: at most 9 with probability 0.9989.
    # Planted bug on the same draws: the G (log-likelihood ratio) statistic, whose chi-square
    # approximation fails here (each sparse cell adds about 1/(6e) to its mean), rejects far more.
    rng = np.random.default_rng(2)
    table = np.exp(1.5 * rng.normal(size=4096))
    table /= table.sum()
    draws = rng.multinomial(20_000, table, size=300)
    rejections = sum(goodness_of_fit(d, table).p_value < 0.01 for d in draws)
    assert rejections <= 9
    lr = sum(goodness_of_fit(d, table, statistic="log-likelihood").p_value < 0.01 for d in draws)
    assert lr >= 12


def worst_case_alternative(reference: np.ndarray, tv: float, n: int) -> np.ndarray:
    """Move mass tv between two halves of the test cells in proportion to their expected mass:
    the alternative with the smallest chi-square divergence at that TV, the hardest to detect."""
    labels, cells = pooled_cells(reference, n)
    cell_mass = np.bincount(labels[labels >= 0], weights=reference[labels >= 0], minlength=cells)
    order = np.argsort(cell_mass)
    up, mass_up = np.zeros(cells, bool), 0.0
    for c in order[::-1]:  # greedily build a half of (nearly) equal mass
        if mass_up + cell_mass[c] <= 0.5 + 1e-12:
            up[c], mass_up = True, mass_up + cell_mass[c]
    scale = np.where(up, 1 + tv / mass_up, 1 - tv / (1 - mass_up))
    alternative = reference * np.where(labels >= 0, scale[np.maximum(labels, 0)], 1.0)
    return alternative / alternative.sum()


def test_detectable_tv_is_detected_with_the_stated_power():
    # 400 samples of N = 20000 (seed 1) from the hardest alternative at the stated TV: the test
    # (alpha 0.01) must reject at least 97% of the time (stated power 99%; P(<= 388 of 400 |
    # 0.99) ~ 5e-4). At half that TV the power must be clearly lower, so the figure is not loose.
    n, alpha = 20_000, 0.01
    d = detectable_tv(REFERENCE, n, alpha)
    rng = np.random.default_rng(1)

    def rejection_rate(tv: float) -> float:
        alt = worst_case_alternative(REFERENCE, tv, n)
        p_values = [goodness_of_fit(rng.multinomial(n, alt), REFERENCE).p_value for _ in range(400)]
        return float(np.mean(np.array(p_values) < alpha))

    assert rejection_rate(d) >= 0.97
    assert rejection_rate(d / 2) < 0.8


def test_detectable_tv_shrinks_like_one_over_root_n():
    small, large = detectable_tv(REFERENCE, 10_000, 0.01), detectable_tv(REFERENCE, 40_000, 0.01)
    assert large == pytest.approx(small / 2, rel=0.1)
