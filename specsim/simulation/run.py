"""The simulation entry point: scenario in, per-request records and a summary out.

Where the compiled serving kernel knows a replica's rules it runs spans of iterations at once
(``compiled_serving.py``, ``fleet_serving.py``). The per-iteration path, one SimPy event per
engine iteration, is the reference the fast path must match byte for byte:
``run_simulation(..., fast_path=False)``, or the environment variable
``SPECSIM_ENGINE=reference`` for a whole process (the command line, sweep workers).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from specsim.costs import StepCosts, kv_capacity_tokens
from specsim.costs.drafters import check_window
from specsim.costs.kv_cache import check_tensor_parallel
from specsim.errors import SpecsimError
from specsim.metrics import round_floats
from specsim.profile import LoadedProfile, Profile, load_profile
from specsim.profile.tp_scaling import scale_profile
from specsim.scenario import Scenario, Speculation
from specsim.simulation.acceptance import RateAcceptance, build_acceptance
from specsim.simulation.clock import Clock
from specsim.simulation.disagg import REPLICA_CLASSES, DisaggregatedFleet, kv_link
from specsim.simulation.fleet import (
    ArrivalFeed,
    ClosedLoopClients,
    Fleet,
    Frontend,
    fed_arrivals,
    open_loop_arrivals,
)
from specsim.simulation.jitter import Jitter
from specsim.simulation.policy import build_policy
from specsim.simulation.records import RecordSink
from specsim.simulation.replica import Replica
from specsim.simulation.summary import run_summary, with_steady
from specsim.simulation.tree_acceptance import TreeLengthAcceptance
from specsim.workload import ClientCap, build_source
from specsim.workload.prefix import build_prefixes


@dataclass
class SimulationResult:
    """What a run produced: ``summary`` holds every summary.json key."""

    summary: dict[str, Any]
    records_path: Path | None
    scenario: Scenario


@dataclass
class PoolSetup:
    name: str
    replicas: int
    speculation: Speculation
    costs: StepCosts
    kv_capacity: int
    acceptance: Any
    entry: Any


def _pool_setup(
    scenario: Scenario, profile: LoadedProfile, name: str, replicas: int, spec: Speculation
) -> PoolSetup:
    entry = None
    shape = spec.tree_shape
    if spec.drafter is not None and shape is not None:
        return _tree_pool_setup(scenario, profile, name, replicas, spec, shape)
    if spec.drafter is not None:
        where = str(scenario.source) if scenario.source else None
        check_window(profile.drafter(spec.drafter), spec.drafter, spec.max_k, spec.policy, where)
        entry = profile.acceptance(spec.drafter, spec.verifier, spec.temperature)
    enabled = spec.enabled
    costs = StepCosts(profile, spec.drafter if enabled else None)
    capacity = kv_capacity_tokens(profile, spec.drafter, enabled, scenario.engine)
    if enabled:
        acceptance = build_acceptance(
            profile,
            entry,
            spec.acceptance,
            spec.max_k,
            spec.acceptance_rate,
            spec.heterogeneity,
            spec.acceptance_shift,
        )
    else:
        acceptance = RateAcceptance(np.zeros(0))
    return PoolSetup(name, replicas, spec, costs, capacity, acceptance, entry)


def _tree_pool_setup(scenario, profile, name, replicas, spec, shape) -> PoolSetup:
    """A pool drafting trees: the profile's tree entry for the shape (measured, else derived),
    the tree's step costs, and accepted lengths drawn from the entry."""
    where = str(scenario.source) if scenario.source else None
    profile.drafter(spec.drafter)
    try:
        entry = profile.profile.tree_acceptance_for(
            spec.drafter, spec.verifier, spec.temperature, shape, spec.tree_drafts
        )
        costs = StepCosts(profile, spec.drafter, shape)
    except SpecsimError as exc:
        raise SpecsimError(
            f"{exc.message} (profile {profile.path})",
            file=where,
            key="speculation.tree",
            fix=exc.fix
            or "profile this tree (specsim profile measure --tree) or remove speculation.tree",
        ) from None
    capacity = kv_capacity_tokens(profile, spec.drafter, True, scenario.engine)
    return PoolSetup(name, replicas, spec, costs, capacity, TreeLengthAcceptance(entry), entry)


def pool_setups(scenario: Scenario, profile: LoadedProfile) -> list[PoolSetup]:
    fleet = scenario.fleet
    if fleet.disaggregation is not None:
        return _disaggregated_setups(scenario, profile)
    if not fleet.pools:
        spec = scenario.speculation
        return [_pool_setup(scenario, profile, "main", fleet.total_replicas, spec)]
    return [
        _pool_setup(scenario, profile, p.name, p.replicas, scenario.pool_speculation(p))
        for p in fleet.pools
    ]


def _disaggregated_setups(scenario: Scenario, profile: LoadedProfile) -> list[PoolSetup]:
    """The prefill pool (speculation off) and the decode pool (the scenario's speculation),
    each on its own profile and tensor-parallel size when the scenario gives them."""
    split = scenario.fleet.disaggregation
    setups = []
    for name, pool in (("prefill", split.prefill), ("decode", split.decode)):
        own = profile if pool.profile is None else cached_profile(scenario.resolve(pool.profile))
        if own.profile.target.params != profile.profile.target.params:
            raise SpecsimError(
                f"the {name} pool's profile {own.path.name} describes another target model "
                f"than {profile.path.name}",
                file=str(scenario.source) if scenario.source else None,
                key=f"fleet.disaggregation.{name}.profile",
                fix="give both pools profiles of the same target model",
            )
        engine = scenario.engine
        if pool.tensor_parallel_size is not None:
            engine = engine.model_copy(update={"tensor_parallel_size": pool.tensor_parallel_size})
            key = f"fleet.disaggregation.{name}.tensor_parallel_size"
            if engine.tensor_parallel_scaling is None:  # a scaled profile is checked as scaled
                check_tensor_parallel(own, engine, key)
        pool_scenario = scenario.model_copy(update={"engine": engine})
        pool_scenario.with_source(scenario.source)
        spec = scenario.speculation if name == "decode" else Speculation()
        setups.append(_pool_setup(pool_scenario, own, name, pool.replicas, spec))
    return setups


# Parsed profiles by (resolved path, mtime, size). A planner sweep runs hundreds of simulations
# on one profile in each worker process; parsing and validating the YAML every time costs more
# than a low-load simulation's engine iterations. Only the immutable parsed model is shared: each
# run wraps it in a fresh ``LoadedProfile`` (whose latency models carry per-run warning state).
_PROFILE_CACHE: dict[tuple[str, int, int], Profile] = {}
_PROFILE_CACHE_SIZE = 8


def cached_profile(path: Path) -> LoadedProfile:
    """``load_profile(path)``, parsing a file again only when it has changed on disk."""
    try:
        stat = path.stat()
    except OSError:
        return load_profile(path)  # let the loader report the missing file
    key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size)
    parsed = _PROFILE_CACHE.get(key)
    if parsed is None:
        loaded = load_profile(path)
        if len(_PROFILE_CACHE) >= _PROFILE_CACHE_SIZE:
            _PROFILE_CACHE.pop(next(iter(_PROFILE_CACHE)))
        _PROFILE_CACHE[key] = loaded.profile
        return loaded
    return LoadedProfile(parsed, path)


def tensor_parallel_profile(scenario: Scenario, profile: LoadedProfile) -> LoadedProfile:
    """The profile, or with ``engine.tensor_parallel_scaling`` its roofline scaled to the
    scenario's ``engine.tensor_parallel_size`` (flagged in its provenance and the summary)."""
    engine = scenario.engine
    tp = engine.tensor_parallel_size
    if engine.tensor_parallel_scaling is None or tp in (None, profile.profile.hardware.devices):
        return profile
    scaled = scale_profile(profile.profile, tp, engine.tensor_parallel_scaling, str(profile.path))
    return LoadedProfile(scaled, profile.path)


def _jitter(scenario: Scenario, setup: PoolSetup, rng: np.random.Generator) -> Jitter | None:
    profile = setup.costs.profile.profile
    if profile.jitter is None or not scenario.engine.jitter:
        return None
    return Jitter(profile.jitter, rng, profile.prefill_jitter)


def default_fast_path() -> bool:
    """False when ``SPECSIM_ENGINE=reference`` asks for the per-iteration reference path."""
    return os.environ.get("SPECSIM_ENGINE", "fast") != "reference"


def run_simulation(
    scenario: Scenario,
    records_path: str | Path | None = None,
    replication: int = 0,
    fast_path: bool | None = None,
    profile: LoadedProfile | None = None,
) -> SimulationResult:
    """Simulate ``scenario``; stream records to ``records_path`` (CSV) when given.

    The profile path resolves relative to the scenario file. The result is deterministic for a
    given scenario (its seed drives every random stream). ``replication`` > 0 keeps the
    requests (arrivals, lengths, routing) and draws acceptance and iteration jitter from other
    streams: the same traffic served again, to see how much the rest alone moves a metric.
    ``fast_path`` False (default: ``default_fast_path()``) simulates every engine iteration as
    its own event: the same results, more slowly. ``profile`` stands in for the scenario's
    profile file (a fit's candidate, held in memory).
    """
    fast = default_fast_path() if fast_path is None else fast_path
    if profile is None:
        profile = cached_profile(scenario.resolve(scenario.profile))
    profile = tensor_parallel_profile(scenario, profile)
    arrivals_rng, lengths_rng, routing_rng, serving = _random_streams(scenario, replication)
    source = build_source(scenario, arrivals_rng, lengths_rng)
    setups = pool_setups(scenario, profile)
    env = Clock()
    path = None if records_path is None else Path(records_path)
    # Requests reach the fleet through the front pool's API server, a delay (Frontend).
    request_s = setups[0].costs.request_s
    limits = scenario.slo.limits() if scenario.slo else {}
    sink = RecordSink([s.name for s in setups], limits, path, request_s)
    finishes = _FinishHooks()
    prefixes = build_prefixes(scenario, getattr(source, "trace", None))
    replicas = _replicas(scenario, setups, serving, (sink, finishes), fast, prefixes)
    if scenario.fleet.disaggregation is None:
        fleet = Fleet(
            replicas, scenario.fleet.router, routing_rng, scenario.fleet.balance_abs_threshold
        )
    else:
        fleet = _disaggregated_fleet(env, scenario, setups, replicas, routing_rng)
    entry = fleet if request_s == 0 else Frontend(env, fleet, request_s)
    _start_traffic(env, scenario, source, (fleet, entry, replicas), request_s, finishes)
    try:
        env.run()
    finally:
        sink.close()
    summary = _summary(scenario, profile, setups, (fleet, replicas), sink, finishes.clients)
    return SimulationResult(round_floats(summary), path, scenario)


def _random_streams(scenario: Scenario, replication: int):
    """The arrivals', lengths' and routing's generators, and the seeds the serving streams
    (acceptance, jitter) spawn from: a replication's own, the same traffic served again."""
    # Stream 4 (iteration-time jitter) came later: spawning it leaves streams 0-3 as they were.
    streams = np.random.SeedSequence(scenario.seed).spawn(5)
    arrivals, lengths, routing = (np.random.default_rng(s) for s in streams[:2] + streams[3:4])
    serving = streams
    if replication:
        serving = np.random.SeedSequence([scenario.seed, replication]).spawn(5)
    return arrivals, lengths, routing, serving


class _FinishHooks:
    """What hears of each finished request: closed-loop clients (their next request) or a
    client cap (a slot freed), once the traffic has started."""

    clients: ClosedLoopClients | None = None
    cap: ClientCap | None = None

    def __call__(self, request, now) -> None:
        if self.clients is not None:
            self.clients.on_finish(request, now)
        if self.cap is not None:
            self.cap.on_finish(now)


def _replicas(scenario, setups, serving, outputs, fast: bool, prefixes) -> list[Replica]:
    """Every pool's replicas, each with its own acceptance and jitter streams; ``outputs``: the
    record sink and the finish hooks."""
    total = sum(s.replicas for s in setups)
    acceptance_rngs = [np.random.default_rng(s) for s in serving[2].spawn(total)]
    jitter_rngs = [np.random.default_rng(s) for s in serving[4].spawn(total)]
    split = scenario.fleet.disaggregation
    replicas: list[Replica] = []
    for pool_index, setup in enumerate(setups):
        replica_class = Replica if split is None else REPLICA_CLASSES[setup.name]
        for _ in range(setup.replicas):
            index = len(replicas)
            policy = build_policy(setup.speculation, scenario.engine.max_batch)
            replicas.append(
                replica_class(
                    index,
                    pool_index,
                    scenario.engine,
                    setup.costs,
                    setup.acceptance,
                    policy,
                    setup.kv_capacity,
                    acceptance_rngs[index],
                    *outputs,
                    _jitter(scenario, setup, jitter_rngs[index]),
                    fast=fast,
                    # A split fleet's prefill replicas never hold the output's KV.
                    prefix=prefixes.for_replica(setup.kv_capacity, remembers_output=split is None),
                )
            )
    return replicas


def _start_traffic(env, scenario, source, fleet_parts, request_s, finishes) -> None:
    """The replicas' processes and the traffic's: open-loop arrivals (fed to a lone fast
    replica itself), a client cap, or closed-loop clients. ``fleet_parts``: the fleet, where
    requests enter it (its API server, or the fleet itself) and its replicas."""
    fleet, entry, replicas = fleet_parts
    counter = [0]
    # A replica alone on the fast path takes its arrivals itself (replayed sequences keep the
    # reference); a client cap holds arrivals back, so a capped loop's replicas wait for them.
    capped = scenario.workload.max_concurrency is not None
    fed = not (source.closed_loop or capped) and all(replica.fast for replica in replicas)
    feed = ArrivalFeed(source, counter, request_s) if fed else None
    alone = feed is not None and len(replicas) == 1  # takes its arrivals itself
    for replica in replicas:
        replica.start(env, feed if alone else None)
    if source.closed_loop:
        finishes.clients = ClosedLoopClients(env, source, entry, counter)
        finishes.clients.start()
        if len(replicas) == 1 and scenario.fleet.disaggregation is None:
            replicas[0].serve_clients(finishes.clients)
    elif capped:
        finishes.cap = ClientCap(scenario.workload.max_concurrency, entry.dispatch)
        env.process(open_loop_arrivals(env, source, finishes.cap, counter))
    elif feed is None:
        env.process(open_loop_arrivals(env, source, entry, counter))
    elif not alone:
        env.process(fed_arrivals(env, feed, fleet))


def _summary(scenario, profile, setups, fleet_parts, sink, clients) -> dict[str, Any]:
    """summary.json's keys once the run has ended (each replica closed first)."""
    if sink.count == 0:
        raise SpecsimError(
            "the workload issued no requests",
            file=str(scenario.source) if scenario.source else None,
            key="workload",
            fix="lengthen workload.duration_s or raise workload.rate",
        )
    fleet, replicas = fleet_parts
    for replica in replicas:
        replica.close()
    summary = run_summary(scenario, profile, setups, replicas, sink)
    if scenario.fleet.disaggregation is not None:
        summary["disaggregation"] = fleet.summary(summary)
    return with_steady(summary, clients.steady() if clients is not None else None)


def _disaggregated_fleet(env, scenario, setups, replicas, routing_rng) -> DisaggregatedFleet:
    split = scenario.fleet.disaggregation
    devices = [s.costs.profile.profile.hardware.devices for s in setups]
    link = kv_link(scenario, split, devices[0], devices[1])
    # The decode router draws from a stream of its own, spawned from the routing stream's seed.
    decode_rng = np.random.default_rng(np.random.SeedSequence([scenario.seed, 3, 1]))
    router = scenario.fleet.router
    routers = (
        (router, routing_rng, scenario.fleet.balance_abs_threshold),
        (split.decode_router or router, decode_rng),
    )
    return DisaggregatedFleet(env, replicas, split, link, routers, setups)
