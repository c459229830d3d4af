"""``Clock.timeout_at`` wakes at the exact time, where a relative delay cannot land (a compiled
span of iterations ends at their durations added in order)."""

from __future__ import annotations

from specsim.simulation.clock import Clock


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
