"""A split fleet with prefix caching and KV blocks (``specsim.simulation.disagg``): a cached
prefix skips the prefill replica's compute but its KV still crosses the link, the decode pool
counts blocks with its lookahead, and a session's next turn hits on the prefill replica that
computed the previous one. Hand-worked, on one or two requests."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from test_sim_engine import LONE_REQUEST

from specsim.profile import load_profile
from specsim.scenario import Scenario
from specsim.simulation import run_simulation
from specsim.simulation.records import read_records

DATA = Path(__file__).parent / "data"
SPLIT = {
    "prefill": {"replicas": 1},
    "decode": {"replicas": 1},
    "kv_transfer": {"bandwidth_bytes_per_s": 1.0e9, "latency_s": 0.001},
}
KV_BYTES = 131072  # sim_profile_compute.yaml's target.kv_bytes_per_token
# test_sim_engine's lone request (replayable pass by hand) on the split fleet, in blocks of 16.
LONE = {**LONE_REQUEST, "engine": {"block_size": 16}, "fleet": {"disaggregation": SPLIT}}
SYSTEM_PROMPT = {"source": "system_prompt", "length": 64, "hit_rate": 1.0}


def run(data: dict, tmp_path: Path, name: str = "r", source: Path | None = None):
    scenario = Scenario.model_validate(data).with_source(source or DATA / "scenario.yaml")
    path = tmp_path / f"{name}.csv"
    return run_simulation(scenario, records_path=path).summary, read_records(path)


def replayed_decode(clock: float, prompt: int, output: int) -> tuple[float, float]:
    """(first token, finish): the decode replica's passes for a lone request from ``clock``,
    the draft model's own pass over the whole prompt riding in the first (the decode side
    holds no prefix cache, so the draft model recomputes every prompt token)."""
    profile = load_profile(DATA / "sim_profile_compute.yaml")
    target, draft = profile.latency_model("target"), profile.latency_model("small")
    overhead = profile.profile.overhead.per_step_s
    context, remaining, first = prompt, output - 1, None
    while remaining:
        new = min(3, remaining - 1) + 1
        clock += target.pass_seconds([context], [new]) + overhead
        clock += sum(draft.pass_seconds([context + j], [1]) for j in range(3))
        if first is None:
            clock += draft.pass_seconds([0], [prompt])
            first = clock
        context += new
        remaining -= new
    return first, clock


def test_a_cached_prefix_skips_prefill_compute_and_the_whole_prompt_still_crosses(tmp_path):
    """A 64-token system prompt, always cached (4 whole blocks of 16): the prefill replica
    computes the other 36 tokens attending over the 64, and the transfer moves all 100 tokens'
    KV (the decode replica has no copy of the prefix). TTFT = that prefill + the transfer +
    the first decode iteration."""
    data = copy.deepcopy(LONE)
    data["workload"]["prefix"] = SYSTEM_PROMPT
    summary, rec = run(data, tmp_path)
    profile = load_profile(DATA / "sim_profile_compute.yaml")
    target = profile.latency_model("target")
    prefill = target.pass_seconds([64], [36]) + profile.profile.overhead.per_step_s
    transfer = 100 * KV_BYTES / 1.0e9 + 0.001
    first, finish = replayed_decode(prefill + transfer, 100, 20)
    assert rec["first_token_s"][0] == pytest.approx(first, abs=1e-6)  # the CSV keeps us
    assert rec["finish_s"][0] == pytest.approx(finish, abs=1e-6)
    split = summary["disaggregation"]
    assert split["transfer_bytes_mean"] == 100 * KV_BYTES
    assert split["transfer_s"]["mean"] == pytest.approx(transfer, rel=1e-6)
    hits = {
        "hit_rate_tokens": 0.64,
        "queried_tokens": 100,
        "cached_tokens": 64,
        "prefill_tokens_computed": 36,
    }
    assert summary["prefix_cache"] == hits == summary["pools"]["prefill"]["prefix_cache"]
    # The decode pool looks nothing up (nothing was preempted there, so it computed nothing).
    assert summary["pools"]["decode"]["prefix_cache"] == {
        "hit_rate_tokens": 0.0,
        "queried_tokens": 0,
        "cached_tokens": 0,
        "prefill_tokens_computed": 0,
    }


def test_a_hit_is_whole_blocks_and_leaves_the_last_prompt_token(tmp_path):
    """A 100-token shared prefix on a 100-token prompt: capped at 99, then 96 (6 blocks)."""
    data = copy.deepcopy(LONE)
    data["workload"]["prefix"] = {**SYSTEM_PROMPT, "length": 100}
    summary, _ = run(data, tmp_path)
    assert summary["prefix_cache"]["cached_tokens"] == 96
    assert summary["prefix_cache"]["prefill_tokens_computed"] == 4


def test_the_decode_pool_counts_blocks_with_the_draft_models_lookahead(tmp_path):
    """Blocks of 8 and a 216-token cache in each pool: 27 blocks. A decode row holds
    cdiv(context + k + 1 + k, 8) blocks (the draft model writes k slots of its own): a
    transferred 100-token prompt takes cdiv(107, 8) = 14, so two (28) do not fit at once, and
    a lone row peaks at cdiv(116 + 7, 8) = 16 blocks before its last step. The prefill pool
    (speculation off) holds cdiv(100 + 1, 8) = 13 blocks a prompt, one on each replica."""
    data = copy.deepcopy(LONE)
    data["engine"] = {"block_size": 8, "kv_capacity_tokens": 216}
    data["workload"].update(concurrency=2, requests=2)
    data["fleet"]["disaggregation"] = {**SPLIT, "prefill": {"replicas": 2}}
    summary, rec = run(data, tmp_path)
    assert summary["kv_capacity_blocks"] == 27
    pools = summary["pools"]
    assert pools["decode"]["kv_capacity_blocks"] == pools["prefill"]["kv_capacity_blocks"] == 27
    # Both prompts arrive together; the second joins only when the first has finished.
    first, second = sorted(range(2), key=lambda i: rec["finish_s"][i])
    assert rec["first_token_s"][second] > rec["finish_s"][first]
    assert pools["decode"]["preemptions"] == 0
    assert pools["decode"]["kv_cache_utilisation"]["max"] == pytest.approx(16 / 27, rel=1e-5)
    assert pools["prefill"]["kv_cache_utilisation"]["max"] == pytest.approx(13 / 27, rel=1e-5)


def test_the_fleets_blocks_are_the_decode_pools_as_its_tokens_are(tmp_path):
    # From the profile's memory: the decode pool keeps the draft model (weights, KV) beside the
    # target, the prefill pool does not, so their caches differ.
    data = copy.deepcopy(LONE)
    summary, _ = run(data, tmp_path)
    pools = summary["pools"]
    assert pools["prefill"]["kv_capacity_blocks"] > pools["decode"]["kv_capacity_blocks"]
    assert summary["kv_capacity_tokens"] == pools["decode"]["kv_capacity_tokens"]
    assert summary["kv_capacity_blocks"] == pools["decode"]["kv_capacity_tokens"] // 16


HEADER = "arrived_at,num_prefill_tokens,num_decode_tokens,session_id"
# Session 7's turn 1 (100 tokens, 20 out); at 5.99 s a 2,000-token prompt without a session,
# still in prefill on replica 0 (the least outstanding of two idle ones) when turn 2 arrives
# at 6 s; turn 2 resends the conversation (100 + 20 + 180 = 300 tokens).
TURNS = ["0.0,100,20,7", "5.99,2000,10,", "6.0,300,20,7"]


def routed_turns(tmp_path: Path, router: str, **fleet) -> dict:
    trace = tmp_path / "turns.csv"
    trace.write_text(HEADER + "\n" + "\n".join(TURNS) + "\n")
    data = {
        "seed": 3,
        "profile": str(DATA / "sim_profile_compute.yaml"),
        "workload": {"kind": "trace", "trace": str(trace), "prefix": {"source": "session"}},
        "engine": {"max_batch": 8, "block_size": 16, "jitter": False},
        "speculation": {"drafter": "small", "k": 3},
        "fleet": {
            "router": router,
            **fleet,
            "disaggregation": {**SPLIT, "prefill": {"replicas": 2}},
        },
    }
    summary, _ = run(data, tmp_path, f"{router}-{fleet}", source=trace)
    return summary["prefix_cache"]


def test_a_sessions_next_turn_hits_on_the_prefill_replica_of_its_previous_turn(tmp_path):
    """The cache-aware router sends turn 2 to replica 0, which remembers turn 1's prompt (the
    100 tokens it computed; the output's KV was made on the decode replica): 96 tokens in
    whole blocks. Replica 0 is 1 request busier than replica 1: within the default threshold
    (32), not within 0, and least-outstanding routing goes by load alone: both miss."""
    assert routed_turns(tmp_path, "cache_aware")["cached_tokens"] == 96
    assert routed_turns(tmp_path, "cache_aware", balance_abs_threshold=0)["cached_tokens"] == 0
    assert routed_turns(tmp_path, "least_outstanding")["cached_tokens"] == 0


def test_a_prefix_on_a_busy_split_fleet_keeps_the_fast_path_and_counts_decode_recomputation(
    tmp_path,
):
    """200 requests at 60 req/s onto a 3,000-token decode cache (preemptions), half of every
    prompt cached at rate 0.8: the fast path matches the reference, the fleet's totals are the
    pools' sums, and the decode pool recomputes preempted prompts without looking them up."""
    data = {
        "seed": 5,
        "profile": "sim_profile.yaml",
        "workload": {
            "kind": "poisson",
            "rate": 60.0,
            "requests": 200,
            "prompt": {"dist": "uniform", "low": 50, "high": 400},
            "output": {"dist": "uniform", "low": 1, "high": 120},
            "prefix": {"source": "fraction", "fraction": 0.5, "hit_rate": 0.8},
        },
        "engine": {"max_batch": 32, "kv_capacity_tokens": 3000},
        "speculation": {"drafter": "c05", "k": 3},
        "fleet": {"disaggregation": SPLIT},
    }
    scenario = Scenario.model_validate(data).with_source(DATA / "scenario.yaml")
    fast = run_simulation(scenario, fast_path=True).summary
    assert run_simulation(scenario, fast_path=False).summary == fast
    pools = fast["pools"]
    prefill, decode = pools["prefill"]["prefix_cache"], pools["decode"]["prefix_cache"]
    assert pools["decode"]["preemptions"] > 0
    assert decode["queried_tokens"] == decode["cached_tokens"] == 0
    assert decode["prefill_tokens_computed"] > 0  # the preempted prompts, recomputed there
    assert (
        prefill["queried_tokens"] == prefill["cached_tokens"] + prefill["prefill_tokens_computed"]
    )
    fleet = fast["prefix_cache"]
    assert fleet["cached_tokens"] == prefill["cached_tokens"]
    assert fleet["prefill_tokens_computed"] == (
        prefill["prefill_tokens_computed"] + decode["prefill_tokens_computed"]
    )
    assert 0.3 < fleet["hit_rate_tokens"] < 0.5  # about 0.8 x 0.5, less a token per hit
