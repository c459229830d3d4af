"""Directional facts the simulator must reproduce (measured in production systems):
speculation wins at low load and can lose at high load, the best k falls as load rises, more
replicas cut tail latency, and a drafter's latency matters as much as its acceptance rate.

The profile (tests/data/sim_profile_compute.yaml) has a verification pass that turns
compute-bound past 256 tokens, as real GPUs do, which is what implies the load effects.
"""

from __future__ import annotations

import copy
from pathlib import Path

from specsim.scenario import Scenario
from specsim.simulation import run_simulation

DATA = Path(__file__).parent / "data"

CLOSED = {
    "seed": 11,
    "profile": "sim_profile_compute.yaml",
    "workload": {
        "kind": "closed_loop",
        "concurrency": 1,
        "requests": 40,
        "prompt": {"dist": "uniform", "low": 100, "high": 600},
        "output": {"dist": "uniform", "low": 100, "high": 300},
    },
    "engine": {"max_batch": 256},
    "speculation": {"drafter": "small", "k": 4, "heterogeneity": False},
}


def throughput(concurrency: int, k: int, requests: int) -> float:
    data = copy.deepcopy(CLOSED)
    data["workload"]["concurrency"] = concurrency
    data["workload"]["requests"] = requests
    data["speculation"]["k"] = k
    scenario = Scenario.model_validate(data).with_source(DATA / "scenario.yaml")
    return run_simulation(scenario).summary["throughput_tokens_per_s"]


def best_k(concurrency: int, requests: int) -> tuple[int, dict[int, float]]:
    rates = {k: throughput(concurrency, k, requests) for k in (0, 1, 2, 4, 6)}
    return max(rates, key=rates.get), rates


def test_speculation_wins_at_low_load_and_loses_at_high_load():
    low = throughput(1, 4, 40) / throughput(1, 0, 40)
    high = throughput(160, 4, 1600) / throughput(160, 0, 1600)
    assert low > 1.8  # batch 1: ~2.9 tokens per 11.5 ms step vs 1 per 8.3 ms
    assert high < 1.0  # batch 160: 800 verification tokens per pass, far past the knee


def test_best_k_falls_as_load_rises():
    k_low, _ = best_k(1, 40)
    k_mid, _ = best_k(48, 480)
    k_high, rates = best_k(160, 1600)
    assert k_low >= 4
    assert k_low > k_mid >= k_high
    assert k_high <= 1, rates


def test_more_replicas_lower_tail_latency():
    p99 = []
    for replicas in (1, 2, 4):
        data = copy.deepcopy(CLOSED)
        data["workload"] = {
            "kind": "poisson",
            "rate": 30.0,
            "requests": 600,
            "prompt": {"dist": "uniform", "low": 100, "high": 600},
            "output": {"dist": "uniform", "low": 100, "high": 300},
        }
        data["fleet"] = {"replicas": replicas, "router": "least_outstanding"}
        scenario = Scenario.model_validate(data).with_source(DATA / "scenario.yaml")
        p99.append(run_simulation(scenario).summary["e2e_s"]["p99"])
    # One replica runs at ~55 sequences a step and queues; 2 and 4 approach the service time.
    assert p99[0] > 2 * p99[1]
    assert p99[1] > p99[2]


def test_drafter_latency_matters_as_much_as_acceptance():
    """Halving the acceptance gain or making drafts 4x dearer both lose most of the speedup."""
    base = Scenario.model_validate(
        {
            "profile": "sim_profile.yaml",
            "workload": {
                "kind": "closed_loop",
                "concurrency": 1,
                "requests": 10,
                "prompt": {"dist": "fixed", "value": 10},
                "output": {"dist": "fixed", "value": 400},
            },
            "speculation": {"drafter": "c05", "k": 4, "acceptance": "iid", "acceptance_rate": 0.8},
        }
    ).with_source(DATA / "scenario.yaml")

    def tpot(**spec) -> float:
        scenario = base.model_copy(deep=True).with_source(DATA / "scenario.yaml")
        for key, value in spec.items():
            setattr(scenario.speculation, key, value)
        return run_simulation(scenario).summary["tpot_s"]["mean"]

    fast_good = tpot()
    slow_good = tpot(drafter="c20")  # c = 0.2 instead of 0.05
    fast_poor = tpot(acceptance_rate=0.6)
    off = tpot(k=0)
    assert fast_good < slow_good < off
    assert fast_good < fast_poor < off
    # Both handicaps cost a comparable share of the gain (within a factor of 2 of each other).
    loss_latency = slow_good - fast_good
    loss_acceptance = fast_poor - fast_good
    assert 0.5 < loss_latency / loss_acceptance < 2.0


def test_long_contexts_make_kv_reads_dominate_step_time():
    """Same batch (16 clients), plain decoding: 16k-token contexts more than double TPOT over
    512-token ones, so the context-proportional part (KV reads) is most of the step."""

    def tpot(prompt: int) -> float:
        data = copy.deepcopy(CLOSED)
        data["workload"].update(
            concurrency=16,
            requests=48,
            prompt={"dist": "fixed", "value": prompt},
            output={"dist": "fixed", "value": 64},
        )
        data["speculation"]["k"] = 0
        scenario = Scenario.model_validate(data).with_source(DATA / "scenario.yaml")
        return run_simulation(scenario).summary["tpot_s"]["p50"]

    short, long = tpot(512), tpot(16384)
    assert (long - short) / long > 0.5


def test_goodput_adaptive_policy_lowers_k_under_load():
    """The adaptive policy picks k per iteration from the profile: near k_max for a lone
    request, and at most 1-2 at a batch of 160 where verification is compute-bound; its
    throughput at high load beats a fixed k = 6."""

    def run(concurrency: int, requests: int, policy: str) -> dict:
        data = copy.deepcopy(CLOSED)
        data["workload"].update(concurrency=concurrency, requests=requests)
        data["speculation"].update(k=6, policy=policy)
        scenario = Scenario.model_validate(data).with_source(DATA / "scenario.yaml")
        return run_simulation(scenario).summary

    low = run(1, 20, "adaptive")
    high = run(160, 1600, "adaptive")
    assert low["mean_window"] >= 3.5
    assert high["mean_window"] <= 2.0
    fixed = run(160, 1600, "fixed")
    assert high["throughput_tokens_per_s"] > 1.2 * fixed["throughput_tokens_per_s"]
