"""Prefix caching (``workload.prefix``): where each request's cached prefix comes from, what it
skips in prefill and what it still holds of the cache, hand-worked."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from specsim.errors import SpecsimError
from specsim.scenario import Engine, Scenario
from specsim.simulation import run_simulation
from specsim.simulation.admission import Admission, prefix_summary
from specsim.simulation.request import Request
from specsim.workload.prefix import (
    DrawnPrefixes,
    NoPrefix,
    SessionMemory,
    build_prefixes,
    prefix_rng,
)
from specsim.workload.traces import read_trace
from specsim.workload_settings import PrefixCache

DATA = Path(__file__).parent / "data"
LOOKAHEAD = 3


class Levels:
    def assign_levels(self, rng, n):
        return np.zeros(n, dtype=np.int64)


class Fixed(NoPrefix):
    """A prefix source that answers the same hit for every request."""

    def __init__(self, tokens: int):
        self.tokens = tokens

    def cached(self, request) -> int:
        return self.tokens


def admission(hit: int, block_size: int | None = None, capacity: int = 10_000) -> Admission:
    engine = Engine(max_batch=8, max_batched_tokens=1000, block_size=block_size)
    return Admission(
        engine, LOOKAHEAD, capacity, Levels(), np.random.default_rng(0), prefix=Fixed(hit)
    )


def test_a_cached_prefix_skips_prefill_compute_but_holds_its_cache():
    adm = admission(hit=60)
    request = Request(0, 0.0, 100, 10)
    adm.queue.append(request)
    adm.admit(0.0, decoding=0, decode_kv=0.0)
    # Prefill starts past the 60 cached tokens: 40 pending, but the whole prompt is reserved.
    assert (request.prefilled, adm.pending, adm.reserved) == (60, 40.0, 103.0)
    chunks, totals = adm.chunks(1000.0)
    # One chunk of the 40 uncached tokens, attending over the 60 cached ones:
    # pairs = 40 x (60 + 41 / 2) = 3220.
    assert chunks == [(request, 40)]
    assert (totals.tokens, totals.kv, totals.pairs) == (40.0, 60.0, 3220.0)
    adm.complete(chunks, now=1.0)
    assert prefix_summary([adm]) == {
        "hit_rate_tokens": 0.6,
        "queried_tokens": 100,
        "cached_tokens": 60,
        "prefill_tokens_computed": 40,
    }


def test_a_hit_leaves_the_last_prompt_token_and_whole_blocks_only():
    whole = admission(hit=500)
    whole.queue.append(Request(0, 0.0, 100, 10))
    whole.admit(0.0, 0, 0.0)
    assert whole.prefilling[0].prefilled == 99  # the engine computes the last token's logits
    blocks = admission(hit=60, block_size=16, capacity=100)
    blocks.queue.append(Request(0, 0.0, 100, 10))
    blocks.admit(0.0, 0, 0.0)
    # 60 cached tokens fill 3 blocks of 16 (48); the part-filled fourth is recomputed. The
    # reservation is the whole prompt: cdiv(103, 16) = 7 blocks.
    assert (blocks.prefilling[0].prefilled, blocks.pending, blocks.reserved) == (48, 52.0, 7.0)


def test_a_preempted_request_is_readmitted_with_the_same_hit():
    adm = admission(hit=60, capacity=110)
    request = Request(0, 0.0, 100, 10)
    adm.queue.append(request)
    adm.admit(0.0, 0, 0.0)

    class Grown:  # a decoding row beside it: 10 + 3 + 103 = 116 > 110, so the prompt goes
        decoding, decode_kv = 1, 10.0

    adm.make_room(Grown())
    assert list(adm.queue) == [request] and (adm.pending, adm.reserved) == (0.0, 0.0)
    adm.admit(0.0, 0, 0.0)
    assert (request.prefilled, adm.pending) == (60, 40.0)
    assert (adm.prefix_queried, adm.prefix_hits) == (200, 120)  # both lookups count


def test_drawn_prefixes_are_by_request_number_and_hit_at_the_stated_rate():
    def hits(prefix: PrefixCache, seed: int, n: int = 20_000) -> np.ndarray:
        drawn = DrawnPrefixes(prefix, prefix_rng(seed))
        return np.array([drawn.cached(Request(i, 0.0, 1000, 1)) for i in range(n)])

    shared = PrefixCache(source="system_prompt", length=256, hit_rate=0.3)
    a, b = hits(shared, 7), hits(shared, 7)
    assert np.array_equal(a, b) and set(np.unique(a)) == {0, 256}
    # 20,000 draws: the share of hits has standard deviation sqrt(0.3 x 0.7 / 20000) = 0.0032;
    # 5 of them (0.016) flags a hit rate that is off by that much.
    assert abs(np.mean(a == 256) - 0.3) < 0.016
    assert not np.array_equal(a, hits(shared, 8))
    # Out of order, a request gets the same draw: it depends on its number only.
    drawn = DrawnPrefixes(shared, prefix_rng(7))
    assert drawn.cached(Request(19_999, 0.0, 1000, 1)) == a[19_999]
    half = DrawnPrefixes(PrefixCache(source="fraction", fraction=0.5), prefix_rng(7))
    assert half.cached(Request(0, 0.0, 301, 1)) == 150  # rounded down


def test_the_prefix_stream_is_the_sixth_child_of_the_seed():
    child = np.random.SeedSequence(11).spawn(6)[5]
    assert prefix_rng(11).random() == np.random.default_rng(child).random()


def test_session_memory_is_least_recently_used_first_out_within_capacity():
    sessions = np.array([0, 1, 0, 2, 1])
    memory = SessionMemory(sessions, capacity=250)
    memory.finished(Request(0, 0.0, 100, 20))  # session 0: 120 tokens
    memory.finished(Request(1, 0.0, 80, 20))  # session 1: 100; 220 held
    turn = Request(2, 0.0, 200, 10)
    assert memory.cached(turn) == 120  # session 0's: its running sequence's now, 100 held
    memory.finished(turn)  # session 0: 210 -> 310 > 250: session 1, least recent, goes
    assert (memory.held, memory.cached(Request(4, 0.0, 200, 10))) == (210, 0)


def test_a_hit_turn_is_its_sequences_until_it_finishes_or_is_preempted():
    # vLLM's free queue holds only blocks no running request references: a hit's blocks leave
    # it while the hitting sequence runs, so the memory neither counts them nor evicts them.
    memory = SessionMemory(np.array([0, 1, 0, 0]), capacity=1000)
    memory.finished(Request(0, 0.0, 100, 20))  # session 0: 120
    memory.finished(Request(1, 0.0, 80, 20))  # session 1: 100, most recent
    turn = Request(2, 0.0, 200, 10)
    assert (memory.cached(turn), memory.held) == (120, 100)
    memory.trim(0)  # no room left: session 1 goes; the running turn's 120 stay its own
    assert memory.held == 0 and memory.remembered(Request(3, 0.0, 300, 10)) == 120
    assert memory.cached(Request(3, 0.0, 300, 10)) == 120  # a turn arriving meanwhile hits it
    memory.released(Request(3, 0.0, 300, 10))
    assert memory.held == 0  # the first turn still holds it
    memory.released(turn)  # preempted: the entry is the memory's again, most recent
    assert memory.held == 120 and memory.cached(turn) == 120  # readmitted with the same hit


def test_remembered_turns_give_way_to_running_sequences():
    memory = SessionMemory(np.array([0, 1, 1]), capacity=300)
    memory.finished(Request(0, 0.0, 100, 20))  # session 0: 120 tokens
    memory.finished(Request(1, 0.0, 80, 20))  # session 1: 100; 220 remembered
    engine = Engine(max_batch=8, max_batched_tokens=1000)
    adm = Admission(engine, LOOKAHEAD, 300, Levels(), np.random.default_rng(0), prefix=memory)
    request = Request(2, 0.0, 150, 10)
    adm.queue.append(request)
    # A decoding row holds 97 + 3 = 100 of 300 tokens: 200 are free, and the 220 remembered
    # do not fit; session 0's 120, least recently used, go. Session 1's turn still hits.
    adm.admit(0.0, decoding=1, decode_kv=97.0)
    # Its 100 tokens are then the prompt's (reserved with it, 150 + 3), no longer the memory's.
    assert (memory.held, request.prefilled, adm.reserved) == (0, 100, 153.0)


def test_a_preempted_turn_gives_its_hit_back_to_the_memory():
    memory = SessionMemory(np.array([0, 0]), capacity=300)
    memory.finished(Request(0, 0.0, 100, 20))  # session 0: 120 tokens
    engine = Engine(max_batch=8, max_batched_tokens=1000)
    adm = Admission(engine, LOOKAHEAD, 300, Levels(), np.random.default_rng(0), prefix=memory)
    request = Request(1, 0.0, 150, 10)
    adm.queue.append(request)
    adm.admit(0.0, decoding=0, decode_kv=0.0)
    assert (memory.held, request.prefilled) == (0, 120)

    class Grown:  # a decoding row beside it: 200 + 3 + 153 = 356 > 300, so the prompt goes
        decoding, decode_kv = 1, 200.0

    adm.make_room(Grown())
    assert list(adm.queue) == [request] and memory.held == 120


def write_trace(path: Path, rows: list[str], header: str) -> Path:
    path.write_text(header + "\n" + "\n".join(rows) + "\n")
    return path


def trace_scenario(path: Path, source: str, replicas: int = 1, **prefix) -> Scenario:
    data = {
        "seed": 3,
        "profile": str(DATA / "sim_profile.yaml"),
        "workload": {"kind": "trace", "trace": str(path), "prefix": {"source": source, **prefix}},
        "engine": {"max_batch": 8, "jitter": False},
        "speculation": {"drafter": "c05", "k": 3},
        "fleet": {"replicas": replicas, "router": "round_robin"},
    }
    return Scenario.model_validate(data).with_source(path)


def test_a_trace_column_is_read_in_arrival_order(tmp_path):
    header = "arrived_at,num_prefill_tokens,num_decode_tokens,cached_tokens"
    path = write_trace(tmp_path / "t.csv", ["1.0,100,5,40", "0.0,200,5,150"], header)
    scenario = trace_scenario(path, "column")
    prefixes = build_prefixes(scenario, read_trace(path))
    given = prefixes.for_replica(10_000)
    # The file's second row arrives first: it is request 0.
    assert [given.cached(Request(i, 0.0, 1, 1)) for i in (0, 1)] == [150, 40]
    summary = run_simulation(scenario).summary
    assert summary["prefix_cache"]["cached_tokens"] == 190
    assert summary["prefix_cache"]["prefill_tokens_computed"] == 300 - 190


def test_a_bad_or_missing_prefix_column_is_a_one_line_error(tmp_path):
    header = "arrived_at,num_prefill_tokens,num_decode_tokens,cached_tokens"
    bad = write_trace(tmp_path / "bad.csv", ["0.0,100,5,40", "1.0,200,5,1.5"], header)
    with pytest.raises(SpecsimError, match=r"line 3: cached_tokens '1\.5'"):
        run_simulation(trace_scenario(bad, "column"))
    plain = write_trace(tmp_path / "plain.csv", ["0.0,100,5"], header.rsplit(",", 1)[0])
    with pytest.raises(SpecsimError, match="no column 'SessionID' or 'session_id'"):
        run_simulation(trace_scenario(plain, "session"))


def session_trace(tmp_path: Path) -> Path:
    # Session 7's three turns, far enough apart that each has finished before the next; each
    # prompt resends the conversation so far (100, then 100 + 10 + 50, then 160 + 10 + 40).
    rows = ["0.0,100,10,7", "10.0,160,10,7", "20.0,210,10,7", "30.0,50,10,"]
    header = "arrived_at,num_prefill_tokens,num_decode_tokens,session_id"
    return write_trace(tmp_path / "s.csv", rows, header)


def test_a_session_hits_only_on_the_replica_that_served_its_previous_turn(tmp_path):
    path = session_trace(tmp_path)
    one = run_simulation(trace_scenario(path, "session")).summary["prefix_cache"]
    # One replica: turn 2 reuses turn 1's 100 + 10, turn 3 turn 2's 160 + 10; 280 of 520.
    assert (one["cached_tokens"], one["queried_tokens"]) == (280, 520)
    two = run_simulation(trace_scenario(path, "session", replicas=2)).summary["prefix_cache"]
    # Round robin over two replicas: turns 1 and 3 on replica 0, turn 2 on replica 1. Turn 3
    # finds turn 1's 110 tokens there; turn 2 finds nothing.
    assert two["cached_tokens"] == 110


def test_the_fast_path_matches_the_reference_with_sessions(tmp_path):
    rng = np.random.default_rng(5)
    rows = [
        f"{t:.3f},{p},{o},{s}"
        for t, p, o, s in zip(
            np.cumsum(rng.exponential(0.05, 300)),
            rng.integers(50, 400, 300),
            rng.integers(5, 80, 300),
            rng.integers(0, 40, 300),
            strict=True,
        )
    ]
    header = "arrived_at,num_prefill_tokens,num_decode_tokens,session_id"
    scenario = trace_scenario(write_trace(tmp_path / "m.csv", rows, header), "session")
    fast = run_simulation(scenario, records_path=tmp_path / "f.csv", fast_path=True)
    slow = run_simulation(scenario, records_path=tmp_path / "r.csv", fast_path=False)
    assert fast.summary["prefix_cache"]["cached_tokens"] > 0
    assert (tmp_path / "f.csv").read_bytes() == (tmp_path / "r.csv").read_bytes()
    assert fast.summary == slow.summary


BASE = {
    "seed": 3,
    "profile": "sim_profile.yaml",
    "workload": {
        "kind": "poisson",
        "rate": 20.0,
        "requests": 300,
        "prompt": {"dist": "uniform", "low": 300, "high": 600},
        "output": {"dist": "uniform", "low": 20, "high": 120},
    },
    "engine": {"max_batch": 32, "jitter": False},
    "speculation": {"drafter": "c05", "k": 3},
}


def test_a_shared_system_prompt_lowers_ttft_and_prefill_flops_and_keeps_the_traffic(tmp_path):
    data = copy.deepcopy(BASE)
    data["profile"] = "sim_profile_compute.yaml"  # prefill costs its tokens here
    data["speculation"] = {"drafter": "small", "k": 3}
    plain = Scenario.model_validate(data).with_source(DATA / "scenario.yaml")
    data["workload"]["prefix"] = {"source": "system_prompt", "length": 256, "hit_rate": 1.0}
    shared = Scenario.model_validate(data).with_source(DATA / "scenario.yaml")
    a = run_simulation(plain, records_path=tmp_path / "a.csv")
    b = run_simulation(shared, records_path=tmp_path / "b.csv")
    assert "prefix_cache" not in a.summary
    assert b.summary["prefix_cache"]["cached_tokens"] == 300 * 256
    assert b.summary["ttft_s"]["mean"] < a.summary["ttft_s"]["mean"]
    assert b.summary["flops_prefill"] < a.summary["flops_prefill"]
    assert a.summary["prompt_tokens"] == b.summary["prompt_tokens"]  # the same requests


@pytest.mark.parametrize(
    "prefix, words",
    [
        ({"source": "fraction"}, "needs 'fraction'"),
        ({"source": "system_prompt", "hit_rate": 0.5}, "needs 'length'"),
        ({"source": "fraction", "fraction": 0.5, "length": 3}, "length do(es) not apply"),
        ({"source": "column"}, "needs a 'trace' workload"),
    ],
)
def test_incomplete_or_misplaced_prefix_keys_are_refused(prefix, words):
    data = copy.deepcopy(BASE)
    data["workload"]["prefix"] = prefix
    with pytest.raises(ValidationError, match=words.replace("(", r"\(").replace(")", r"\)")):
        Scenario.model_validate(data)


def test_the_cache_keys_are_documented_and_only_where_set():
    from specsim.docs.outputs import CACHE_SUMMARY_KEYS, SUMMARY_KEYS

    data = copy.deepcopy(BASE)
    data["workload"]["requests"] = 20
    data["workload"]["prefix"] = {"source": "fraction", "fraction": 0.25}
    data["engine"]["block_size"] = 16
    summary = run_simulation(Scenario.model_validate(data).with_source(DATA / "s.yaml")).summary
    keys = list(SUMMARY_KEYS)
    at = keys.index("kv_capacity_tokens") + 1
    assert list(summary) == keys[:at] + list(CACHE_SUMMARY_KEYS) + keys[at:]
    assert set(CACHE_SUMMARY_KEYS) <= set(summary["pools"]["main"])


@pytest.mark.parametrize("key", ["workload.prefix", "engine.block_size"])
def test_the_real_engine_refuses_what_it_does_not_model(key):
    from specsim.engine.run import check_supported

    data = copy.deepcopy(BASE)
    data["engine"]["chunked_prefill"] = False
    if key == "workload.prefix":
        data["workload"]["prefix"] = {"source": "fraction", "fraction": 0.5}
    else:
        data["engine"]["block_size"] = 16
    with pytest.raises(SpecsimError, match="no prefix cache") as caught:
        check_supported(Scenario.model_validate(data))
    assert caught.value.key == key


def test_a_burstgpt_trace_names_its_sessions_in_sessionid(tmp_path):
    header = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type,SessionID"
    rows = ["0,ChatGPT,100,10,110,Conversation log,a", "30,ChatGPT,150,10,160,Conversation log,a"]
    path = write_trace(tmp_path / "b.csv", rows, header)
    summary = run_simulation(trace_scenario(path, "session")).summary["prefix_cache"]
    assert (summary["cached_tokens"], summary["queried_tokens"]) == (110, 250)
