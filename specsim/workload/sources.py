"""Request sources: open-loop arrival processes, trace replay and closed-loop clients, and the
load-test client's cap on requests in flight (``ClientCap``).

Open-loop sources yield requests in chunks (arrival times, prompt and output tokens as numpy
arrays), so a run of millions of requests never holds them all. Arrival times come from the
arrivals stream and lengths from the lengths stream, so changing speculation settings leaves the
traffic unchanged.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from specsim.scenario import Workload
from specsim.workload.lengths import LengthPairs
from specsim.workload.traces import Trace

CHUNK = 4096

Chunk = tuple[np.ndarray, np.ndarray, np.ndarray]


def interarrival_gaps(workload: Workload, rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` gaps between arrivals for an open-loop process with mean ``1 / rate``."""
    mean = 1.0 / workload.rate
    if workload.kind == "poisson":
        return rng.exponential(mean, size=n)
    if workload.kind == "bursty":
        # Gamma with shape 1/cv^2 has coefficient of variation cv; scale keeps the mean.
        shape = 1.0 / workload.cv**2
        return rng.gamma(shape, mean / shape, size=n)
    return np.full(n, mean)


class OpenLoopSource:
    """Poisson, bursty (gamma) or fixed-rate arrivals with drawn lengths."""

    closed_loop = False

    def __init__(
        self,
        workload: Workload,
        lengths: LengthPairs,
        arrivals_rng: np.random.Generator,
        lengths_rng: np.random.Generator,
    ):
        self.workload = workload
        self.lengths = lengths
        self.arrivals_rng = arrivals_rng
        self.lengths_rng = lengths_rng

    def chunks(self) -> Iterator[Chunk]:
        limit = self.workload.requests
        horizon = self.workload.duration_s
        issued = 0
        clock = 0.0
        while limit is None or issued < limit:
            n = CHUNK if limit is None else min(CHUNK, limit - issued)
            times = clock + np.cumsum(interarrival_gaps(self.workload, self.arrivals_rng, n))
            prompt, output = self.lengths.draw(self.lengths_rng, n)
            if horizon is not None and times[-1] >= horizon:
                keep = int(np.searchsorted(times, horizon, side="left"))
                if keep:
                    yield times[:keep], prompt[:keep], output[:keep]
                return
            clock = float(times[-1])
            issued += n
            yield times, prompt, output


class TraceSource:
    """Replay of a trace's arrival times (scaled by ``time_scale``) and lengths."""

    closed_loop = False

    def __init__(self, workload: Workload, trace: Trace):
        self.workload = workload
        self.trace = trace

    def chunks(self) -> Iterator[Chunk]:
        times = self.trace.arrival_s * self.workload.time_scale
        count = len(self.trace)
        if self.workload.requests is not None:
            count = min(count, self.workload.requests)
        if self.workload.duration_s is not None:
            count = min(count, int(np.searchsorted(times, self.workload.duration_s, side="left")))
        for start in range(0, count, CHUNK):
            stop = min(count, start + CHUNK)
            yield (
                times[start:stop],
                self.trace.prompt_tokens[start:stop],
                self.trace.output_tokens[start:stop],
            )


class ClosedLoopSource:
    """``concurrency`` clients, each sending its next request after the previous one completes.

    Lengths and think times are drawn in chunks and handed out one at a time.
    """

    closed_loop = True

    def __init__(
        self,
        workload: Workload,
        lengths: LengthPairs,
        arrivals_rng: np.random.Generator,
        lengths_rng: np.random.Generator,
    ):
        self.workload = workload
        self.concurrency = workload.concurrency
        self.limit = workload.requests
        self.horizon = workload.duration_s
        self.think_mean = workload.think_time_s
        self.lengths = lengths
        self.arrivals_rng = arrivals_rng
        self.lengths_rng = lengths_rng
        self.issued = 0
        self._prompts: list[int] = []
        self._outputs: list[int] = []
        self._thinks: list[float] = []

    def may_issue(self, now: float) -> bool:
        """Whether a client may send another request at simulated time ``now``."""
        if self.limit is not None and self.issued >= self.limit:
            return False
        return self.horizon is None or now < self.horizon

    def next_lengths(self) -> tuple[int, int]:
        """The next request's (prompt, output) tokens; counts the request as issued."""
        self._refill(1)
        self.issued += 1
        return self._prompts.pop(), self._outputs.pop()

    def _refill(self, n: int) -> None:
        """At least ``n`` lengths drawn ahead, in chunks (later chunks go before earlier ones:
        the lists are reversed, so that pop() hands them out in draw order)."""
        while len(self._prompts) < n:
            prompt, output = self.lengths.draw(self.lengths_rng, CHUNK)
            self._prompts = prompt[::-1].tolist() + self._prompts
            self._outputs = output[::-1].tolist() + self._outputs

    def upcoming(self, n: int) -> tuple[list[int], list[int]]:
        """The next ``n`` requests' prompt and output lengths, in the order ``next_lengths``
        hands them out, without issuing them (drawn in the chunks it would draw)."""
        self._refill(n)
        return self._prompts[: -n - 1 : -1], self._outputs[: -n - 1 : -1]

    def issued_ahead(self, m: int) -> None:
        """Count the first ``m`` of the ``upcoming`` requests as issued (a compiled loop's)."""
        if m:
            del self._prompts[-m:]
            del self._outputs[-m:]
        self.issued += m

    def think_time(self) -> float:
        if self.think_mean <= 0:
            return 0.0
        if not self._thinks:
            self._thinks = self.arrivals_rng.exponential(self.think_mean, CHUNK)[::-1].tolist()
        return self._thinks.pop()


class ClientCap:
    """A load-test client's cap on requests in flight (``workload.max_concurrency``; vLLM's
    and SGLang's bench ``--max-concurrency``, a semaphore taken before each send).

    ``dispatch`` sends a request on through ``send`` while fewer than ``limit`` are in flight;
    otherwise it waits, first come first served, until ``on_finish`` frees a slot. A waiting
    request's ``arrival`` becomes the moment it is sent: the benchmark clients start a
    request's clock after the semaphore, so TTFT and E2E leave the client's wait out.
    """

    def __init__(self, limit: int, send: Callable[[Any], None]):
        self.free = limit
        self.send = send
        self.waiting: deque = deque()

    def dispatch(self, request: Any) -> None:
        if self.free:
            self.free -= 1
            self.send(request)
        else:
            self.waiting.append(request)

    def on_finish(self, now: float) -> None:
        """A request in flight finished at ``now``: the next waiting one takes its slot."""
        if self.waiting:
            request = self.waiting.popleft()
            request.arrival = now
            self.send(request)
        else:
            self.free += 1
