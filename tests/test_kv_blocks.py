"""KV-cache blocks (``engine.block_size``): capacity, reservations and use in whole blocks, as
vLLM's allocator counts them; every number worked out by hand."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest

from specsim.costs.kv_cache import blocks_for, kv_capacity_blocks
from specsim.errors import SpecsimError
from specsim.scenario import Engine, Scenario
from specsim.simulation import run_simulation
from specsim.simulation.admission import Admission
from specsim.simulation.records import read_records
from specsim.simulation.request import Request

DATA = Path(__file__).parent / "data"
LOOKAHEAD = 3  # k = 2


class Levels:
    def assign_levels(self, rng, n):
        return np.zeros(n, dtype=np.int64)


class Batch:
    """Decoding rows as preemption sees them, holding cdiv(context + lookahead, 16) blocks."""

    def __init__(self, contexts: list[int]):
        self.rows = [Request(i, 0.0, c, 10) for i, c in enumerate(contexts)]
        for i, row in enumerate(self.rows):
            row.admit_order = i
        self.contexts = dict(zip(self.rows, contexts, strict=True))

    @property
    def decoding(self) -> int:
        return len(self.rows)

    @property
    def decode_kv(self) -> float:
        return float(sum(self.contexts[r] for r in self.rows))

    def decode_blocks(self) -> float:
        return float(sum(blocks_for(self.contexts[r] + LOOKAHEAD, 16) for r in self.rows))

    def evict_youngest(self) -> Request:
        request = max(self.rows, key=lambda r: r.admit_order)
        self.rows.remove(request)
        return request


def admission(capacity: int, block_size: int | None) -> Admission:
    engine = Engine(max_batch=8, max_batched_tokens=1000, block_size=block_size)
    return Admission(engine, LOOKAHEAD, capacity, Levels(), np.random.default_rng(0))


def test_block_arithmetic_rounds_up_and_capacity_rounds_down():
    assert [blocks_for(n, 16) for n in (1, 16, 17, 33, 48, 49)] == [1, 1, 2, 3, 3, 4]
    assert kv_capacity_blocks(160, 16) == 10
    assert kv_capacity_blocks(175, 16) == 10  # 15 tokens of memory hold no whole block
    with pytest.raises(SpecsimError, match=r"engine\.block_size"):
        kv_capacity_blocks(15, 16)


def test_fragmentation_admits_fewer_prompts_than_tokens_would():
    # Four 30-token prompts with 3 lookahead slots: 33 tokens each. In tokens, 4 x 33 = 132 fit
    # 160; in blocks of 16, each holds cdiv(33, 16) = 3 blocks (15 slots lost), and 4 x 3 = 12
    # blocks do not fit 10: the fourth waits.
    tokens, blocks = admission(160, None), admission(10, 16)
    for adm in (tokens, blocks):
        adm.queue.extend(Request(i, 0.0, 30, 10) for i in range(4))
        adm.admit(0.0, decoding=0, decode_kv=0.0)
    assert (len(tokens.prefilling), tokens.reserved) == (4, 132.0)
    assert (len(blocks.prefilling), blocks.reserved, len(blocks.queue)) == (3, 9.0, 1)
    # Released block for block when a prompt completes: 9 - 3.
    done = blocks.complete([(blocks.prefilling[0], 30.0)], now=1.0)
    assert len(done) == 1 and blocks.reserved == 6.0


def test_a_preemption_that_only_block_rounding_causes():
    # Rows at contexts 62 and 46 (lookahead 3): 62 + 46 + 2 x 3 = 114 tokens fit 128, but in
    # blocks of 16 they hold cdiv(65, 16) + cdiv(49, 16) = 5 + 4 = 9 > 8 blocks: the younger goes.
    in_tokens, in_blocks = Batch([62, 46]), Batch([62, 46])
    admission(128, None).make_room(in_tokens)
    assert in_tokens.decoding == 2
    adm = admission(8, 16)
    adm.make_room(in_blocks)
    assert in_blocks.decoding == 1 and adm.queue[0].rid == 1 and adm.queue[0].preemptions == 1
    assert adm.kv_in_use(in_blocks.decoding, in_blocks.decode_blocks()) == 5.0


def test_a_request_too_large_for_the_blocks_is_refused():
    # 60 + 10 + 3 = 73 tokens fit 80, but cdiv(73, 16) = 5 blocks do not fit 4.
    admission(80, None).check_fits(Request(0, 0.0, 60, 10))
    with pytest.raises(SpecsimError, match="5 KV-cache blocks of 16"):
        admission(4, 16).check_fits(Request(0, 0.0, 60, 10))


def test_a_prefill_replica_needs_room_for_the_prompt_only():
    # 60 + 3 = 63 tokens: cdiv(63, 16) = 4 blocks fit 4 though the whole request (5) does not;
    # a 70-token prompt needs cdiv(73, 16) = 5.
    from specsim.simulation.disagg import PrefillAdmission

    engine = Engine(max_batch=8, max_batched_tokens=1000, block_size=16)
    prefill = PrefillAdmission(engine, LOOKAHEAD, 4, Levels(), np.random.default_rng(0))
    prefill.check_fits(Request(0, 0.0, 60, 10))
    with pytest.raises(SpecsimError, match="5 KV-cache blocks of 16"):
        prefill.check_fits(Request(1, 0.0, 70, 10))


BASE = {
    "seed": 3,
    "profile": "sim_profile.yaml",
    "workload": {
        "kind": "poisson",
        "rate": 20.0,
        "requests": 200,
        "prompt": {"dist": "uniform", "low": 50, "high": 400},
        "output": {"dist": "uniform", "low": 20, "high": 120},
    },
    "engine": {"max_batch": 32},
    "speculation": {"drafter": "c05", "k": 3},
}


def scenario(speculation: dict | None = None, **engine) -> Scenario:
    data = copy.deepcopy(BASE)
    data["engine"].update(engine)
    if speculation is not None:
        data["speculation"] = speculation
    return Scenario.model_validate(data).with_source(DATA / "scenario.yaml")


def test_block_size_one_counts_exactly_as_tokens(tmp_path):
    # Blocks of one token are tokens: the same run, request for request (a tight cache, so
    # preemption happens), and the summary's one extra key. Decoding heads keep no KV of their
    # own, so the lookahead is k + 1 either way.
    tight = {"kv_capacity_tokens": 3000}
    heads = {"drafter": "heads", "k": 2}
    a = run_simulation(scenario(heads, **tight), records_path=tmp_path / "a.csv")
    b = run_simulation(scenario(heads, **tight, block_size=1), records_path=tmp_path / "b.csv")
    assert a.summary["preemptions"] > 0
    assert (tmp_path / "a.csv").read_bytes() == (tmp_path / "b.csv").read_bytes()
    assert b.summary.pop("kv_capacity_blocks") == 3000
    b.summary["pools"]["main"].pop("kv_capacity_blocks")
    assert a.summary == b.summary


def test_two_rows_preempted_only_by_block_rounding(tmp_path):
    # Two requests together, prompt 40, output 30, speculation off (lookahead 1), 144 tokens of
    # cache. In tokens the most they hold is 2 x (69 + 1) = 140 <= 144: no preemption. In blocks
    # of 16 (9 of them), a row at context 64 holds cdiv(65, 16) = 5 blocks, so when both pass 63
    # they need 10 > 9 and the younger is preempted.
    data = copy.deepcopy(BASE)
    data["workload"] = {
        "kind": "fixed_rate",
        "rate": 1000.0,
        "requests": 2,
        "prompt": {"dist": "fixed", "value": 40},
        "output": {"dist": "fixed", "value": 30},
    }
    data["speculation"] = {"drafter": None, "k": 0}
    data["engine"] = {"max_batch": 4, "kv_capacity_tokens": 144, "jitter": False}
    plain = Scenario.model_validate(data).with_source(DATA / "scenario.yaml")
    data["engine"]["block_size"] = 16
    blocked = Scenario.model_validate(data).with_source(DATA / "scenario.yaml")
    tokens = run_simulation(plain, records_path=tmp_path / "t.csv")
    blocks = run_simulation(blocked, records_path=tmp_path / "b.csv")
    assert tokens.summary["preemptions"] == 0
    assert blocks.summary["preemptions"] >= 1
    assert read_records(tmp_path / "b.csv")["preemptions"].tolist()[1] >= 1  # the younger
    assert blocks.summary["kv_capacity_blocks"] == 9


def test_a_draft_model_holds_k_more_slots_per_sequence_in_blocks():
    # vLLM's v1 scheduler allocates num_lookahead_tokens = k more slots per sequence for a draft
    # model. Prompt 60 + output 40 with k = 3: in tokens 100 + 4 = 104 fit 105; in blocks of one
    # token the draft model's sequence needs 100 + 4 + 3 = 107; decoding heads (no KV of their
    # own) still 100 + 3 = 103.
    data = copy.deepcopy(BASE)
    data["workload"] = {
        "kind": "fixed_rate",
        "rate": 10.0,
        "requests": 1,
        "prompt": {"dist": "fixed", "value": 60},
        "output": {"dist": "fixed", "value": 40},
    }
    data["engine"] = {"kv_capacity_tokens": 105}

    def run(block_size, drafter, k):
        data["engine"]["block_size"] = block_size
        data["speculation"] = {"drafter": drafter, "k": k}
        return run_simulation(Scenario.model_validate(data).with_source(DATA / "scenario.yaml"))

    assert run(None, "c05", 3).summary["requests"] == 1
    with pytest.raises(SpecsimError, match="needs 107 KV-cache blocks of 1"):
        run(1, "c05", 3)
    assert run(1, "heads", 2).summary["requests"] == 1
