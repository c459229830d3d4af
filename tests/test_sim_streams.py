"""The pieces the fast path relies on give exactly what the per-iteration path computes.

- ``StepCosts.decode_seconds`` (and ``_by_k``) equal ``iteration_s`` bit for bit, element by
  element, for every drafter kind and window;
- ``GoodputWindow.choose_along`` picks what ``choose_batch`` picks at each iteration;
- ``Clock.timeout_at`` wakes at the exact time, where a relative delay cannot land.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from specsim.costs import PassTotals, StepCosts
from specsim.profile import load_profile
from specsim.simulation.acceptance import RateAcceptance
from specsim.simulation.clock import Clock
from specsim.simulation.policy import GoodputWindow

DATA = Path(__file__).parent / "data"
REPO = Path(__file__).resolve().parent.parent
ROOFLINE = REPO / "profiles" / "llama3.1-8b_llama3.2-1b_h100-roofline.yaml"


@pytest.mark.parametrize("drafter", [None, "llama3.2-1b", "ngram"])
def test_decode_seconds_equal_iteration_s_bit_for_bit(drafter):
    costs = StepCosts(load_profile(ROOFLINE), drafter)
    rng = np.random.default_rng(3)
    for k in range(0 if drafter is None else 9):
        for rows in (1, 2, 7, 64, 256):
            tokens = rows * (k + 1.0) - rng.integers(0, rows * k + 1, 50)
            kv = rng.integers(rows * 16, rows * 9000, 50).astype(float)
            pairs = kv * (k + 1) + rng.integers(0, 1000, 50)
            vector = costs.decode_seconds(k, rows, tokens, kv, pairs)
            scalar = [
                costs.iteration_s(k, PassTotals(rows, float(t), float(c), float(p)))
                for t, c, p in zip(tokens, kv, pairs, strict=True)
            ]
            assert vector.tolist() == scalar
            decode_only = [
                costs.decode_iteration_s(k, rows, float(t), float(c), float(p))
                for t, c, p in zip(tokens, kv, pairs, strict=True)
            ]
            assert decode_only == scalar
        if drafter is None:
            break


@pytest.mark.parametrize("drafter", [None, "llama3.2-1b", "ngram"])
def test_decode_terms_with_a_batch_size_per_iteration_equal_the_scalar_calls(drafter):
    """A stretch through finishes has one batch size per iteration: seconds and draft FLOPs
    per iteration are each the scalar call's, bit for bit (50 iterations per k, seed 4)."""
    costs = StepCosts(load_profile(ROOFLINE), drafter)
    rng = np.random.default_rng(4)
    for k in range(0 if drafter is None else 6):
        rows = rng.integers(1, 300, 50).astype(float)
        tokens = rows * (k + 1.0) - rng.integers(0, 2, 50) * rows
        kv = rows * rng.integers(16, 9000, 50)
        pairs = kv * (k + 1) + rng.integers(0, 1000, 50)
        seconds = costs.decode_seconds(k, rows, tokens, kv, pairs)
        flops = np.broadcast_to(costs.decode_draft_flops(rows, k, kv), rows.shape)
        for i in range(50):
            r, t, c, p = int(rows[i]), float(tokens[i]), float(kv[i]), float(pairs[i])
            assert seconds[i] == costs.iteration_s(k, PassTotals(r, t, c, p))
            assert flops[i] == costs.draft_flops(r, k, c)
        if drafter is None:
            break


@pytest.mark.parametrize("drafter", [None, "llama3.2-1b", "ngram"])
def test_decode_seconds_for_every_window_equal_iteration_s_bit_for_bit(drafter):
    """The adaptive policy's candidates along a stretch: (iterations, windows) totals at one
    batch size, each value the scalar call's (40 iterations x 7 windows per batch size)."""
    costs = StepCosts(load_profile(ROOFLINE), drafter)
    rng = np.random.default_rng(5)
    windows = 7
    for rows in (1, 3, 64, 256):
        kv = rng.integers(rows * 16, rows * 9000, 40).astype(float)
        tokens = rows * (np.arange(windows) + 1.0) - rng.integers(0, rows + 1, (40, windows))
        pairs = kv[:, None] * 3.0 + rng.integers(0, 1000, (40, windows))
        seconds = costs.decode_seconds_by_k(rows, tokens, kv, pairs)
        for i in range(40):
            for k in range(windows):
                decode = PassTotals(rows, float(tokens[i, k]), float(kv[i]), float(pairs[i, k]))
                assert seconds[i, k] == costs.iteration_s(k, decode)


def test_the_adaptive_choice_along_a_stretch_equals_each_iterations_choice():
    costs = StepCosts(load_profile(ROOFLINE), "llama3.2-1b")
    acceptance = RateAcceptance(np.array([0.8, 0.7, 0.65, 0.6, 0.55, 0.5]), concentration=None)
    policy = GoodputWindow(6)
    policy.attach(costs, acceptance)
    rng = np.random.default_rng(7)
    slots, iterations = 12, 40
    for rows in (1, 3, 12):
        remaining = np.zeros((iterations, slots))
        context = np.zeros((iterations, slots))
        used = rng.choice(slots, rows, replace=False)
        remaining[:, used] = rng.integers(1, 40, (iterations, rows))
        context[:, used] = rng.integers(10, 6000, (iterations, rows))
        kv = context.sum(axis=1)
        along = policy.choose_along(rows, kv, remaining, context, slots)
        each = [
            policy.choose_batch(rows, kv[i], remaining[i], context[i], None, 8192)
            for i in range(iterations)
        ]
        assert along.tolist() == each
        assert len(set(each)) > 1 or rows == 1  # short rows move the choice


def test_clock_wakes_at_the_exact_time_a_delay_cannot_reach():
    now, when = 0.0225, 0.11449999999999998
    assert now + (when - now) != when  # no relative delay lands here (nor an ulp either side)
    env = Clock()
    woke = []

    def sleeper():
        yield env.timeout(now)
        yield env.timeout_at(when)
        woke.append(env.now)

    env.process(sleeper())
    env.run()
    assert woke == [when]
