"""Closed forms, and the simulator agreeing with them at batch 1 with i.i.d. acceptance."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from specsim import analytic
from specsim.scenario import Scenario
from specsim.simulation import run_simulation
from specsim.simulation.records import read_records

DATA = Path(__file__).parent / "data"
TARGET_PASS_S = 0.01  # sim_profile.yaml: every target pass costs 10 ms (memory-bound)
DRAFTERS = {0.05: "c05", 0.2: "c20"}  # draft pass cost as a fraction of a target pass
OUTPUT_TOKENS = 2001
REQUESTS = 4


def test_expected_tokens_edges_and_series():
    assert analytic.expected_tokens_per_step(0.0, 5) == 1.0
    assert analytic.expected_tokens_per_step(1.0, 5) == 6.0
    for alpha in (0.3, 0.7, 0.95):
        for k in (0, 1, 4, 9):
            series = sum(alpha**i for i in range(k + 1))
            assert analytic.expected_tokens_per_step(alpha, k) == pytest.approx(series)


def test_walltime_improvement_and_arithmetic_increase():
    # k = 0 is plain decoding: no gain, no extra arithmetic.
    assert analytic.walltime_improvement(0.8, 0, 0.1) == 1.0
    assert analytic.arithmetic_operations_increase(0.8, 0, 0.1) == 1.0
    # Free drafts and perfect acceptance: k + 1 tokens per pass.
    assert analytic.walltime_improvement(1.0, 3, 0.0) == 4.0
    # The worked example in the paper's setting: alpha 0.8, k 4, c 0.05 gives ~2.8x.
    assert analytic.walltime_improvement(0.8, 4, 0.05) == pytest.approx(3.3616 / 1.2, rel=1e-4)
    # More drafts per emitted token always means more arithmetic when alpha < 1.
    assert analytic.arithmetic_operations_increase(0.6, 4, 0.05) > 1.5


def test_optimal_k_grows_with_alpha_and_shrinks_with_cost():
    assert analytic.optimal_k(0.9, 0.05) > analytic.optimal_k(0.6, 0.05)
    assert analytic.optimal_k(0.8, 0.02) > analytic.optimal_k(0.8, 0.3)
    assert analytic.optimal_k(0.0, 0.1) == 0
    k = analytic.optimal_k(0.8, 0.05)
    gains = [analytic.walltime_improvement(0.8, j, 0.05) for j in range(20)]
    assert gains[k] == max(gains)


def test_closed_forms_reject_bad_input():
    with pytest.raises(ValueError):
        analytic.expected_tokens_per_step(1.2, 3)
    with pytest.raises(ValueError):
        analytic.walltime_improvement(0.5, -1, 0.1)


def tokens_per_step_sd(alpha: float, k: int) -> float:
    """Standard deviation of the tokens one step emits (truncated geometric + 1)."""
    p = np.array([alpha**j * (1 - alpha) for j in range(k)] + [alpha**k])
    values = np.arange(k + 1) + 1.0
    mean = float(p @ values)
    return math.sqrt(float(p @ (values - mean) ** 2))


def simulate_batch_one(tmp_path: Path, alpha: float, k: int, c: float, seed: int = 0):
    data = {
        "seed": seed,
        "profile": "sim_profile.yaml",
        "workload": {
            "kind": "closed_loop",
            "concurrency": 1,
            "requests": REQUESTS,
            "prompt": {"dist": "fixed", "value": 8},
            "output": {"dist": "fixed", "value": OUTPUT_TOKENS},
        },
        "engine": {"max_batch": 1},
        "speculation": {
            "drafter": DRAFTERS[c],
            "k": k,
            "acceptance": "iid",
            "acceptance_rate": alpha,
            "heterogeneity": False,
        },
    }
    scenario = Scenario.model_validate(data).with_source(DATA / "scenario.yaml")
    path = tmp_path / f"a{alpha}-k{k}-c{c}-s{seed}.csv"
    summary = run_simulation(scenario, records_path=path).summary
    rec = read_records(path)
    decode_s = float((rec["finish_s"] - rec["first_token_s"]).sum())
    decode_tokens = float((rec["output_tokens"] - 1).sum())
    steps = int(rec["steps"].sum())
    return summary["mean_acceptance_length"], TARGET_PASS_S * decode_tokens / decode_s, steps


def agrees(measured: float, predicted: float, alpha: float, k: int, steps: int) -> bool:
    """Within 4 Monte Carlo standard errors (relative), plus 0.3 % for the capped last steps."""
    mean = analytic.expected_tokens_per_step(alpha, k)
    rel_se = tokens_per_step_sd(alpha, k) / mean / math.sqrt(steps)
    return abs(measured / predicted - 1) <= 4 * rel_se + 0.003


GRID = [(a, k, c) for a in (0.6, 0.85) for k in (1, 3, 6) for c in (0.05, 0.2)]


@pytest.mark.parametrize(("alpha", "k", "c"), GRID)
def test_simulator_at_batch_one_matches_the_closed_forms(tmp_path, alpha, k, c):
    """Sample: 4 requests x 2,000 decode tokens = 2,400-7,000 steps per point; the tolerance is
    4 standard errors of the mean tokens per step (1.0-2.6 % relative), so a 3 % bias in tokens
    per step or in the speedup is detected (see the planted-bug test below)."""
    tokens, speedup, steps = simulate_batch_one(tmp_path, alpha, k, c)
    assert agrees(tokens, analytic.expected_tokens_per_step(alpha, k), alpha, k, steps)
    assert agrees(speedup, analytic.walltime_improvement(alpha, k, c), alpha, k, steps)


def test_the_agreement_check_catches_a_planted_bug(tmp_path):
    """A simulator whose drafts are accepted at alpha - 0.05 while claiming alpha (a 6 % bias in
    tokens per step at alpha 0.85, k 3) fails the same check that the real one passes."""
    alpha, k, c = 0.85, 3, 0.05
    tokens, speedup, steps = simulate_batch_one(tmp_path, alpha - 0.05, k, c)
    assert not agrees(tokens, analytic.expected_tokens_per_step(alpha, k), alpha, k, steps)
    assert not agrees(speedup, analytic.walltime_improvement(alpha, k, c), alpha, k, steps)
    # And a closed form that forgets the bonus token is far off the honest simulation.
    tokens, _, steps = simulate_batch_one(tmp_path, alpha, k, c)
    forgot_bonus = analytic.expected_tokens_per_step(alpha, k) - alpha**k
    assert not agrees(tokens, forgot_bonus, alpha, k, steps)
