"""One serving replica: a continuously-batched engine with speculative decoding (SimPy process).

The running batch lives in fixed-size numpy arrays (structure of arrays, one slot per sequence
that is decoding); empty slots hold ``remaining = 0`` and ``context = 0`` so every per-row
operation runs on the whole array without masks. One SimPy event per engine iteration:

1. admit waiting requests FCFS while the batch has room and the KV cache can hold the prompt plus
   k + 1 lookahead slots (head-of-line blocking, as vLLM does);
2. if the cache cannot hold the running sequences' next step, preempt the most recently admitted
   one (its KV is dropped; it goes back to the head of the queue and later recomputes its prompt
   and generated tokens);
3. plan the iteration: the window policy picks k; each decoding row drafts min(k, tokens it still
   needs - 1) tokens (n-gram rows without a proposal draft none), the acceptance model draws
   accepted counts, and prompt chunks fill the rest of the token budget (chunked prefill) — or,
   without chunked prefill, waiting prompts run as their own iteration;
4. wait the iteration's duration (target pass + k draft passes + overhead, from the profile);
5. apply: every decoding row emits accepted + 1 tokens; finished rows become records.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from specsim.errors import SpecsimError
from specsim.metrics import EngineStats
from specsim.scenario import Engine
from specsim.simulation.costs import StepCosts

BUFFER_ITERATIONS = 1024


class Request:
    """A request's state outside the batch arrays (and across preemptions)."""

    __slots__ = (
        "accepted",
        "admit_order",
        "arrival",
        "client",
        "drafted",
        "first_token",
        "generated",
        "level",
        "output",
        "preemptions",
        "prefill_target",
        "prefilled",
        "prompt",
        "rid",
        "scheduled",
        "steps",
    )

    def __init__(self, rid: int, arrival: float, prompt: int, output: int, client: int = -1):
        self.rid = rid
        self.arrival = arrival
        self.prompt = prompt
        self.output = output
        self.client = client
        self.scheduled = -1.0
        self.first_token = -1.0
        self.generated = 0
        self.steps = 0
        self.drafted = 0
        self.accepted = 0
        self.preemptions = 0
        self.level = -1
        self.prefill_target = prompt
        self.prefilled = 0
        self.admit_order = -1


class Replica:
    """A serving engine with its own queue, batch, KV cache and random stream."""

    def __init__(
        self,
        index: int,
        pool_index: int,
        engine: Engine,
        costs: StepCosts,
        acceptance,
        policy,
        kv_capacity: int,
        rng: np.random.Generator,
        sink,
        on_finish,
    ):
        self.index = index
        self.pool_index = pool_index
        self.chunked = engine.chunked_prefill
        self.token_budget = engine.max_batched_tokens
        self.max_batch = engine.max_batch
        self.costs = costs
        self.acceptance = acceptance
        self.policy = policy
        self.k_max = policy.k_max
        self.lookahead = self.k_max + 1
        self.kv_capacity = kv_capacity
        self.rng = rng
        self.sink = sink
        self.on_finish = on_finish
        self.stats = EngineStats(self.k_max, kv_capacity, engine.max_batch)
        cap = engine.max_batch
        self.context = np.zeros(cap, dtype=np.float64)
        self.remaining = np.zeros(cap, dtype=np.int64)
        self.output = np.zeros(cap, dtype=np.int64)
        self.level = np.zeros(cap, dtype=np.int64)
        self.row_drafted = np.zeros(cap, dtype=np.int64)
        self.row_accepted = np.zeros(cap, dtype=np.int64)
        self.admit_order = np.full(cap, -1, dtype=np.int64)
        self.join_step = [0] * cap
        self.slot_request: list[Request | None] = [None] * cap
        self.free_slots = list(range(cap - 1, -1, -1))
        self.decoding = 0
        self.prefilling: list[Request] = []
        self.prefill_reserved = 0.0
        self.queue: deque[Request] = deque()
        self.outstanding = 0
        self.idle_event = None
        self.decode_steps = 0
        self.admissions = 0
        self.last_decode_end = 0.0
        self._buf_dt = np.zeros(BUFFER_ITERATIONS)
        self._buf_batch = np.zeros(BUFFER_ITERATIONS, dtype=np.int64)
        self._buf_kv = np.zeros(BUFFER_ITERATIONS)
        self._buf_itl = np.zeros(2 * BUFFER_ITERATIONS)
        self._buf_itl_w = np.zeros(2 * BUFFER_ITERATIONS)
        self._buf_acc = np.zeros((BUFFER_ITERATIONS, cap), dtype=np.int8)
        self._buf_draft = np.zeros((BUFFER_ITERATIONS, cap), dtype=np.int8)
        self._n_iter = 0
        self._n_steps = 0
        self._joined = 0  # rows that started decoding since the last decode iteration

    # ---- queue -----------------------------------------------------------------------------
    def enqueue(self, request: Request) -> None:
        self.queue.append(request)
        self.outstanding += 1
        if self.idle_event is not None:
            event, self.idle_event = self.idle_event, None
            event.succeed()

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

    # ---- the SimPy process -----------------------------------------------------------------
    def process(self, env):
        while True:
            if not (self.queue or self.decoding or self.prefilling):
                self.idle_event = env.event()
                yield self.idle_event
            start = env.now
            self._admit(start)
            if not self.chunked and self.prefilling:
                dt, plan = self._plan_prefill_only()
                yield env.timeout(dt)
                self._finish_prefills(plan, env.now)
                self._record_iteration(dt, plan[1], None)
                continue
            dt, plan = self._plan_mixed()
            yield env.timeout(dt)
            self._apply_mixed(plan, env.now, start)

    # ---- admission and preemption ----------------------------------------------------------
    def _kv_in_use(self, decode_kv: float) -> float:
        return decode_kv + self.decoding * self.lookahead + self.prefill_reserved

    def _admit(self, now: float) -> None:
        queue = self.queue
        if not queue:
            return
        running = self.decoding + len(self.prefilling)
        used = self._kv_in_use(float(self.context.sum()))
        pending = sum(r.prefill_target - r.prefilled for r in self.prefilling)
        while queue and running < self.max_batch:
            if self.chunked and pending >= self.token_budget:
                break
            request = queue[0]
            need = request.prefill_target + self.lookahead
            if used + need > self.kv_capacity:
                break
            queue.popleft()
            if request.scheduled < 0:
                request.scheduled = now
                request.level = int(self.acceptance.assign_levels(self.rng, 1)[0])
            request.prefilled = 0
            request.admit_order = self.admissions
            self.admissions += 1
            self.prefilling.append(request)
            self.prefill_reserved += need
            pending += request.prefill_target
            used += need
            running += 1

    def _preempt_youngest(self) -> None:
        if self.prefilling:
            request = self.prefilling.pop()
            self.prefill_reserved -= request.prefill_target + self.lookahead
        else:
            slot = int(np.argmax(self.admit_order))
            request = self.slot_request[slot]
            request.generated = request.output - int(self.remaining[slot])
            self._bank_row(slot, request)
            self._free_slot(slot)
            request.prefill_target = request.prompt + request.generated
        request.prefilled = 0
        request.preemptions += 1
        self.queue.appendleft(request)

    def _make_room(self) -> float:
        decode_kv = float(self.context.sum())
        while self._kv_in_use(decode_kv) > self.kv_capacity:
            if self.decoding + len(self.prefilling) <= 1:
                raise SpecsimError(
                    "one sequence outgrew the whole KV cache", key="engine", fix="add memory"
                )
            self._preempt_youngest()
            decode_kv = float(self.context.sum())
        return decode_kv

    # ---- planning ----------------------------------------------------------------------------
    def _plan_prefill_only(self):
        rows = tokens = kv = pairs = 0.0
        chunks = []
        for request in self.prefilling:
            chunk = request.prefill_target - request.prefilled
            if chunks and tokens + chunk > self.token_budget:
                break
            chunks.append((request, chunk))
            rows += 1
            tokens += chunk
            kv += request.prefilled
            pairs += chunk * (request.prefilled + (chunk + 1) / 2.0)
        costs = self.costs
        batch = int(rows)
        costs.check_ranges(batch, max(r.prefill_target for r, _ in chunks), tokens, 1)
        dt = (
            costs.target_pass_s(batch, tokens, kv, pairs)
            + costs.draft_prefill_s(batch, tokens, kv, pairs)
            + costs.overhead_s(batch)
        )
        flops = costs.target_flops(tokens, pairs) + costs.draft_prefill_flops(tokens, pairs)
        self.stats.flops["prefill"] += flops
        return dt, (chunks, batch)

    def _plan_mixed(self):
        costs = self.costs
        decode_kv = self._make_room()
        rows = self.decoding
        k = self.policy.choose(rows, decode_kv)
        dt = 0.0
        decode = None
        new_tokens = 0.0
        pairs = 0.0
        if rows:
            remaining = self.remaining
            drafts = np.minimum(remaining - 1, k)
            position = (self.output - remaining) if self.acceptance.needs_position else None
            accepted, proposed = self.acceptance.draw(self.rng, k, self.level, position)
            if proposed is not None:
                drafts = np.minimum(drafts, proposed * k)
            accepted = np.minimum(accepted, drafts)
            new = drafts + 1
            new_tokens = float(new.sum())
            pairs = float(new @ self.context) + 0.5 * float(new @ (new + 1))
            dt += costs.draft_s(rows, k, decode_kv)
            decode = (k, drafts, accepted, new_tokens, decode_kv, self._joined)
            self._joined = 0
        # Prompt chunks fill what the decoding rows leave of the token budget.
        budget = self.token_budget - new_tokens
        chunks = []
        p_rows = p_tokens = p_kv = p_pairs = 0.0
        for request in self.prefilling:
            if budget <= 0:
                break
            chunk = min(request.prefill_target - request.prefilled, budget)
            chunks.append((request, chunk))
            budget -= chunk
            p_rows += 1
            p_tokens += chunk
            p_kv += request.prefilled
            p_pairs += chunk * (request.prefilled + (chunk + 1) / 2.0)
        batch = rows + int(p_rows)
        if costs._check_target or costs._check_draft:
            top = float(self.context.max()) if rows else 0.0
            if chunks:
                top = max(top, max(float(r.prefilled) for r, _ in chunks))
            low = 1.0 if rows else min(c for _, c in chunks)
            high = max([k + 1.0 if rows else 1.0] + [float(c) for _, c in chunks])
            costs.check_ranges(batch, top, high, low)
        dt += costs.target_pass_s(batch, new_tokens + p_tokens, decode_kv + p_kv, pairs + p_pairs)
        dt += costs.draft_prefill_s(int(p_rows), p_tokens, p_kv, p_pairs)
        dt += costs.overhead_s(batch)
        flops = self.stats.flops
        if rows:
            flops["verification"] += costs.target_flops(new_tokens, pairs)
            flops["drafter"] += costs.draft_flops(rows, k, decode_kv)
        if chunks:
            flops["prefill"] += costs.target_flops(p_tokens, p_pairs)
            flops["prefill"] += costs.draft_prefill_flops(p_tokens, p_pairs)
        return dt, (decode, chunks, batch)

    # ---- applying an iteration ---------------------------------------------------------------
    def _apply_mixed(self, plan, now: float, start: float) -> None:
        decode, chunks, batch = plan
        finished = ()
        if decode is not None:
            k, drafts, accepted, new_tokens, decode_kv, _ = decode
            emitted = accepted + 1
            self.remaining -= emitted
            self.context += emitted
            self.row_drafted += drafts
            self.row_accepted += accepted
            self.decode_steps += 1
            rows = self.decoding
            wasted = new_tokens - float(emitted.sum())
            if wasted:
                per_position = self.costs.wasted_flops_per_position(decode_kv / rows)
                self.stats.flops["wasted"] += wasted * per_position
            self.stats.window_rows += k * rows
            self.stats.decode_rows += rows
            i = self._n_steps
            self._buf_acc[i] = accepted
            self._buf_draft[i] = drafts
            self._n_steps = i + 1
            if self._n_steps == BUFFER_ITERATIONS:
                self._flush_steps()
            finished = np.flatnonzero((self.remaining == 0) & (emitted > 0)).tolist()
        self._record_iteration(now - start, batch, decode, now)
        if decode is not None:
            self.last_decode_end = now
        for slot in finished:
            request = self.slot_request[slot]
            self._bank_row(slot, request)
            request.generated = request.output
            self._free_slot(slot)
            self._finish(request, now)
        if chunks:
            self._finish_prefills((chunks, batch), now)

    def _finish_prefills(self, plan, now: float) -> None:
        chunks, _ = plan
        done = []
        for request, chunk in chunks:
            request.prefilled += chunk
            if request.prefilled >= request.prefill_target:
                done.append(request)
        if not done:
            return
        self.prefilling = [r for r in self.prefilling if r.prefilled < r.prefill_target]
        for request in done:
            self.prefill_reserved -= request.prefill_target + self.lookahead
            if request.first_token < 0:
                request.first_token = now
            request.generated += 1  # the prefill pass samples the next token
            if request.generated >= request.output:
                self._finish(request, now)
                continue
            slot = self.free_slots.pop()
            self.slot_request[slot] = request
            self.context[slot] = request.prefill_target
            self.remaining[slot] = request.output - request.generated
            self.output[slot] = request.output
            self.level[slot] = request.level
            self.row_drafted[slot] = 0
            self.row_accepted[slot] = 0
            self.admit_order[slot] = request.admit_order
            self.join_step[slot] = self.decode_steps
            self.decoding += 1
            self._joined += 1

    def _bank_row(self, slot: int, request: Request) -> None:
        request.steps += self.decode_steps - self.join_step[slot]
        request.drafted += int(self.row_drafted[slot])
        request.accepted += int(self.row_accepted[slot])

    def _free_slot(self, slot: int) -> None:
        self.remaining[slot] = 0
        self.context[slot] = 0.0
        self.level[slot] = 0
        self.admit_order[slot] = -1
        self.slot_request[slot] = None
        self.free_slots.append(slot)
        self.decoding -= 1

    def _finish(self, request: Request, now: float) -> None:
        self.outstanding -= 1
        self.sink.add(
            (
                request.rid,
                request.arrival,
                request.scheduled,
                request.first_token,
                now,
                request.prompt,
                request.output,
                request.steps,
                request.drafted,
                request.accepted,
                request.preemptions,
                self.index,
                self.pool_index,
            )
        )
        self.on_finish(request, now)

    # ---- statistics buffers ------------------------------------------------------------------
    def _record_iteration(self, dt: float, batch: int, decode, now: float = 0.0) -> None:
        """Buffer one iteration's duration, batch, KV use and inter-token gaps."""
        i = self._n_iter
        self._buf_dt[i] = dt
        self._buf_batch[i] = batch
        self._buf_kv[i] = self._kv_in_use(float(self.context.sum()))
        if decode is not None:
            # Rows that decoded in the previous decode iteration waited since it ended (longer
            # than dt when prefill-only iterations came between); rows that joined since got
            # their first token when this iteration started.
            joined = decode[5]
            self._buf_itl[2 * i] = now - self.last_decode_end
            self._buf_itl_w[2 * i] = self.decoding - joined
            self._buf_itl[2 * i + 1] = dt
            self._buf_itl_w[2 * i + 1] = joined
        else:
            self._buf_itl_w[2 * i] = 0.0
            self._buf_itl_w[2 * i + 1] = 0.0
        self._n_iter = i + 1
        if self._n_iter == BUFFER_ITERATIONS:
            self._flush_iterations()

    def _flush_iterations(self) -> None:
        n = self._n_iter
        if n:
            itl_w = self._buf_itl_w[: 2 * n]
            keep = itl_w > 0
            self.stats.add_iterations(self._buf_dt[:n], self._buf_batch[:n], self._buf_kv[:n])
            self.stats.itl.add(self._buf_itl[: 2 * n][keep], itl_w[keep])
        self._n_iter = 0

    def _flush_steps(self) -> None:
        n = self._n_steps
        if n:
            self.stats.add_steps(self._buf_acc[:n].ravel(), self._buf_draft[:n].ravel())
        self._n_steps = 0

    def close(self) -> None:
        """Fold the buffered statistics in (call once the simulation has ended)."""
        self._flush_iterations()
        self._flush_steps()
