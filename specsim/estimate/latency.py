"""Per-request latencies at an operating point, and the SLO share they meet.

See ``specsim.estimate.load`` for the model. Latencies are worked out for each (request, level)
of the latency sample: a request's TTFT from its prompt, its TPOT and E2E from its steps at its
acceptance level. The share meeting every SLO limit is counted over those pairs.
"""

from __future__ import annotations

import math

import numpy as np

from specsim.estimate.load import OperatingPoint, Replica

_MAX_SERVERS = 1 << 16  # Erlang C beyond this many slots: no wait below the limit


def erlang_wait(rate: float, rows: float, limit: float) -> tuple[float, float]:
    """Probability of waiting for a slot and the mean wait, for ``floor(limit)`` slots each
    held for ``rows / rate`` seconds (Erlang C; no wait beyond ``_MAX_SERVERS`` slots)."""
    if rate <= 0.0 or rows <= 0.0 or not limit <= _MAX_SERVERS:
        return 0.0, 0.0
    servers = int(limit)
    if rows >= servers:
        return 1.0, math.inf
    blocked = 1.0  # Erlang B by its recursion, stable for any number of servers
    for n in range(1, servers + 1):
        blocked = rows * blocked / (n + rows * blocked)
    waiting = servers * blocked / (servers - rows * (1.0 - blocked))
    hold = rows / rate
    return waiting, waiting * hold / (servers - rows)


class Latencies:
    """TTFT per request, and steps per (request, level), of the latency sample."""

    def __init__(self, replica: Replica, point: OperatingPoint):
        self.replica = replica
        self.point = point
        window = replica.windows[point.k]
        traffic = replica.traffic
        n = window.sample_steps.shape[0]
        prompt = traffic.prompt[:n]
        passes = replica.passes
        rows = point.batch
        decode_tokens = replica.decode_totals(window, rows)[0]
        cached = None if replica.prefix is None else replica.prefix.sample[:n]
        own = passes.prompt_s(prompt, decode_tokens, cached)
        chunks = passes.chunks(prompt, decode_tokens, cached)
        t, t0 = point.iteration_s, point.decode_s
        chunked = passes.engine.chunked_prefill
        # The iteration under way when a request arrives: the chance the replica is busy,
        # times the mean residual of a time-weighted iteration.
        empty = math.exp(-rows)
        busy = min(1.0, 1.0 - empty + point.prompt_share)
        mean_prompt = point.prompt_share / point.rate if point.rate > 0 else 0.0
        per_chunk = mean_prompt / max(float(chunks.mean()), 1.0)
        carrying = point.rate * float(chunks.mean())  # prompt-bearing iterations per second
        bearing = (t0 + per_chunk) if chunked else per_chunk
        if carrying * bearing >= 1.0 or t0 <= 0.0:
            second_moment = t * t
        else:
            plain = (1.0 - carrying * bearing) / t0
            second_moment = plain * t0 * t0 + carrying * bearing * bearing
        residual = busy * second_moment / 2.0
        base = empty * passes.idle_s() + (1.0 - empty) * t0 if chunked else 0.0
        extra = max(0.0, t - t0) if chunked else 0.0
        self.wait_probability, self.queueing_s = erlang_wait(point.rate, rows, point.batch_limit)
        wait = self.queueing_s + passes.costs.request_s  # the API server's delay, then a slot
        self.ttft = wait + residual + own + chunks * (base + extra)
        self.steps = window.sample_steps
        self.steps_per_token = window.steps_per_token
        self.mean_steps = window.steps

    @property
    def ttft_mean(self) -> float:
        return float(self.ttft.mean())

    @property
    def e2e_mean(self) -> float:
        return self.ttft_mean + self.mean_steps * self.point.iteration_s

    @property
    def tpot_mean(self) -> float:
        return float(self.steps_per_token.mean()) * self.point.iteration_s

    def attainment(self, limits: dict[str, float], queue_wait: float = 0.0) -> float:
        """Share of (request, level) pairs meeting every limit; ``queue_wait`` is added to
        each request's wait (a saturated run's backlog)."""
        t = self.point.iteration_s
        ok = np.ones(self.steps.shape, dtype=bool)
        ttft = (self.ttft + queue_wait)[:, None]
        for name, limit in limits.items():
            if name == "ttft_s":
                ok &= ttft <= limit
            elif name == "tpot_s":
                ok &= self.steps_per_token * t <= limit
            elif name == "e2e_s":
                ok &= ttft + self.steps * t <= limit
            elif name == "queueing_s":
                ok &= np.full(self.steps.shape[0], self.queueing_s + queue_wait <= limit)[:, None]
        return float(ok.mean())
