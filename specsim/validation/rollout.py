"""Compare two engine runs' quality signals with two-sample tests: did a rollout shift the output?

An operator turning speculation on (or changing the drafter, k or the verifier) can check that the
output is still the target's without diffing strings: run the same traffic before and after, and
compare per-request signals that an exact speculative sampler leaves unchanged in distribution:

- ``target_logprob_mean``: the mean log-probability the target gives each request's generated
  tokens (a lossy verifier such as typical acceptance, or a cache bug, moves it);
- ``output_tokens``: the length distribution (it moves when EOS becomes more or less likely);
- the share of requests that stopped at EOS.

Tests: Mann-Whitney U (two-sided) and Kolmogorov-Smirnov for the two continuous signals, Fisher's
exact test for the EOS share. Each of the ``m`` tests runs at ``alpha / m`` (Bonferroni), so the
chance of a false alarm over the whole check is at most ``alpha``. The report gives each effect
(difference of means with a 95 % interval) and the smallest mean shift the Mann-Whitney test would
detect with 80 % power at these sample sizes, so "no shift detected" says how small a shift could
hide. When no request in either run stopped at EOS (the engine ignores EOS by default, as
serving benchmarks do), every length is the workload's cap: the length signal is then not tested.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from specsim.bounds import MIN_LEVEL
from specsim.engine.records import read_engine_records
from specsim.errors import SpecsimError

DEFAULT_ALPHA = 0.01
POWER = 0.8
MIN_REQUESTS = 8


@dataclass(frozen=True)
class SignalTest:
    signal: str
    test: str
    statistic: float
    p_value: float
    shifted: bool
    baseline_mean: float
    candidate_mean: float
    difference: float
    difference_ci95: tuple[float, float] | None
    detectable_shift: float | None  # smallest mean shift found with 80 % power (same units)


@dataclass(frozen=True)
class RolloutCheck:
    verdict: str  # "shift" or "no shift detected"
    alpha: float
    alpha_per_test: float
    baseline_requests: int
    candidate_requests: int
    tests: list[SignalTest]
    notes: list[str]

    @property
    def shifted(self) -> bool:
        return self.verdict == "shift"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def load_rollout_records(folder: str | Path) -> dict[str, np.ndarray]:
    """An engine run folder's records, with enough requests for the two-sample tests."""
    folder = Path(folder)
    if not folder.is_dir():
        raise SpecsimError(
            "run folder not found",
            file=str(folder),
            fix="give the folder of an engine run (with requests.csv), e.g. VALIDATE_OUT/engine",
        )
    records = read_engine_records(folder / "requests.csv")
    n = records["id"].shape[0]
    if n < MIN_REQUESTS:
        raise SpecsimError(
            f"only {n} requests; a two-sample test needs at least {MIN_REQUESTS}",
            file=str(folder / "requests.csv"),
            fix="run more requests",
        )
    return records


def _mean_ci(a: np.ndarray, b: np.ndarray) -> tuple[float, tuple[float, float]]:
    """Candidate minus baseline mean, with a Welch 95 % interval."""
    diff = float(b.mean() - a.mean())
    va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    se = math.sqrt(va + vb)
    if se == 0:
        return diff, (diff, diff)
    dof = (va + vb) ** 2 / (va**2 / (a.size - 1) + vb**2 / (b.size - 1))
    half = float(stats.t.ppf(0.975, dof)) * se
    return diff, (diff - half, diff + half)


def detectable_shift(a: np.ndarray, b: np.ndarray, alpha: float, power: float = POWER) -> float:
    """Smallest mean shift (in the data's units) Mann-Whitney detects with ``power``.

    Normal approximation of a two-sided location test, inflated by pi/3 for Mann-Whitney's
    asymptotic relative efficiency against the t-test on normal data.
    """
    pooled = math.sqrt(
        ((a.size - 1) * a.var(ddof=1) + (b.size - 1) * b.var(ddof=1)) / (a.size + b.size - 2)
    )
    z = stats.norm.isf(alpha / 2) + stats.norm.isf(1 - power)
    return float(z * pooled * math.sqrt((1 / a.size + 1 / b.size) * math.pi / 3))


def _continuous(name: str, a: np.ndarray, b: np.ndarray, alpha: float) -> list[SignalTest]:
    diff, ci = _mean_ci(a, b)
    common = {
        "signal": name,
        "baseline_mean": float(a.mean()),
        "candidate_mean": float(b.mean()),
        "difference": diff,
        "difference_ci95": ci,
        "detectable_shift": detectable_shift(a, b, alpha),
    }
    mw = stats.mannwhitneyu(b, a, alternative="two-sided")
    ks = stats.ks_2samp(b, a)
    return [
        SignalTest(
            test="mann-whitney",
            statistic=float(mw.statistic),
            p_value=float(mw.pvalue),
            shifted=bool(mw.pvalue < alpha),
            **common,
        ),
        SignalTest(
            test="kolmogorov-smirnov",
            statistic=float(ks.statistic),
            p_value=float(ks.pvalue),
            shifted=bool(ks.pvalue < alpha),
            **common,
        ),
    ]


def _eos_share(a: np.ndarray, b: np.ndarray, alpha: float) -> SignalTest:
    table = [[int(b.sum()), int(b.size - b.sum())], [int(a.sum()), int(a.size - a.sum())]]
    result = stats.fisher_exact(table)
    return SignalTest(
        signal="eos_share",
        test="fisher-exact",
        statistic=float(result.statistic) if math.isfinite(result.statistic) else -1.0,
        p_value=float(result.pvalue),
        shifted=bool(result.pvalue < alpha),
        baseline_mean=float(a.mean()),
        candidate_mean=float(b.mean()),
        difference=float(b.mean() - a.mean()),
        difference_ci95=None,
        detectable_shift=None,
    )


def check_rollout(
    baseline: dict[str, np.ndarray], candidate: dict[str, np.ndarray], alpha: float = DEFAULT_ALPHA
) -> RolloutCheck:
    """Two-sample tests of the quality signals; Bonferroni over the tests actually run."""
    if not MIN_LEVEL <= alpha < 1:
        raise SpecsimError(
            f"alpha {alpha} is not from {MIN_LEVEL:g} to below 1", key="--alpha", fix="e.g. 0.01"
        )
    notes = []
    plan: list[tuple[str, np.ndarray, np.ndarray]] = []
    plan.append(
        ("target_logprob_mean", baseline["target_logprob_mean"], candidate["target_logprob_mean"])
    )
    lengths = (baseline["output_tokens"].astype(float), candidate["output_tokens"].astype(float))
    eos_a, eos_b = baseline["eos"], candidate["eos"]
    test_eos = bool(eos_a.any() or eos_b.any())
    if not test_eos or np.ptp(np.concatenate(lengths)) == 0:
        notes.append(
            "every request ran to its length cap (EOS ignored or never reached): the lengths "
            "are the workload's, not the model's, and are not tested"
        )
    else:
        plan.append(("output_tokens", *lengths))
    m = 2 * len(plan) + int(test_eos)
    per_test = alpha / m
    tests: list[SignalTest] = []
    for name, a, b in plan:
        tests += _continuous(name, a, b, per_test)
    if test_eos:
        tests.append(_eos_share(eos_a, eos_b, per_test))
    else:
        notes.append("no request stopped at EOS in either run: the EOS share is not tested")
    verdict = "shift" if any(t.shifted for t in tests) else "no shift detected"
    return RolloutCheck(
        verdict, alpha, per_test, int(baseline["id"].size), int(candidate["id"].size), tests, notes
    )


def describe(check: RolloutCheck) -> str:
    """A short human summary."""
    lines = [
        f"verdict: {check.verdict} (alpha {check.alpha:g} overall, {check.alpha_per_test:.2g} "
        f"per test; {check.baseline_requests} baseline vs {check.candidate_requests} candidate "
        "requests)"
    ]
    for t in check.tests:
        flag = "SHIFT" if t.shifted else "ok"
        line = (
            f"  {t.signal:<20} {t.test:<19} p={t.p_value:.3g} {flag:<5} "
            f"mean {t.baseline_mean:.4g} -> {t.candidate_mean:.4g}"
        )
        if t.difference_ci95 is not None and t.test == "mann-whitney":
            lo, hi = t.difference_ci95
            line += (
                f" (diff {t.difference:+.3g}, 95% CI [{lo:+.3g}, {hi:+.3g}]; detectable "
                f"shift {t.detectable_shift:.3g})"
            )
        lines.append(line)
    lines += [f"  note: {n}" for n in check.notes]
    return "\n".join(lines)
