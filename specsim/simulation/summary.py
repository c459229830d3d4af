"""A run's summary.json: the fleet's figures and each pool's (``metrics.summarise``), what the
scenario was, and the keys only some scenarios carry (KV blocks, prefix caching, trees, the
steady window of a closed loop)."""

from __future__ import annotations

from typing import Any

from specsim.metrics import EngineStats, RequestStats, summarise
from specsim.profile.tp_scaling import scaled_note
from specsim.sampling.kinds import LOSSY_VERIFIERS
from specsim.simulation.admission import prefix_summary

LOSSY_NOTE = (
    "typical acceptance is lossy: the output is not distributed as the target model's; "
    "latency and cost figures describe a different sampler"
)


def with_steady(summary: dict[str, Any], steady: tuple[float, float, float] | None):
    """The summary with the steady-state throughput beside the whole run's (closed loops; null
    for open-loop workloads and for a closed loop too short to have a steady window)."""
    out: dict[str, Any] = {}
    for key, value in summary.items():
        out[key] = value
        if key == "throughput_tokens_per_s":
            start, end, tokens = steady if steady is not None else (None, None, None)
            out["throughput_tokens_per_s_steady"] = (
                None if steady is None else tokens / (end - start)
            )
            out["steady_window_s"] = None if steady is None else [start, end]
    return out


def run_summary(scenario, profile, setups, replicas, sink) -> dict[str, Any]:
    """summary.json's keys: the fleet's figures, each pool's, and what the run was."""
    price = profile.profile.hardware.price_per_hour_usd
    prices = [s.costs.profile.profile.hardware.price_per_hour_usd for s in setups]
    if any(p != price for p in prices):  # pools on other hardware: the fleet's mean price
        price = sum(p * s.replicas for p, s in zip(prices, setups, strict=True)) / len(replicas)
    fleet_requests = RequestStats()
    fleet_engine = EngineStats(0, 0, 0)
    pool_summaries = {}
    duration = max(stats.last_finish_s for stats in sink.stats)
    for pool_index, setup in enumerate(setups):
        engine = EngineStats(0, 0, 0)
        for replica in replicas:
            if replica.pool_index == pool_index:
                engine.merge(replica.stats)
        requests = sink.stats[pool_index]
        pool_summaries[setup.name] = {
            **_echo_speculation(setup),
            "replicas": setup.replicas,
            "kv_capacity_tokens": setup.kv_capacity,
            **summarise(
                requests,
                engine,
                replicas=setup.replicas,
                price_per_hour_usd=prices[pool_index],
                duration_s=duration,
            ),
        }
        fleet_requests.merge(requests)
        fleet_engine.merge(engine)
    summary = summarise(
        fleet_requests,
        fleet_engine,
        replicas=len(replicas),
        price_per_hour_usd=price,
        duration_s=duration,
    )
    # Engine policies say what they did (when the off-switch tripped, how steps moved, how
    # many drafts were verified).
    reports = [r.policy.report() for r in replicas if hasattr(r.policy, "report")]
    if reports:
        summary["window_policy"] = reports
    lossy = any(s.speculation.enabled and s.speculation.verifier in LOSSY_VERIFIERS for s in setups)
    main = setups[-1] if scenario.fleet.disaggregation is not None else setups[0]  # decode
    summary["scenario"] = {
        "name": scenario.name,
        "profile": scenario.profile,
        "profile_name": profile.name,
        "profile_source": profile.profile.provenance.source,
        **_echo_speculation(main),
        "workload": scenario.workload.kind,
        "replicas": len(replicas),
        "router": scenario.fleet.router,
        "seed": scenario.seed,
    }
    summary["kv_capacity_tokens"] = main.kv_capacity
    _add_cache_keys(summary, pool_summaries, scenario, setups, replicas)
    summary["slo"] = scenario.slo.limits() if scenario.slo else None
    summary["lossy"] = lossy
    summary["lossy_note"] = LOSSY_NOTE if lossy else None
    summary["pools"] = pool_summaries
    derived = scaled_note(profile.profile)
    if derived is not None:  # only then: other summaries keep their keys
        summary["profile_derived"] = derived
    return summary


def _add_cache_keys(summary, pool_summaries, scenario, setups, replicas) -> None:
    """KV blocks and prefix caching, only where the scenario sets them (other summaries keep
    their keys). The fleet's ``kv_capacity_blocks`` is the main pool's, as its
    ``kv_capacity_tokens`` (a split fleet's decode pool)."""
    if scenario.engine.block_size is not None:
        main = len(setups) - 1 if scenario.fleet.disaggregation is not None else 0
        summary["kv_capacity_blocks"] = next(
            r.kv_capacity for r in replicas if r.pool_index == main
        )
        for pool_index, setup in enumerate(setups):
            first = next(r for r in replicas if r.pool_index == pool_index)
            pool_summaries[setup.name]["kv_capacity_blocks"] = first.kv_capacity
    if scenario.workload.prefix is not None:
        summary["prefix_cache"] = prefix_summary([r.admission for r in replicas])
        for pool_index, setup in enumerate(setups):
            pool = [r.admission for r in replicas if r.pool_index == pool_index]
            pool_summaries[setup.name]["prefix_cache"] = prefix_summary(pool)


def _echo_speculation(setup) -> dict[str, Any]:
    spec = setup.speculation
    return {
        "drafter": spec.drafter if spec.enabled else None,
        "k": spec.k if spec.enabled else 0,
        "verifier": spec.verifier,
        "temperature": spec.temperature,
        "policy": spec.policy,
        "acceptance_model": spec.acceptance,
        **_echo_tree(setup),
    }


def _echo_tree(setup) -> dict[str, Any]:
    """Tree pools only (chain summaries keep their keys): the shape and where its accepted
    lengths came from."""
    if not (setup.speculation.enabled and setup.speculation.tree is not None):
        return {}
    entry = setup.entry
    shape = entry.shape
    return {
        "tree": {
            **shape.summary(),
            "drafts": entry.drafts,
            "source": entry.source,
            "derived_from": entry.derived_from,
            "table_mean_acceptance_length": entry.mean_acceptance_length,
        }
    }
