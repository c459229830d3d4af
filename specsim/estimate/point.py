"""One scenario's figures in closed form: the estimate a screened sweep ranks configurations by.

``estimate(scenario, profile)`` builds the replica model of ``load`` from the scenario's own
cost model (``StepCosts``, the KV capacity), acceptance chains and traffic, solves it at the
offered rate per replica (an open loop's rate, a trace's replay rate, a closed loop's pace by
bisection), and returns the summary figures the planner chooses by: mean end-to-end latency,
the share of requests meeting the SLO and the goodput. It simulates nothing; a few milliseconds.

A saturated open-loop run of N requests queues: the i-th waits about i (1 / mu - 1 / lambda)
more than the first, so its SLO share is counted over that ramp and its mean end-to-end latency
gains half the last wait.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import numpy as np

from specsim.costs import StepCosts, kv_capacity_tokens
from specsim.costs.kv_cache import kv_capacity_blocks
from specsim.estimate.acceptance import acceptance_chains
from specsim.estimate.latency import Latencies
from specsim.estimate.load import OperatingPoint, Replica, Window
from specsim.estimate.passes import Passes
from specsim.estimate.prefix import expected_hits
from specsim.estimate.traffic import traffic as scenario_traffic

RAMP_POINTS = 16  # waits of a saturated run's queue the SLO share is averaged over
_PACE_ROUNDS = 40  # bisection rounds for a closed loop's request rate


@dataclass(frozen=True)
class PointEstimate:
    """The figures of one scenario, estimated; ``slo_attainment`` and ``goodput`` are None
    without an SLO."""

    rate_per_replica: float
    saturated: bool
    utilisation: float  # the offered rate over the most a replica serves
    peak_utilisation: float  # the same in the traffic's busiest window
    k: int  # the window at the operating batch
    batch_size: float
    e2e_mean_s: float
    ttft_mean_s: float
    tpot_mean_s: float
    slo_attainment: float | None
    goodput_requests_per_s: float | None
    throughput_requests_per_s: float
    # No run of this traffic serves more requests per second than this, whatever its settings:
    # a run lasts until its last finish, which is after its last arrival (None: a closed loop).
    ceiling_requests_per_s: float | None

    def figures(self) -> dict[str, float | bool | None]:
        """The estimate as plain numbers (for JSON)."""
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


def _choose_k(speculation):
    """Batch size -> k for the scenario's window policy (the adaptive policy by the most
    expected tokens per second of a decode step, as ``GoodputWindow`` scores them)."""
    top = speculation.max_k if speculation.enabled else 0
    if top == 0:
        return lambda replica, rows: 0
    if speculation.policy == "fixed":
        return lambda replica, rows: speculation.k
    if speculation.policy == "by_batch":
        table = [(row.max_batch, row.k) for row in speculation.k_by_batch]
        return lambda replica, rows: next(
            (k for limit, k in table if math.ceil(rows - 1e-9) <= limit), 0
        )

    def adaptive(replica: Replica, rows: float) -> int:
        rate = [
            replica.windows[k].tokens_per_step / replica.decode_s(k, max(rows, 1.0))
            for k in range(top + 1)
        ]
        return int(np.argmax(rate))

    return adaptive


_WINDOWS: dict[tuple, tuple] = {}  # key -> (the chains, pinned so ids stay unique; window)
_WINDOWS_SIZE = 512


def _window(k: int, chains, offered) -> Window:
    """``Window.build``, cached: a sweep's loads share their lengths (one stream draws them)
    and its windows share their chains, so each (k, chains, lengths) is built once."""
    lengths = hashlib.sha1(offered.prompt.tobytes() + offered.output.tobytes()).hexdigest()
    key = (k, id(chains), lengths)
    found = _WINDOWS.get(key)
    if found is None or found[0] is not chains:
        if len(_WINDOWS) >= _WINDOWS_SIZE:
            _WINDOWS.pop(next(iter(_WINDOWS)))
        found = _WINDOWS[key] = (chains, Window.build(k, chains, offered))
    return found[1]


def build_replica(scenario, profile) -> Replica:
    spec = scenario.speculation
    enabled = spec.enabled
    entry = None
    if spec.drafter is not None:
        entry = profile.acceptance(spec.drafter, spec.verifier, spec.temperature)
    costs = StepCosts(profile, spec.drafter if enabled else None)
    capacity = kv_capacity_tokens(profile, spec.drafter, enabled, scenario.engine)
    offered = scenario_traffic(scenario)
    top = spec.max_k if enabled else 0
    windows = {
        k: _window(
            k,
            acceptance_chains(
                entry if enabled else None,
                spec.acceptance,
                k,
                spec.acceptance_rate,
                spec.heterogeneity,
            ),
            offered,
        )
        for k in range(top + 1)
    }
    engine = scenario.engine
    lookahead = top + 1
    if engine.block_size is not None:
        # As the simulator counts blocks: whole blocks, and k slots more for a drafter's own cache.
        capacity = kv_capacity_blocks(capacity, engine.block_size)
        if costs.drafter.passes is not None and costs.drafter.passes.own_cache:
            lookahead += top
    return Replica(
        Passes(costs, engine),
        windows,
        offered,
        _choose_k(spec),
        capacity,
        lookahead,
        engine.max_batch,
        engine.padded_attention,
        engine.block_size,
        expected_hits(scenario, offered.prompt),
    )


def _figures(replica: Replica, point: OperatingPoint, limits, requests: int) -> dict:
    """Latencies and SLO share at an operating point (a saturated one at its top batch)."""
    if point.saturated:
        busy = min(0.999, point.service_rate * replica.prompt_s(point.k, point.batch))
        iteration = point.decode_s / (1.0 - busy)
        # No Erlang wait at the limit: the queue's ramp is counted separately.
        point = OperatingPoint(
            point.service_rate, True, point.service_rate, point.batch, math.inf,
            point.k, point.decode_s, iteration, busy,
        )  # fmt: skip
    latencies = Latencies(replica, point)
    last_wait = 0.0
    if point.saturated and point.rate > 0:
        last_wait = max(0.0, requests * (1.0 / point.service_rate - 1.0 / point.rate))
    waits = np.linspace(0.0, last_wait, RAMP_POINTS) if last_wait else np.zeros(1)
    attainment = None
    if limits:
        attainment = float(np.mean([latencies.attainment(limits, w) for w in waits]))
    return {
        "e2e": latencies.e2e_mean + last_wait / 2.0,
        "ttft": latencies.ttft_mean + last_wait / 2.0,
        "tpot": latencies.tpot_mean,
        "attainment": attainment,
        "point": point,
    }


def _solve(replica: Replica, rate: float, limits, requests: int) -> tuple[OperatingPoint, dict]:
    point = replica.operating_point(rate)
    if point.saturated:
        point = OperatingPoint(
            rate, True, point.service_rate, point.batch, point.batch_limit,
            point.k, point.decode_s, point.iteration_s, point.prompt_share,
        )  # fmt: skip
    return point, _figures(replica, point, limits, requests)


def _paced(replica: Replica, offered, limits) -> tuple[float, OperatingPoint, dict]:
    """A closed loop's request rate: C clients, each sending again ``think_s`` after its
    answer, so rate = C / (E2E(rate) + think), solved by bisection."""
    clients, think = offered.clients, offered.think_s
    mu = replica.service_rate()[0]
    low, high = 0.0, min(mu, clients / max(think, 1e-9))
    for _ in range(_PACE_ROUNDS):
        mid = 0.5 * (low + high)
        point, figures = _solve(replica, mid, limits, offered.requests)
        if mid * (figures["e2e"] + think) < clients and not point.saturated:
            low = mid
        else:
            high = mid
    point, figures = _solve(replica, max(low, 1e-9), limits, offered.requests)
    return low, point, figures


def estimate(scenario, profile) -> PointEstimate:
    """The scenario's figures, estimated per replica (requests spread evenly over replicas)."""
    replica = build_replica(scenario, profile)
    offered = replica.traffic
    limits = scenario.slo.limits() if scenario.slo is not None else {}
    replicas = scenario.fleet.total_replicas
    requests = max(1, offered.requests // replicas)
    if offered.closed_loop:
        per_replica = offered.clients / replicas
        solo = type(offered)(
            offered.prompt, offered.output, requests, None, per_replica, offered.think_s
        )
        rate, point, figures = _paced(replica, solo, limits)
        duration = requests / rate if rate > 0 else math.inf
    else:
        rate = offered.rate / replicas
        point, figures = _solve(replica, rate, limits, requests)
        served_rate = min(rate, point.service_rate) if point.saturated else rate
        duration = requests / served_rate + figures["e2e"]
    served = replicas * requests / duration if duration > 0 else 0.0
    attainment = figures["attainment"]
    utilisation = rate / point.service_rate if point.service_rate > 0 else math.inf
    return PointEstimate(
        rate_per_replica=rate,
        saturated=point.saturated,
        utilisation=utilisation,
        peak_utilisation=utilisation * offered.burst,
        k=point.k,
        batch_size=point.batch,
        e2e_mean_s=figures["e2e"],
        ttft_mean_s=figures["ttft"],
        tpot_mean_s=figures["tpot"],
        slo_attainment=attainment,
        goodput_requests_per_s=None if attainment is None else attainment * served,
        throughput_requests_per_s=served,
        ceiling_requests_per_s=None
        if not offered.last_arrival_s
        else offered.requests / offered.last_arrival_s,
    )
