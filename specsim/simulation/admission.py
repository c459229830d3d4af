"""A replica's waiting queue and its prompts in prefill: admission, preemption and chunking.

- Admission: waiting requests join FCFS while the batch has room and the KV cache can hold the
  prompt plus k + 1 lookahead slots (head-of-line blocking, as vLLM does); with chunked prefill
  no more join once a token budget's worth of prompt tokens is pending.
- Preemption: while the cache cannot hold the running sequences' next step, the most recently
  admitted one goes back to the head of the queue (its KV is dropped; it later recomputes its
  prompt and the tokens it had generated).
- Chunking: which prompt tokens ride in the next iteration, in queue order, within the token
  budget (whole prompts in iterations of their own, without chunked prefill).

The running batch itself (the decoding rows) is the replica's; the calls that need it take
what they read of it.
"""

from __future__ import annotations

from collections import deque
from typing import Protocol

import numpy as np

from specsim.costs import PassTotals
from specsim.errors import SpecsimError
from specsim.scenario import Engine
from specsim.simulation.request import Request

Chunks = list[tuple[Request, float]]  # (request, prompt tokens it runs this iteration)


class RunningBatch(Protocol):
    """What preemption needs of the replica's decoding rows."""

    decoding: int  # rows decoding
    decode_kv: float  # KV-cache tokens they hold

    def evict_youngest(self) -> Request:
        """Take the most recently admitted decoding row out of the batch."""
        ...


class Admission:
    """The queue, the prompts being prefilled and the KV cache they have reserved."""

    def __init__(
        self, engine: Engine, lookahead: int, kv_capacity: int, acceptance, rng: np.random.Generator
    ):
        self.chunked = engine.chunked_prefill
        self.token_budget = engine.max_batched_tokens
        self.max_batch = engine.max_batch
        self.lookahead = lookahead
        self.kv_capacity = kv_capacity
        self.acceptance = acceptance
        self.rng = rng  # the replica's stream (acceptance levels are drawn from it too)
        self.queue: deque[Request] = deque()
        self.prefilling: list[Request] = []  # admitted, prompt not yet through, in order
        self.reserved = 0.0  # KV-cache tokens reserved for the prompts in prefill
        self.pending = 0.0  # prompt tokens admitted but not yet processed
        self.admissions = 0
        self._levels: list[int] = []

    def check_fits(self, request: Request) -> None:
        need = request.prompt + request.output + self.lookahead
        if need > self.kv_capacity:
            raise SpecsimError(
                f"request {request.rid} needs {need} KV-cache tokens (prompt {request.prompt} + "
                f"output {request.output} + lookahead) but a replica holds {self.kv_capacity}",
                key="workload",
                fix="cap the lengths, or give the engine more memory (engine.memory_utilisation, "
                "engine.kv_capacity_tokens, a larger device in the profile)",
            )

    def kv_in_use(self, decoding: int, decode_kv: float) -> float:
        """KV-cache tokens held: the decoding rows' context and lookahead, and the prompts'
        reservations."""
        return decode_kv + decoding * self.lookahead + self.reserved

    # ---- admission and preemption ----------------------------------------------------------
    def _next_level(self) -> int:
        """The next request's acceptance level, drawn in chunks from the replica's stream."""
        if not self._levels:
            self._levels = self.acceptance.assign_levels(self.rng, 4096)[::-1].tolist()
        return self._levels.pop()

    def admit(self, now: float, decoding: int, decode_kv: float) -> None:
        queue = self.queue
        running = decoding + len(self.prefilling)
        if not queue or running >= self.max_batch:
            return
        used = self.kv_in_use(decoding, decode_kv)
        while queue and running < self.max_batch:
            if self.chunked and self.pending >= self.token_budget:
                break
            request = queue[0]
            need = request.prefill_target + self.lookahead
            if used + need > self.kv_capacity:
                break
            queue.popleft()
            if request.scheduled < 0:
                request.scheduled = now
                request.level = self._next_level()
            request.prefilled = 0
            request.admit_order = self.admissions
            self.admissions += 1
            self.prefilling.append(request)
            self.reserved += need
            self.pending += request.prefill_target
            used += need
            running += 1

    def make_room(self, batch: RunningBatch) -> None:
        """Preempt the youngest sequences until the cache holds the batch's next step."""
        while self.kv_in_use(batch.decoding, batch.decode_kv) > self.kv_capacity:
            if batch.decoding + len(self.prefilling) <= 1:
                raise SpecsimError(
                    "one sequence outgrew the whole KV cache", key="engine", fix="add memory"
                )
            # Prompts in prefill were admitted after every decoding row: they go first.
            if self.prefilling:
                request = self.prefilling.pop()
                self.reserved -= request.prefill_target + self.lookahead
                self.pending -= request.prefill_target - request.prefilled
            else:
                request = batch.evict_youngest()
            request.prefilled = 0
            request.preemptions += 1
            self.queue.appendleft(request)

    # ---- chunking ----------------------------------------------------------------------------
    def whole_prompts(self) -> tuple[Chunks, PassTotals]:
        """The prompts of an iteration without chunked prefill: whole ones, in order, within the
        token budget (the first always), and their totals."""
        chunks = []
        tokens = kv = pairs = 0.0
        for request in self.prefilling:
            chunk = request.prefill_target - request.prefilled
            if chunks and tokens + chunk > self.token_budget:
                break
            chunks.append((request, chunk))
            tokens += chunk
            kv += request.prefilled
            pairs += chunk * (request.prefilled + (chunk + 1) / 2.0)
        return chunks, PassTotals(len(chunks), tokens, kv, pairs)

    def chunks(self, budget: float) -> tuple[Chunks, PassTotals]:
        """Prompt chunks for what the decoding rows leave of the token budget (chunked
        prefill), and their totals."""
        chunks = []
        tokens = kv = pairs = 0.0
        for request in self.prefilling:
            if budget <= 0:
                break
            chunk = min(request.prefill_target - request.prefilled, budget)
            chunks.append((request, chunk))
            budget -= chunk
            tokens += chunk
            kv += request.prefilled
            pairs += chunk * (request.prefilled + (chunk + 1) / 2.0)
        return chunks, PassTotals(len(chunks), tokens, kv, pairs)

    def chunk_totals(self, budget: float) -> PassTotals:
        """The totals of the prompt chunks a budget would admit (for the window policy)."""
        return self.chunks(budget)[1]

    def complete(self, chunks: Chunks, now: float) -> list[Request]:
        """Count the chunks as run; the requests whose prompt is now through leave prefill
        (their first token sampled, their reservation released) and are returned in order."""
        done = []
        for request, chunk in chunks:
            request.prefilled += chunk
            self.pending -= chunk
            if request.prefilled >= request.prefill_target:
                done.append(request)
        if not done:
            return done
        # Chunks go out in queue order and only the last can be partial: done is a prefix.
        del self.prefilling[: len(done)]
        for request in done:
            self.reserved -= request.prefill_target + self.lookahead
            if request.first_token < 0:
                request.first_token = now
            request.generated += 1  # the prefill pass samples the next token
        return done
