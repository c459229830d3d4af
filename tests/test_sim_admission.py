"""A replica's admission, preemption and chunking (``specsim.simulation.admission``), on its own:
hand-sized queues against a stand-in batch, every number worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from specsim.errors import SpecsimError
from specsim.scenario import Engine
from specsim.simulation.admission import Admission
from specsim.simulation.request import Request

LOOKAHEAD = 3  # k = 2


class Levels:
    """Acceptance levels 0, 1, 2, ... in order (the admission draws one per new request)."""

    def __init__(self):
        self.drawn = 0

    def assign_levels(self, rng, n):
        self.drawn += n
        return np.arange(n)


class Batch:
    """The replica's decoding rows, as preemption sees them: evicts the youngest first."""

    def __init__(self, rows: list[Request], kv: float):
        self.rows = rows
        self.decoding = len(rows)
        self.decode_kv = kv

    def evict_youngest(self) -> Request:
        request = max(self.rows, key=lambda r: r.admit_order)
        self.rows.remove(request)
        self.decoding -= 1
        self.decode_kv -= request.prompt
        request.prefill_target = request.prompt
        return request


def admission(kv_capacity: int, chunked: bool = True, budget: int = 100, max_batch: int = 8):
    engine = Engine(max_batch=max_batch, chunked_prefill=chunked, max_batched_tokens=budget)
    return Admission(engine, LOOKAHEAD, kv_capacity, Levels(), np.random.default_rng(0))


def queued(adm: Admission, *prompts: int) -> list[Request]:
    requests = [Request(i, 0.0, prompt, 10) for i, prompt in enumerate(prompts)]
    adm.queue.extend(requests)
    return requests


def test_admission_is_first_come_first_served_and_blocks_at_the_head():
    adm = admission(kv_capacity=100)
    first, big, small = queued(adm, 40, 60, 5)
    adm.admit(1.5, decoding=0, decode_kv=0.0)
    # 40 + 3 fits; 60 + 3 more would need 106 > 100, and the 5 behind it waits its turn.
    assert adm.prefilling == [first]
    assert list(adm.queue) == [big, small]
    assert (adm.reserved, adm.pending) == (43.0, 40.0)
    assert (first.scheduled, first.level, first.admit_order) == (1.5, 0, 0)
    # The cache counts the decoding rows' context and lookahead too: 10 + 2 x 3 + 43.
    assert adm.kv_in_use(decoding=2, decode_kv=10.0) == 59.0


def test_chunked_admission_stops_at_a_token_budget_of_pending_prompt():
    adm = admission(kv_capacity=10_000, budget=100)
    requests = queued(adm, 60, 50, 30)
    adm.admit(0.0, decoding=0, decode_kv=0.0)
    assert adm.prefilling == requests[:2]  # 110 pending >= 100: the third waits
    unchunked = admission(kv_capacity=10_000, chunked=False, budget=100)
    queued(unchunked, 60, 50, 30)
    unchunked.admit(0.0, decoding=0, decode_kv=0.0)
    assert len(unchunked.prefilling) == 3  # without chunking the budget does not hold them


def test_admission_stops_at_the_batch_limit():
    adm = admission(kv_capacity=10_000, max_batch=3)
    queued(adm, 5, 5, 5)
    adm.admit(0.0, decoding=2, decode_kv=0.0)
    assert len(adm.prefilling) == 1 and len(adm.queue) == 2


def test_make_room_preempts_the_youngest_prompt_then_the_youngest_row():
    adm = admission(kv_capacity=100)
    old, young = Request(10, 0.0, 30, 10), Request(11, 0.0, 30, 10)
    old.admit_order, young.admit_order = 0, 1
    batch = Batch([old, young], kv=60.0)  # 60 + 2 x 3 = 66 held
    waiting = queued(adm, 20)[0]
    adm.admit(0.0, batch.decoding, batch.decode_kv)  # 66 + 23 = 89 <= 100
    adm.complete(adm.chunks(5.0)[0], now=0.0)  # 5 of its 20 prompt tokens ran
    assert adm.prefilling == [waiting]
    batch.decode_kv = 75.0  # the rows grew: 75 + 6 + 23 = 104 > 100
    adm.make_room(batch)
    # The prompt in prefill goes first (admitted last), its reservation and progress undone.
    assert adm.prefilling == [] and list(adm.queue) == [waiting]
    assert (adm.reserved, adm.pending) == (0.0, 0.0)
    assert (waiting.prefilled, waiting.preemptions) == (0, 1)
    batch.decode_kv = 100.0  # 100 + 6 > 100: now a decoding row, the younger one
    adm.make_room(batch)
    assert batch.rows == [old] and list(adm.queue) == [young, waiting]
    assert young.preemptions == 1


def test_a_sequence_that_outgrows_the_whole_cache_is_an_error():
    adm = admission(kv_capacity=100)
    row = Request(0, 0.0, 98, 10)
    with pytest.raises(SpecsimError, match="outgrew the whole KV cache"):
        adm.make_room(Batch([row], kv=98.0))


def test_chunks_fill_the_budget_in_order_and_only_the_last_is_partial():
    adm = admission(kv_capacity=10_000, budget=1000)
    a, b, c = queued(adm, 30, 50, 40)
    adm.admit(0.0, decoding=0, decode_kv=0.0)
    assert adm.complete(adm.chunks(10.0)[0], now=1.0) == []  # 10 of a's 30 tokens
    chunks, totals = adm.chunks(60.0)
    assert chunks == [(a, 20), (b, 40.0)]
    assert (totals.rows, totals.tokens, totals.kv) == (2, 60.0, 10.0)
    # Pairs: each chunk's tokens over its cached context and its own causal span.
    assert totals.pairs == 20 * (10 + 21 / 2) + 40 * (0 + 41 / 2)
    assert adm.chunk_totals(60.0).pairs == totals.pairs
    done = adm.complete(chunks, now=2.0)
    assert done == [a]  # b has 10 of its 50 tokens to go
    assert adm.prefilling == [b, c]
    assert (a.first_token, a.generated) == (2.0, 1)  # the prefill pass sampled a token
    assert adm.reserved == (50 + LOOKAHEAD) + (40 + LOOKAHEAD)
    assert adm.pending == 50.0  # 10 of b, 40 of c


def test_whole_prompts_run_on_their_own_within_the_budget_the_first_always():
    adm = admission(kv_capacity=10_000, chunked=False, budget=100)
    a, b, c = queued(adm, 150, 40, 50)
    adm.admit(0.0, decoding=0, decode_kv=0.0)
    chunks, totals = adm.whole_prompts()
    assert chunks == [(a, 150)]  # over the budget alone, yet it must run
    adm.complete(chunks, now=1.0)
    chunks, totals = adm.whole_prompts()
    assert chunks == [(b, 40), (c, 50)] and (totals.rows, totals.tokens) == (2, 90.0)
