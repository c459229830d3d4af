"""Replicas behind a router, and the processes that feed them requests."""

from __future__ import annotations

import numpy as np

from specsim.simulation.replica import Replica
from specsim.simulation.request import Request


class Fleet:
    """Routes each arriving request to a replica: round robin, least outstanding, or random."""

    def __init__(self, replicas: list[Replica], router: str, rng: np.random.Generator):
        self.replicas = replicas
        self.router = router
        self.rng = rng
        self._next = 0
        self._random: list[int] = []

    def choose(self) -> Replica:
        replicas = self.replicas
        if len(replicas) == 1:
            return replicas[0]
        if self.router == "round_robin":
            replica = replicas[self._next]
            self._next = (self._next + 1) % len(replicas)
            return replica
        if self.router == "least_outstanding":
            # Ties go to the lowest index, so the choice is deterministic.
            return min(replicas, key=lambda r: r.outstanding)
        if not self._random:
            self._random = self.rng.integers(0, len(replicas), size=4096)[::-1].tolist()
        return replicas[self._random.pop()]

    def dispatch(self, request: Request) -> None:
        replica = self.choose()
        replica.check_fits(request)
        replica.enqueue(request)


def open_loop_arrivals(env, source, fleet: Fleet, counter: list[int]):
    """SimPy process: issue each request of an open-loop source or trace at its arrival time."""
    for times, prompts, outputs in source.chunks():
        for t, prompt, output in zip(
            times.tolist(), prompts.tolist(), outputs.tolist(), strict=True
        ):
            if t > env.now:
                yield env.timeout(t - env.now)
            fleet.dispatch(Request(counter[0], t, prompt, output))
            counter[0] += 1


class ClosedLoopClients:
    """``concurrency`` clients: each sends its next request when the previous one completes."""

    def __init__(self, env, source, fleet: Fleet, counter: list[int]):
        self.env = env
        self.source = source
        self.fleet = fleet
        self.counter = counter

    def start(self) -> None:
        for client in range(self.source.concurrency):
            self._issue(client)

    def _issue(self, client: int) -> None:
        now = self.env.now
        if not self.source.may_issue(now):
            return
        prompt, output = self.source.next_lengths()
        self.fleet.dispatch(Request(self.counter[0], now, prompt, output, client))
        self.counter[0] += 1

    def on_finish(self, request: Request, now: float) -> None:
        think = self.source.think_time()
        client = request.client
        if think <= 0:
            self._issue(client)
            return
        self.env.timeout(think).callbacks.append(lambda _event: self._issue(client))
