"""A shared system prompt's blocks held once per replica (``SharedPrefix`` in
``specsim.simulation.admission``), as vLLM's reference-counted prefix blocks: the cache counts
distinct blocks, a sequence admitted beside a holder needs only its own, and a finished or
preempted sequence releases its reference. Every number worked out by hand."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest

from specsim.costs.kv_cache import blocks_for
from specsim.scenario import Engine, Scenario
from specsim.simulation import run_simulation
from specsim.simulation.admission import Admission, SharedPrefix
from specsim.simulation.records import read_records
from specsim.simulation.request import Request
from specsim.workload.prefix import DrawnPrefixes
from specsim.workload_settings import PrefixCache

DATA = Path(__file__).parent / "data"
LOOKAHEAD = 3  # k = 2
SYSTEM_PROMPT = PrefixCache(source="system_prompt", length=64, hit_rate=1.0)
OWN_SHARE = PrefixCache(source="fraction", fraction=0.64, hit_rate=1.0)  # 64 of 100, private


class Levels:
    def assign_levels(self, rng, n):
        return np.zeros(n, dtype=np.int64)


class Batch:
    """Decoding rows as preemption sees them, holding cdiv(context + lookahead, 16) blocks."""

    def __init__(self, rows: list[Request]):
        self.rows = list(rows)
        self.contexts = {row.rid: row.prefill_target for row in rows}

    @property
    def decoding(self) -> int:
        return len(self.rows)

    @property
    def decode_kv(self) -> float:
        return float(sum(self.contexts[r.rid] for r in self.rows))

    def decode_blocks(self) -> float:
        return float(sum(blocks_for(self.contexts[r.rid] + LOOKAHEAD, 16) for r in self.rows))

    def evict_youngest(self) -> Request:
        request = max(self.rows, key=lambda r: r.admit_order)
        self.rows.remove(request)
        return request


def admission(prefix: PrefixCache, blocks: int) -> Admission:
    engine = Engine(max_batch=8, max_batched_tokens=1000, block_size=16)
    rng = np.random.default_rng(0)
    return Admission(engine, LOOKAHEAD, blocks, Levels(), rng, DrawnPrefixes(prefix, rng))


def two_admitted(blocks: int = 10) -> tuple[Admission, list[Request]]:
    adm = admission(SYSTEM_PROMPT, blocks)
    requests = [Request(i, 0.0, 100, 30) for i in range(2)]
    adm.queue.extend(requests)
    adm.admit(0.0, decoding=0, decode_kv=0.0)
    return adm, requests


def test_two_rows_sharing_a_prefix_hold_its_four_blocks_once():
    # Two 100-token prompts behind a 64-token system prompt (4 blocks of 16), lookahead 3: each
    # reserves cdiv(103, 16) = 7 blocks, 4 of them the prefix's. Per copy they need 14 blocks;
    # sharing the 4, 7 + 3 = 10, so both fit 10 blocks.
    adm, _ = two_admitted()
    assert [r.prefilled for r in adm.prefilling] == [64, 64]
    assert adm.reserved == 14.0  # per sequence, as the prompts' own bookkeeping counts
    assert adm.shared.holders == {0: 4, 1: 4} and adm.shared.savings == 4
    assert adm.kv_in_use(0, 0.0) == 10.0
    # The same hits as each prompt's own share (a 'fraction' source: nothing says another
    # sequence holds them) are per copy: the second prompt's 7 blocks do not fit beside 7.
    private = admission(OWN_SHARE, 10)
    private.queue.extend(Request(i, 0.0, 100, 30) for i in range(2))
    private.admit(0.0, 0, 0.0)
    assert [r.prefilled for r in private.prefilling] == [64] and len(private.queue) == 1
    assert private.shared is None and private.kv_in_use(0, 0.0) == 7.0


def test_a_finished_sequence_releases_its_reference():
    adm, requests = two_admitted()
    done = adm.complete([(r, 36.0) for r in requests], now=1.0)
    assert done == requests and adm.reserved == 0.0
    # Decoding at context 100 each: 2 x 7 blocks per row, the prefix's 4 once: 10.
    batch = Batch(requests)
    assert adm.kv_in_use(batch.decoding, batch.decode_blocks()) == 10.0
    adm.finished(requests[0])
    batch.rows.remove(requests[0])
    assert adm.shared.holders == {1: 4}
    assert adm.kv_in_use(batch.decoding, batch.decode_blocks()) == 7.0


def test_a_preempted_sequence_releases_its_reference_and_is_readmitted_sharing():
    adm, requests = two_admitted()
    adm.complete([(r, 36.0) for r in requests], now=1.0)
    batch = Batch(requests)
    # Both grow to context 115: cdiv(118, 16) = 8 blocks each, 16 - 4 = 12 > 10. The youngest
    # goes; the other holds 8 alone (no one shares its 4 now).
    batch.contexts = {0: 115, 1: 115}
    adm.make_room(batch)
    assert [r.rid for r in batch.rows] == [0] and list(adm.queue) == [requests[1]]
    assert adm.shared.holders == {0: 4}
    assert adm.kv_in_use(batch.decoding, batch.decode_blocks()) == 8.0
    # Readmitted (its 30 generated tokens not yet counted: prefill_target stays 100 here), it
    # shares the 4 again: 8 + 7 - 4 = 11 > 10, so it waits; at 11 blocks it joins.
    adm.admit(2.0, batch.decoding, batch.decode_blocks())
    assert len(adm.queue) == 1
    adm.kv_capacity = 11
    adm.admit(2.0, batch.decoding, batch.decode_blocks())
    assert adm.prefilling == [requests[1]] and adm.shared.holders == {0: 4, 1: 4}
    assert adm.kv_in_use(batch.decoding, batch.decode_blocks()) == 11.0


def test_hits_of_different_lengths_share_the_longest_copy():
    # A prompt shorter than the system prompt hits its own length less one in whole blocks: a
    # prefix of the longer hits, so the physical copy is the largest held.
    shared = SharedPrefix()
    shared.hold(0, 4)
    shared.hold(1, 2)
    shared.hold(2, 4)
    assert (shared.top, shared.savings, shared.overlap(3), shared.overlap(6)) == (4, 6, 3, 4)
    shared.release(0)
    assert (shared.top, shared.savings) == (4, 2)
    shared.release(2)  # the longest copy's last holder: the copy shrinks to the 2 still held
    assert (shared.top, shared.savings) == (2, 0)
    shared.release(1)
    assert (shared.top, shared.total, shared.holders) == (0, 0, {})


BASE = {
    "seed": 3,
    "profile": "sim_profile.yaml",
    "workload": {
        "kind": "closed_loop",  # both requests queued at 0
        "concurrency": 2,
        "requests": 2,
        "prompt": {"dist": "fixed", "value": 100},
        "output": {"dist": "fixed", "value": 10},
    },
    # 160 tokens: 10 blocks of 16. Speculation off: lookahead 1, cdiv(101, 16) = 7 blocks a
    # prompt, cdiv(110 + 1, 16) = 7 at the last step: two rows need 14 per copy, 10 shared.
    "engine": {"max_batch": 4, "kv_capacity_tokens": 160, "block_size": 16, "jitter": False},
    "speculation": {"drafter": None, "k": 0},
}


def simulate(prefix: dict, tmp_path: Path, name: str, disaggregated: bool = False, clients=2):
    data = copy.deepcopy(BASE)
    data["workload"]["prefix"] = prefix
    data["workload"]["concurrency"] = clients
    if disaggregated:
        data["fleet"] = {
            "disaggregation": {
                "prefill": {"replicas": 1},
                "decode": {"replicas": 1},
                "kv_transfer": {"bandwidth_bytes_per_s": 1.0e12, "latency_s": 0.0},
            }
        }
    scenario = Scenario.model_validate(data).with_source(DATA / "scenario.yaml")
    path = tmp_path / f"{name}.csv"
    return run_simulation(scenario, records_path=path).summary, read_records(path)


def test_a_replica_runs_two_sharing_rows_together_that_it_would_run_one_by_one(tmp_path):
    # The same 64 cached tokens: shared (system prompt), both rows run at once without
    # preemption; private ('fraction'), the second waits for the first to finish.
    system = {"source": "system_prompt", "length": 64, "hit_rate": 1.0}
    own = {"source": "fraction", "fraction": 0.64, "hit_rate": 1.0}
    shared_summary, shared = simulate(system, tmp_path, "shared")
    private_summary, private = simulate(own, tmp_path, "private")
    assert shared_summary["preemptions"] == private_summary["preemptions"] == 0
    assert shared["scheduled_s"][1] == shared["scheduled_s"][0]
    assert private["scheduled_s"][1] >= private["finish_s"][0]
    assert shared_summary["prefix_cache"]["cached_tokens"] == 128


def test_the_prefill_pool_shares_and_releases_at_the_handover(tmp_path):
    # The prefill replica holds a prompt until its prefill ends: with 10 blocks, two prompts
    # (7 blocks each, 4 of them the system prompt's) are prefilled side by side when shared,
    # one after the other when private. The decode pool keeps no prefix cache (each row its
    # own copy), so the rows decode in turn either way.
    system = {"source": "system_prompt", "length": 64, "hit_rate": 1.0}
    own = {"source": "fraction", "fraction": 0.64, "hit_rate": 1.0}
    _, shared = simulate(system, tmp_path, "shared", disaggregated=True)
    _, private = simulate(own, tmp_path, "private", disaggregated=True)
    assert shared["scheduled_s"][0] == shared["scheduled_s"][1]
    assert private["scheduled_s"][1] > private["scheduled_s"][0]
    # One client, two requests in turn: each prompt holds 7 of the 10 blocks while prefilled,
    # the second too, since the first's reference went with its handover (kept, the prefix
    # would count as shared by two and the second prompt as 3 blocks). So the prefill replica
    # holds 0.7 of its cache whenever it is busy.
    summary, _ = simulate(system, tmp_path, "turns", disaggregated=True, clients=1)
    prefill = summary["pools"]["prefill"]
    assert prefill["engine_iterations"] == 2 and prefill["kv_cache_utilisation"]["max"] == 0.7
    use = prefill["kv_cache_utilisation"]["mean"]  # summary figures carry 6 significant digits
    assert use == pytest.approx(0.7 * prefill["busy_fraction"], rel=1e-5)
