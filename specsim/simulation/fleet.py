"""Replicas behind a router (one class per name a scenario may give ``fleet.router``:
``specsim.choices.ROUTERS``), and the processes that feed them requests."""

from __future__ import annotations

import math
from operator import attrgetter
from typing import ClassVar

import numpy as np

from specsim.choices import ROUTERS, check_implemented
from specsim.simulation.replica import Replica
from specsim.simulation.request import Request


class Router:
    """Picks the replica for each arriving request (``request`` is None where a caller routes
    without one: the disaggregated fleet's decode side)."""

    name: ClassVar[str]

    def __init__(self, replicas: list[Replica], rng: np.random.Generator):
        self.replicas = replicas

    def choose(self, request: Request | None = None) -> Replica:
        raise NotImplementedError


class RoundRobin(Router):
    name = "round_robin"

    def __init__(self, replicas: list[Replica], rng: np.random.Generator):
        super().__init__(replicas, rng)
        self._next = 0

    def choose(self, request: Request | None = None) -> Replica:
        replica = self.replicas[self._next]
        self._next = (self._next + 1) % len(self.replicas)
        return replica


_outstanding = attrgetter("outstanding")


class LeastOutstanding(Router):
    name = "least_outstanding"

    def choose(self, request: Request | None = None) -> Replica:
        # Ties go to the lowest index, so the choice is deterministic.
        return min(self.replicas, key=_outstanding)


# sglang-router's --balance-abs-threshold default (its docs/router/router.md): the load gap,
# in outstanding requests, past which cache affinity gives way to the least loaded replica.
DEFAULT_BALANCE_ABS_THRESHOLD = 32


class CacheAware(LeastOutstanding):
    """sglang-router's ``cache_aware`` policy, for sessions: a turn goes to the replica whose
    prefix memory holds the most of its session (its latest finished turn there; ties to the
    lowest index) unless that replica's outstanding requests exceed the least loaded one's by
    more than ``balance_abs_threshold``; then, and for a request no replica remembers (no
    session, a first turn, another prefix source), to the least outstanding. It reads the
    replicas' memories as they stand, without touching their recency."""

    name = "cache_aware"

    def __init__(
        self,
        replicas: list[Replica],
        rng: np.random.Generator,
        balance_abs_threshold: int = DEFAULT_BALANCE_ABS_THRESHOLD,
    ):
        super().__init__(replicas, rng)
        self.balance_abs_threshold = balance_abs_threshold

    def choose(self, request: Request | None = None) -> Replica:
        least = super().choose(request)
        if request is None:
            return least
        held = [replica.admission.prefix.remembered(request) for replica in self.replicas]
        best = max(held)
        if best == 0:
            return least
        holder = self.replicas[held.index(best)]
        if holder.outstanding - least.outstanding > self.balance_abs_threshold:
            return least
        return holder


class RandomReplica(Router):
    name = "random"

    def __init__(self, replicas: list[Replica], rng: np.random.Generator):
        super().__init__(replicas, rng)
        self.rng = rng
        self._draws: list[int] = []  # replica indices drawn ahead, in chunks, last first

    def choose(self, request: Request | None = None) -> Replica:
        if not self._draws:
            self._draws = self.rng.integers(0, len(self.replicas), size=4096)[::-1].tolist()
        return self.replicas[self._draws.pop()]


# The implementation of each router a scenario may name (``specsim.choices.ROUTERS``).
ROUTER_CLASSES: dict[str, type[Router]] = {
    cls.name: cls for cls in (RoundRobin, LeastOutstanding, RandomReplica, CacheAware)
}
check_implemented(ROUTERS, ROUTER_CLASSES, "routers")


class Fleet:
    """Routes each arriving request to a replica, by the scenario's router."""

    def __init__(
        self,
        replicas: list[Replica],
        router: str,
        rng: np.random.Generator,
        balance_abs_threshold: int | None = None,
    ):
        self.replicas = replicas
        # The scenario allows the threshold with the cache-aware router only.
        options = (
            {}
            if balance_abs_threshold is None
            else {"balance_abs_threshold": balance_abs_threshold}
        )
        self.router = ROUTER_CLASSES[router](replicas, rng, **options)

    def choose(self, request: Request | None = None) -> Replica:
        if len(self.replicas) == 1:  # no router draws for a single replica
            return self.replicas[0]
        return self.router.choose(request)

    def dispatch(self, request: Request) -> None:
        self.choose(request).enqueue(request)


class Frontend:
    """The API server in front of a fleet: each request reaches the fleet ``request_s`` after
    its client sent it (the profile's ``overhead.per_request_s``: HTTP, chat template,
    tokenising), and arrives then. The records take the delay off again (``RecordSink``), so
    a request's TTFT and E2E pay it; the engine's iterations do not (the server runs beside
    the engine's loop). An open loop's feed adds it to its times instead (``ArrivalFeed``)."""

    def __init__(self, env, fleet, request_s: float):
        self.env = env
        self.fleet = fleet
        self.replicas = fleet.replicas
        self.request_s = request_s
        self.in_flight = 0  # requests sent and not yet arrived

    def dispatch(self, request: Request) -> None:
        self.in_flight += 1
        self.env.timeout(self.request_s).callbacks.append(lambda _event: self._arrive(request))

    def arrive_at(self, request: Request, when: float) -> None:
        """A request a compiled loop sent, arriving at ``when`` exactly."""
        self.in_flight += 1
        self.env.timeout_at(when).callbacks.append(lambda _event: self._arrive(request))

    def _arrive(self, request: Request) -> None:
        self.in_flight -= 1
        request.arrival = self.env.now
        self.fleet.dispatch(request)


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


class ArrivalFeed:
    """An open-loop source's requests one at a time, with the next one's time in view (the
    fast path's replicas end their compiled calls before it; a replica alone takes them itself);
    ``delay``: the API server's (``Frontend``), added to every time."""

    def __init__(self, source, counter: list[int], delay: float = 0.0):
        self._chunks = source.chunks()
        self._delay = delay
        self._counter = counter
        self._times: list[float] = []
        self._prompts: list[int] = []
        self._outputs: list[int] = []
        self._next = 0
        self.next_time = math.inf
        self._load()

    def _load(self) -> None:
        for times, prompts, outputs in self._chunks:
            if len(times):
                times = times + self._delay if self._delay else times
                self._times, self._prompts = times.tolist(), prompts.tolist()
                self._outputs, self._next = outputs.tolist(), 0
                self.next_time = self._times[0]
                return
        self.next_time = math.inf

    def upcoming(self, n: int) -> tuple[list[float], list[int], list[int]]:
        """The next arrivals of the chunk at hand, at most ``n`` (times, prompts, outputs),
        without taking them; empty lists when none is left."""
        if self.next_time == math.inf:
            return [], [], []
        i = self._next
        return self._times[i : i + n], self._prompts[i : i + n], self._outputs[i : i + n]

    @property
    def next_id(self) -> int:
        """The number the next request gets."""
        return self._counter[0]

    def taken(self, m: int) -> None:
        """The first ``m`` of the ``upcoming`` arrivals were taken, numbered in order (one by
        ``pop``, or several by a compiled loop, ``compiled_serving.py``)."""
        self._counter[0] += m
        self._next += m
        if self._next < len(self._times):
            self.next_time = self._times[self._next]
        else:
            self._load()

    def pop(self) -> Request:
        """The next request (numbered in arrival order)."""
        i = self._next
        request = Request(self._counter[0], self._times[i], self._prompts[i], self._outputs[i])
        self.taken(1)
        return request


def fed_arrivals(env, feed: ArrivalFeed, fleet: Fleet):
    """SimPy process: ``open_loop_arrivals`` for the fast path's replicas, from a feed."""
    while feed.next_time < math.inf:
        t = feed.next_time
        if t > env.now:
            yield env.timeout(t - env.now)
        fleet.dispatch(feed.pop())


class ClosedLoopClients:
    """``concurrency`` clients: each sends its next request when the previous one completes.

    They also mark the steady window a load test measures: it opens when every client's first
    request has finished (the synchronised start is behind) and closes the first time a client
    is refused a new request (the drain begins). ``steady`` gives the window and the output
    tokens the fleet emitted within it.
    """

    def __init__(self, env, source, fleet: Fleet, counter: list[int]):
        self.env = env
        self.source = source
        self.fleet = fleet
        self.counter = counter
        self._initial = (0, 0)  # the ids of the clients' first requests: [first, last + 1)
        self._first_requests = 0  # of those, still running
        self._opened: tuple[float, float] | None = None  # (time, tokens emitted by then)
        self._closed: tuple[float, float] | None = None

    def start(self) -> None:
        first = self.counter[0]
        for client in range(self.source.concurrency):
            self._issue(client)
        self._initial = (first, self.counter[0])
        self._first_requests = self.counter[0] - first

    def _emitted(self) -> float:
        now = self.env.now
        return sum(replica.emitted_tokens_at(now) for replica in self.fleet.replicas)

    def _issue(self, client: int) -> None:
        now = self.env.now
        if not self.source.may_issue(now):
            if self._closed is None:
                self._closed = (now, self._emitted())
            return
        prompt, output = self.source.next_lengths()
        self.fleet.dispatch(Request(self.counter[0], now, prompt, output, client))
        self.counter[0] += 1

    def steady(self) -> tuple[float, float, float] | None:
        """(start, end, output tokens emitted in between), or None when the window is empty
        (the drain began before every client's first request had finished)."""
        if self._opened is None or self._closed is None or self._closed[0] <= self._opened[0]:
            return None
        return self._opened[0], self._closed[0], self._closed[1] - self._opened[1]

    def first_requests(self) -> tuple[int, int, int]:
        """The ids of the clients' first requests, [first, last + 1), and how many still run."""
        return self._initial[0], self._initial[1], self._first_requests

    def caught_up(
        self,
        first_left: int,
        opened: tuple[float, float] | None,
        closed: tuple[float, float] | None,
    ) -> None:
        """What a compiled loop did as ``on_finish`` (``compiled_serving.py``): the first
        requests still running, and the steady window's opening and closing where it marked
        them, as (time, output tokens emitted by then)."""
        self._first_requests = first_left
        if opened is not None:
            self._opened = opened
        if closed is not None and self._closed is None:
            self._closed = closed

    def on_finish(self, request: Request, now: float) -> None:
        if self._initial[0] <= request.rid < self._initial[1]:
            self._first_requests -= 1
            if self._first_requests == 0:
                self._opened = (now, self._emitted())
        think = self.source.think_time()
        client = request.client
        if think <= 0:
            self._issue(client)
            return
        self.env.timeout(think).callbacks.append(lambda _event: self._issue(client))
