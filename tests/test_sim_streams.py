"""The compiled pieces the kernels rely on give exactly what the per-iteration path computes.

- ``compiled_step_kernel.cost_parts`` (the cost formula compiled) equals ``iteration_s`` and
  ``draft_flops`` bit for bit, iteration by iteration, for every drafter kind and window;
- ``choose_window`` picks what ``GoodputWindow.choose_batch`` picks at each iteration;
- ``Clock.timeout_at`` wakes at the exact time, where a relative delay cannot land.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from specsim.costs import PassTotals, StepCosts
from specsim.profile import load_profile
from specsim.simulation import compiled_loop
from specsim.simulation.acceptance import RateAcceptance
from specsim.simulation.clock import Clock
from specsim.simulation.policy import GoodputWindow

DATA = Path(__file__).parent / "data"
REPO = Path(__file__).resolve().parent.parent
ROOFLINE = REPO / "profiles" / "llama3.1-8b_llama3.2-1b_h100-roofline.yaml"


def kernel():
    return compiled_loop.step_kernel()


def each(costs: StepCosts, k: int, *columns) -> np.ndarray:
    """The compiled cost parts (seconds, draft FLOPs, wasted FLOPs) of each iteration."""
    vector, parts = np.array(costs.terms), np.empty((len(columns[0]), 3))
    for i, values in enumerate(zip(*columns, strict=True)):
        kernel().cost_parts(vector, k, *values, parts[i])
    return parts.T


@pytest.mark.parametrize("drafter", [None, "llama3.2-1b", "ngram", "eagle"])
def test_decode_seconds_equal_iteration_s_bit_for_bit(drafter, eagle_profile):
    """Seconds and draft FLOPs of 50 iterations per k and batch size (seed 3), one batch size
    for all and one per iteration, each the scalar call's."""
    profile = eagle_profile if drafter == "eagle" else load_profile(ROOFLINE)
    costs = StepCosts(profile, drafter)
    rng = np.random.default_rng(3)
    for k in range(0 if drafter is None else 9):
        for size in (1, 2, 7, 64, 256, None):
            rows = rng.integers(1, 300, 50) if size is None else np.full(50, size)
            rows = rows.astype(np.float64)
            tokens = rows * (k + 1.0) - rng.integers(0, 2, 50) * rows
            kv = rows * rng.integers(16, 9000, 50)
            pairs = kv * (k + 1) + rng.integers(0, 1000, 50)
            seconds, flops, _ = each(costs, k, rows, tokens, kv, pairs)
            for i in range(50):
                r, t, c, q = int(rows[i]), float(tokens[i]), float(kv[i]), float(pairs[i])
                assert seconds[i] == costs.iteration_s(k, PassTotals(r, t, c, q))
                assert seconds[i] == costs.decode_iteration_s(k, r, t, c, q)
                assert flops[i] == costs.draft_flops(r, k, c)
        if drafter is None:
            break


@pytest.fixture(scope="module")
def eagle_profile():
    """The roofline profile with its 1B drafter as autoregressive heads (EAGLE's kind)."""
    loaded = load_profile(ROOFLINE)
    data = loaded.profile.model_dump(mode="json", exclude_none=True)
    head = dict(data["drafters"]["llama3.2-1b"], kind="heads", passes="autoregressive")
    data["drafters"]["eagle"] = head
    data["acceptance"] = [
        dict(a, drafter="eagle") if a["drafter"] == "llama3.2-1b" else a for a in data["acceptance"]
    ]
    from specsim.profile import LoadedProfile, Profile

    return LoadedProfile(Profile.model_validate(data), loaded.path)


def test_the_compiled_adaptive_choice_equals_the_policys_at_each_iteration():
    # A per-sequence cost of 10 us (the roofline's before its fitted 120 us): with it the
    # choice still moves at 12 rows, so the equality below is not of a constant.
    from specsim.profile import LoadedProfile

    loaded = load_profile(ROOFLINE)
    overhead = loaded.profile.overhead.model_copy(update={"per_sequence_s": 1e-5})
    profile = loaded.profile.model_copy(update={"overhead": overhead})
    costs = StepCosts(LoadedProfile(profile, loaded.path), "llama3.2-1b")
    acceptance = RateAcceptance(np.array([0.8, 0.7, 0.65, 0.6, 0.55, 0.5]), concentration=None)
    policy = GoodputWindow(6)
    policy.attach(costs, acceptance)
    _, goodput = compiled_loop.window_terms(policy)
    rng = np.random.default_rng(7)
    slots, iterations = 12, 40
    for rows in (1, 3, 12):
        remaining = np.zeros((iterations, slots))
        context = np.zeros((iterations, slots))
        used = rng.choice(slots, rows, replace=False)
        remaining[:, used] = rng.integers(1, 40, (iterations, rows))
        context[:, used] = rng.integers(10, 6000, (iterations, rows))
        kv = context.sum(axis=1)
        vector, none = np.array(costs.terms), np.empty(0, dtype=np.int64)
        along = [
            kernel().choose_window(none, goodput, vector, rows, kv[i], remaining[i], context[i])
            for i in range(iterations)
        ]
        each_choice = [
            policy.choose_batch(rows, kv[i], remaining[i], context[i], None, 8192)
            for i in range(iterations)
        ]
        assert along == each_choice
        assert len(set(each_choice)) > 1 or rows == 1  # short rows move the choice


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
