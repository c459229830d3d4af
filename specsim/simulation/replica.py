"""One serving replica: a continuously-batched engine with speculative decoding (SimPy process).

The running batch lives in fixed-size numpy arrays (structure of arrays, one slot per sequence
that is decoding); empty slots hold ``remaining = 0`` and ``context = 0`` so every per-row
operation runs on the whole array without masks. Each engine iteration:

1. admit waiting requests FCFS within the batch's room and the KV cache (``Admission``, in
   ``admission.py``, which holds the queue and the prompts in prefill);
2. if the cache cannot hold the running sequences' next step, preempt the most recently admitted
   ones (``Admission.make_room``);
3. plan the iteration (a ``Plan``, with the decoding rows' ``DecodePlan``): the window policy
   picks k (the adaptive one against this batch and the same cost function the engine charges,
   ``StepCosts.iteration_s``); each decoding row drafts min(k, tokens it still needs - 1) tokens
   (n-gram rows without a proposal draft none), the acceptance model draws accepted counts, and
   prompt chunks fill the rest of the token budget (chunked prefill) — or, without chunked
   prefill, waiting prompts run as their own iteration;
4. wait the iteration's duration (``StepCosts.iteration_s``: target pass + k draft passes + a
   draft model's pass over the prompt chunks + overhead, from the profile; times a seeded
   multiplier from the profile's measured spread when it has one and the scenario keeps
   ``engine.jitter`` on, see ``jitter.py``);
5. apply: every decoding row emits accepted + 1 tokens; finished rows become records.

Each iteration is one SimPy event, stepped here in Python: the reference path (``fast=False``)
and the specification the compiled kernels are tested against. On the fast path a replica alone
on an open-loop source takes its arrivals itself as their times pass, and where the serving
kernel knows the replica's rules (``compiled_serving.py``, ``fleet_serving.py`` behind a router)
whole spans of iterations run compiled, with the same results bit for bit
(``tests/test_sim_identity.py``). Elsewhere (replayed acceptance sequences, policies that
observe each iteration, ...) the fast path steps here too.
"""

from __future__ import annotations

import math

import numpy as np

from specsim.costs import NO_ROWS, PassTotals, StepCosts
from specsim.costs.kv_cache import kv_capacity_blocks
from specsim.metrics import EngineStats
from specsim.scenario import Engine
from specsim.simulation.admission import Admission, Chunks, kv_lookahead, verify_lookahead
from specsim.simulation.compiled_serving import ServingLoop
from specsim.simulation.compiled_stream import JumpStream
from specsim.simulation.fleet_serving import FleetServing
from specsim.simulation.plans import DecodePlan, Plan, SlotViews
from specsim.simulation.policy import window_terms
from specsim.simulation.request import Request
from specsim.simulation.steplog import StepLog

_ONE = np.float64(1.0)
_minimum = np.minimum
_count_nonzero = np.count_nonzero


class Replica:
    """A serving engine with its own queue, batch, KV cache and random stream."""

    hands_off = False  # a prompt through starts decoding here (``disagg.PrefillReplica``: not)
    joins = False  # requests arrive with their KV cache (``disagg.DecodeReplica``)
    draft_prompt_pass = False  # and owe the draft model's prompt pass (set by the fleet)
    prompt_pass = (0, 0.0, 0.0)  # the passes owed: rows, tokens, query-key pairs

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
        jitter=None,
        fast: bool = False,
        prefix=None,
    ):
        self.index = index
        self.pool_index = pool_index
        self.chunked = engine.chunked_prefill
        self.padded = engine.padded_attention
        self.token_budget = engine.max_batched_tokens
        self.max_batch = engine.max_batch
        self.costs = costs
        self.acceptance = acceptance
        self.policy = policy
        self.k_max = policy.k_max
        # Tree steps (``costs.tree_rows``): rows verify a tree's nodes; k is its depth. Each row
        # holds KV slots for every node it verifies.
        self.tree_rows = costs.tree_rows
        self.lookahead = verify_lookahead(self.k_max, self.tree_rows)
        # With a block size the cache is counted in blocks (``admission.py``); the kernels count
        # tokens, so such a replica steps one iteration at a time.
        self.block_size = engine.block_size
        # Slots each sequence holds beyond its tokens.
        self.kv_lookahead = kv_lookahead(self.k_max, costs, self.block_size)
        if self.block_size is not None:
            kv_capacity = kv_capacity_blocks(kv_capacity, self.block_size)
            fast = False
        if getattr(prefix, "shared", False):  # the kernels count each row's copy of the prefix
            fast = False
        self.kv_capacity = kv_capacity
        self.rng = rng
        # The compiled loops need a rate model: replayed sequences depend on each row's
        # position, step by step, so they run per iteration. Policies that
        # observe each iteration (``engine_policies.py``) and a workload whose acceptance shifts
        # part-way run per iteration too: the kernels know neither.
        self.fast = (
            fast
            and not acceptance.needs_position
            and not getattr(policy, "observes", False)
            and not getattr(policy, "trims", False)
            and getattr(acceptance, "shift", None) is None
        )
        self._observes = getattr(policy, "observes", False)
        # The fast path runs the compiled kernels (compiled.py), which step PCG64's state.
        if self.fast:  # the same numbers, drawn ahead in blocks (or jumped over)
            if not JumpStream.fits(rng):
                raise ValueError("the fast path draws from numpy's PCG64 generator")
            rng = JumpStream(rng)
        self._draws = rng
        self.admission = Admission(engine, self.kv_lookahead, kv_capacity, acceptance, rng, prefix)
        self.jitter = jitter  # a Jitter, or None: every iteration takes its median time
        self.sink = sink
        self.on_finish = on_finish
        self.stats = EngineStats(self.k_max, kv_capacity, engine.max_batch)
        cap = engine.max_batch
        # Batch arrays (float64 throughout, so dot products need no conversions).
        self.context = np.zeros(cap)  # tokens in the KV cache per decoding row
        self.remaining = np.zeros(cap)  # tokens still to emit; 0 marks an empty slot
        self.output = np.zeros(cap)
        self.level = np.zeros(cap, dtype=np.int64)
        self.row_drafted = np.zeros(cap)
        self.admit_order = np.full(cap, -1, dtype=np.int64)
        self.join_step = [0] * cap
        self.join_remaining = [0] * cap
        self.slot_request: list[Request | None] = [None] * cap
        self.free_slots = list(range(cap - 1, -1, -1))
        self.decoding = 0
        self.emitted_tokens = 0.0  # output tokens emitted so far (for steady-state windows)
        self.decode_kv = 0.0  # sum of context over decoding rows, kept exactly (integers)
        self.outstanding = 0
        self.idle_event = None
        self.decode_steps = 0
        self.last_decode_end = 0.0
        self._k_plus_1 = [np.float64(k + 1) for k in range(self.k_max + 1)]
        self.capacity = cap
        # Rate models draw for the occupied prefix of the batch (``draw_slots``); replayed
        # sequences need every row's position and draw over the whole arrays.
        self._by_slot = not acceptance.needs_position
        self.level_shift = np.zeros(cap)  # 2 x level, for the flat acceptance search
        # Occupied slots all lie below ``high``; the per-row arithmetic runs on views of that
        # prefix. At low load a 256-slot engine holds a handful of rows, and numpy's cost per
        # call grows with the array, so this keeps small batches cheap. Empty slots inside the
        # prefix stay harmless as before (remaining 0, context 0: drafts -1, emitted 0).
        self.high = 0
        self._prefix_views: dict[int, SlotViews] = {}
        # Constants the hot path would otherwise look up every iteration.
        self._flops_per_token = costs.target_flops_per_token
        self._attn_flops = costs.target_attn_flops
        self.log = StepLog(self.stats, cap)
        self._kv_planned = 0.0
        # A batch-aware policy (adaptive) evaluates the engine's own cost function on this batch.
        self._batch_policy = hasattr(policy, "choose_batch")
        self._trims = getattr(policy, "trims", False)  # verifies fewer drafts than proposed
        if hasattr(policy, "attach"):
            policy.attach(costs, acceptance)
        # The cost model and the window policy as the kernels read them.
        self.cost_terms = np.array(costs.terms) if self.fast else None
        self.window_terms = window_terms(policy) if self.fast else None
        self._joined = 0  # rows that started decoding since the last decode iteration
        self.charged_admissions = 0  # admissions an iteration's seconds have paid for
        # The fast path: the open-loop arrivals (this replica's own, or the fleet's).
        self._process = None
        self._serving: ServingLoop | None = None  # the compiled loop for a lone replica
        self.arrivals = None

    # ---- queue ---------------------------------------------------------------------------
    def enqueue(self, request: Request) -> None:
        """Queue a request (refused when it could never fit the KV cache)."""
        self.admission.check_fits(request)
        self.outstanding += 1
        self.receive(request)

    def receive(self, request: Request) -> None:
        """Queue a request already counted (into the serving loop's table where it holds the
        replica's state), and wake the replica."""
        if self._serving is None or not self._serving.takes(request):
            self.admission.queue.append(request)
        if self.idle_event is not None:
            event, self.idle_event = self.idle_event, None
            event.succeed()

    def emitted_tokens_at(self, now: float) -> float:
        """Output tokens emitted by time ``now`` (a compiled call under way counts the
        iterations that have ended)."""
        if getattr(self._serving, "holding", False):
            return self._serving.emitted_at(now)
        return self.emitted_tokens

    # ---- the SimPy process -----------------------------------------------------------------
    def start(self, env, arrivals=None) -> None:
        """Start the replica's process; ``arrivals`` (an ``ArrivalFeed``, fast path only): the
        replica takes an open-loop source's requests itself, as their times pass."""
        self.arrivals = arrivals if self.fast else None
        # Alone on an open-loop source, iterations can run compiled (compiled_serving.py).
        if self.arrivals is not None:
            self._serving = ServingLoop.build(self, feed=self.arrivals)
        elif self.fast:  # requests routed to it: the fleet's serving loop
            self._serving = FleetServing.build(self)
        self._process = env.process(self.process(env))

    def serve_clients(self, clients) -> None:
        """This replica alone serves closed-loop ``clients``: the compiled loop for them, where
        it runs (``compiled_serving.py``)."""
        loop = ServingLoop.build(self, clients=clients) if self.fast else None
        self._serving = loop or self._serving

    def process(self, env):
        """The replica's iterations, one SimPy event each, except where a compiled loop runs a
        span of them as one; a replica alone on an open-loop source takes its arrivals itself."""
        admission = self.admission
        arrivals = self.arrivals
        while True:
            if arrivals is not None:
                self._take_arrivals(env.now)
            if not self._has_work():
                if arrivals is None:
                    self.idle_event = env.event()
                    yield self.idle_event
                elif arrivals.next_time < math.inf:
                    yield env.timeout_at(arrivals.next_time)
                    continue
                else:
                    return
            serving = self._serving
            if serving is not None and (yield from serving.serve(self, env)):
                continue
            start = env.now
            if admission.queue:
                admission.admit(start, self.decoding, self._held())
            # The engine's own work on each request admitted since the last iteration was priced
            # (this one's; or a kernel call's that stopped after admitting, ``compiled_serving``).
            admit_s = self.costs.admit_s * (admission.admissions - self.charged_admissions)
            self.charged_admissions = admission.admissions
            if not self.chunked and admission.prefilling:
                yield from self._prefill_only_iteration(env, admit_s)
                continue
            plan = self._plan_mixed()
            dt = plan.seconds + admit_s
            if self.jitter is not None:
                dt *= self.jitter.factor(prefill=plan.decode is None)
            yield env.timeout(dt)
            self._apply_mixed(plan, env.now, start)

    def _prefill_only_iteration(self, env, admit_s: float = 0.0):
        """An iteration of prompt chunks alone (prefill not chunked into decode iterations)."""
        plan = self._plan_prefill_only()
        dt = plan.seconds + admit_s
        if self.jitter is not None:
            dt *= self.jitter.factor(prefill=True)
        yield env.timeout(dt)
        self.emitted_tokens += self.admission.completing(plan.chunks)
        self._finish_prefills(plan.chunks, env.now)
        self._record_iteration(dt, plan.batch, None)

    def _has_work(self) -> bool:
        if getattr(self._serving, "holding", False):  # the fleet's serving loop holds it
            return self._serving.has_work()
        admission = self.admission
        return bool(admission.queue or self.decoding or admission.prefilling)

    def _take_arrivals(self, now: float) -> None:
        arrivals = self.arrivals
        while arrivals.next_time <= now:
            self.enqueue(arrivals.pop())

    def release(self, slot: int, drafted: float, decode_steps: int, now: float) -> None:
        """Bank and record a row that the compiled loop finished (it has cleared the slot's
        arrays and counts, and may have given the slot to a new row since): ``drafted``, its
        drafted total; ``decode_steps``, the replica's count after its last step (at ``now``).
        ``_bank_row``'s sums, with nothing left to emit."""
        request = self.slot_request[slot]
        steps = decode_steps - self.join_step[slot]
        request.steps += steps
        request.drafted += int(drafted)
        request.accepted += self.join_remaining[slot] - steps
        request.generated = request.output
        self.slot_request[slot] = None
        self.free_slots.append(slot)
        self._finish(request, now)

    def adopt(self, request: Request, join_step: int) -> None:
        """``_start_decoding`` for a request the compiled loop started decoding (it has set the
        slot's arrays and counts)."""
        slot = self.free_slots.pop()
        self.slot_request[slot] = request
        self.output[slot] = request.output
        self.join_step[slot] = join_step
        self.join_remaining[slot] = request.output - request.generated

    def _held(self) -> float:
        """What the decoding rows hold of the cache: tokens, or blocks with a block size."""
        return self.decode_kv if self.block_size is None else self.decode_blocks()

    def decode_blocks(self) -> float:
        """Blocks the decoding rows hold: cdiv(context + lookahead, block_size) each."""
        views = self._prefix(self.high)
        held = -(-(views.context + self.kv_lookahead) // self.block_size)
        return float(held[views.remaining > 0].sum())

    def evict_youngest(self) -> Request:
        """Take the most recently admitted decoding row out of the batch (preemption: its KV is
        dropped, and it will recompute its prompt and the tokens it generated)."""
        slot = int(np.argmax(self.admit_order))
        request = self.slot_request[slot]
        self._bank_row(slot, request)
        request.generated = request.output - int(self.remaining[slot])
        self._free_slot(slot)
        request.prefill_target = request.prompt + request.generated
        return request

    # ---- planning ----------------------------------------------------------------------------
    def _plan_prefill_only(self) -> Plan:
        admission = self.admission
        self._kv_planned = admission.kv_in_use(self.decoding, self._held())
        chunks, prompts = admission.whole_prompts()
        costs = self.costs
        # The measured range is per sequence: the largest cached context and the chunk sizes.
        sizes = [chunk for _, chunk in chunks]
        reach = max(r.prefilled for r, _ in chunks)
        costs.check_ranges(prompts.rows, reach, max(sizes), min(sizes))
        if self.padded:  # every prompt fed at the longest one's length and cached context
            rows, longest = float(prompts.rows), max(sizes)
            charged = PassTotals(
                prompts.rows,
                rows * longest,
                rows * reach,
                rows * longest * (reach + (longest + 1) / 2),
            )
        else:
            charged = prompts
        dt = costs.iteration_s(0, NO_ROWS, charged)
        tokens, pairs = prompts.tokens, prompts.pairs
        self.stats.flops["prefill"] += costs.target_flops(
            tokens, pairs
        ) + costs.draft_prefill_flops(tokens, pairs)
        return Plan(dt, None, chunks, prompts.rows)

    def _choose_window(self, rows: int, decode_kv: float) -> int:
        if not self._batch_policy:
            return self.policy.choose(rows, decode_kv)
        admission = self.admission
        prefill = admission.chunk_totals if (self.chunked and admission.prefilling) else None
        views = self._prefix(self.high)
        return self.policy.choose_batch(
            rows, decode_kv, views.remaining, views.context, prefill, self.token_budget
        )

    def _plan_mixed(self) -> Plan:
        """The next iteration."""
        costs = self.costs
        admission = self.admission
        held = admission.kv_in_use(self.decoding, self._held())
        if held > self.kv_capacity:
            admission.make_room(self)
            held = admission.kv_in_use(self.decoding, self._held())
        self._kv_planned = held
        decode_kv = self.decode_kv
        rows = self.decoding
        k = self._choose_window(rows, decode_kv)
        decode = None
        new_tokens = 0.0
        pairs = charged_pairs = 0.0
        charged_kv = decode_kv
        if rows:
            views = self._prefix(self.high)
            remaining, context, shift, _, ones = views
            used = remaining.shape[0]  # slots the step covers: every occupied one
            # min(remaining - 1, k) drafts; empty slots (remaining 0) get -1, accept -1 and so
            # emit nothing. Numpy scalars and in-place operations keep this to a few microseconds.
            drafts = _minimum(remaining, self._k_plus_1[k])
            drafts -= _ONE
            if self._trims and k:
                # Prompt chunks are scheduled around every proposed draft, then the policy
                # trims the drafts it verifies (vLLM's order).
                chunks, prefill = self._prefill_chunks(float(drafts.dot(ones)) + used)
                self._trim(drafts, views, decode_kv, prefill, chunks)
            if k == 0:
                # Nothing drafted, nothing to accept: no draws. (Window policies that switch
                # speculation off for some iterations leave the stream to the steps that use it.)
                accepted, proposed = drafts.copy(), None
            elif self._by_slot:
                # One uniform per slot, one search for every row's acceptance level (see
                # RateAcceptance): the count of leading accepted drafts.
                accepted, proposed = self.acceptance.draw_slots(
                    self._draws, k, shift, self.capacity
                )
            else:
                position = self.output - self.remaining
                accepted, proposed = self.acceptance.draw(self._draws, k, self.level, position)
                accepted = accepted[:used]
            if proposed is not None:
                drafts = _minimum(drafts, proposed[:used] * k)
            accepted = _minimum(accepted, drafts)
            # Each row verifies new = drafts + 1 positions (0 for empty slots, whose drafts are
            # -1 and context 0). Query-key pairs: sum new (context + (new + 1) / 2), expanded in
            # drafts so that no temporary array is needed. Every term is a whole number well
            # below 2^53, so these sums are exact whatever the summation order or prefix length.
            if self.tree_rows is None:
                drafted = float(drafts.dot(ones))
                new_tokens = drafted + used
                own_span = 0.5 * (float(drafts.dot(drafts)) + 2.0 * drafted + used + new_tokens)
                pairs = charged_pairs = float(drafts.dot(context)) + decode_kv + own_span
            else:  # the tree cut at each row's drafts: the same sums for a chain-shaped tree
                new_tokens, pairs = self.tree_rows.totals(drafts, context)
                charged_pairs = pairs
                own_span = self.tree_rows.own_span(drafts) if self.padded else 0.0
            if self.padded:  # every row's attention (and its cache read) runs to the longest
                longest = float(context.max())
                charged_kv = rows * longest
                charged_pairs = new_tokens * longest + own_span
            decode = DecodePlan(k, drafts, accepted, new_tokens, decode_kv, self._joined, views)
            self._joined = 0
        if not (self._trims and k and rows):
            chunks, prefill = self._prefill_chunks(new_tokens)
        if costs.checks_ranges:
            self._check_ranges(rows, k, chunks or ())
        if rows and not prefill.rows:
            dt = costs.decode_iteration_s(k, rows, new_tokens, charged_kv, charged_pairs)
        else:
            dt = costs.iteration_s(
                k, PassTotals(rows, new_tokens, charged_kv, charged_pairs), prefill
            )
        if decode is not None:
            self.log.verification_flops += (
                self._flops_per_token * new_tokens + self._attn_flops * pairs
            )
            self.log.drafter_flops += costs.draft_flops(rows, k, decode_kv)
        return Plan(dt, decode, chunks, rows + prefill.rows)

    def _prefill_chunks(self, decode_tokens: float) -> tuple[Chunks | None, PassTotals]:
        """The prompt chunks that fit beside ``decode_tokens`` (their FLOPs counted)."""
        admission = self.admission
        if not admission.prefilling:
            return None, NO_ROWS
        chunks, prefill = admission.chunks(self.token_budget - decode_tokens)
        if prefill.rows:
            costs = self.costs
            p_tokens, p_pairs = prefill.tokens, prefill.pairs
            self.stats.flops["prefill"] += costs.target_flops(
                p_tokens, p_pairs
            ) + costs.draft_prefill_flops(p_tokens, p_pairs)
        return chunks, prefill

    def _trim(self, drafts, views: SlotViews, decode_kv: float, prefill, chunks) -> None:
        """The policy's verified drafts per row, in place of ``drafts``."""
        rows = self.decoding
        decode = PassTotals(rows, float(rows), decode_kv, decode_kv + rows)
        finishing = sum(1 for r, c in chunks or () if r.prefilled + c >= r.prefill_target)
        levels = (views.level_shift * 0.5).astype(np.int64)
        self.policy.admit(drafts, levels, decode, prefill, float(rows + finishing))

    def _check_ranges(self, rows: int, k: int, chunks) -> None:
        top = float(self.context.max()) if rows else 0.0
        sizes = [float(c) for _, c in chunks]
        if chunks:
            top = max(top, max(float(r.prefilled) for r, _ in chunks))
        widest = k + 1.0 if self.tree_rows is None else float(self.lookahead)
        decode_sizes = [1.0, widest] if rows else []
        low = min(decode_sizes + sizes)
        high = max(decode_sizes + sizes)
        self.costs.check_ranges(rows + len(sizes), top, high, low)

    # ---- applying an iteration ---------------------------------------------------------------
    def _apply_mixed(self, plan: Plan, now: float, start: float) -> None:
        decode, chunks, batch = plan.decode, plan.chunks, plan.batch
        finished = ()
        if decode is not None:
            k, drafts, accepted = decode.k, decode.drafts, decode.accepted
            if self._observes:  # before ``accepted`` becomes the tokens emitted, in place
                rows_now = drafts >= 0.0  # occupied slots (empty ones draft -1)
                self.policy.observe(drafts[rows_now], accepted[rows_now], now)
            log = self.log
            log.record_step(accepted, drafts)
            remaining, context, _, row_drafted, ones = decode.views
            emitted = accepted
            emitted += _ONE
            remaining -= emitted
            context += emitted
            row_drafted += drafts
            emitted_total = float(emitted.dot(ones))
            self.emitted_tokens += emitted_total
            self.decode_kv += emitted_total
            self.decode_steps += 1
            rows = self.decoding
            wasted = decode.verified - emitted_total
            if wasted:
                per_position = self.costs.wasted_flops_per_position(decode.kv / rows)
                log.wasted_flops += wasted * per_position
            log.window_rows += k * rows
            log.decode_rows += rows
            # Finished rows emitted something and have nothing left (k + 1 <= 64 tokens a step).
            # Most iterations finish no row: one count of the rows still going says so.
            if _count_nonzero(remaining) < rows:
                finished = (emitted > remaining * 64.0).nonzero()[0].tolist()
        if chunks:  # first tokens count before any finish, which may end the steady window
            self.emitted_tokens += self.admission.completing(chunks)
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
            self._finish_prefills(chunks, now)

    def _finish_prefills(self, chunks: Chunks, now: float) -> None:
        """Count the chunks as run; a request whose prompt is through starts decoding (or
        finishes, when the prefill's token was its last)."""
        for request in self.admission.complete(chunks, now):
            if request.generated >= request.output:
                self._finish(request, now)
                continue
            self._start_decoding(request)

    def _start_decoding(self, request: Request) -> None:
        """Give a request whose prompt's KV cache is in place a slot in the decoding batch."""
        slot = self.free_slots.pop()
        if slot >= self.high:
            self.high = slot + 1
        left = request.output - request.generated
        self.slot_request[slot] = request
        self.context[slot] = request.prefill_target
        self.decode_kv += request.prefill_target
        self.remaining[slot] = left
        self.output[slot] = request.output
        self.level[slot] = request.level
        self.level_shift[slot] = 2.0 * request.level
        self.row_drafted[slot] = 0.0
        self.admit_order[slot] = request.admit_order
        self.join_step[slot] = self.decode_steps
        self.join_remaining[slot] = left
        self.decoding += 1
        self._joined += 1

    def _bank_row(self, slot: int, request: Request, decode_steps: int | None = None) -> None:
        """Add a row's step counts to its request (before the slot is freed); ``decode_steps``:
        the replica's count of decode steps when the row's last one ended (default: now)."""
        if decode_steps is None:
            decode_steps = self.decode_steps
        steps = decode_steps - self.join_step[slot]
        emitted = self.join_remaining[slot] - int(self.remaining[slot])
        request.steps += steps
        request.drafted += int(self.row_drafted[slot])
        request.accepted += emitted - steps  # each step emits its accepted drafts + 1

    def _free_slot(self, slot: int) -> None:
        self.decode_kv -= float(self.context[slot])
        self.remaining[slot] = 0.0
        self.context[slot] = 0.0
        self.level[slot] = 0
        self.level_shift[slot] = 0.0
        self.admit_order[slot] = -1
        self.slot_request[slot] = None
        self.free_slots.append(slot)
        self.decoding -= 1
        high = self.high
        while high and self.slot_request[high - 1] is None:
            high -= 1
        self.high = high

    def _prefix(self, high: int) -> SlotViews:
        """Views of the batch arrays' first ``high`` slots, made once per prefix length."""
        views = self._prefix_views.get(high)
        if views is None:
            views = SlotViews(
                self.remaining[:high],
                self.context[:high],
                self.level_shift[:high],
                self.row_drafted[:high],
                np.ones(high),
            )
            self._prefix_views[high] = views
        return views

    def _finish(self, request: Request, now: float) -> None:
        self.outstanding -= 1
        self.admission.finished(request)
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
    def _record_iteration(
        self, dt: float, batch: int, decode: DecodePlan | None, now: float = 0.0
    ) -> None:
        """Log one iteration's duration, batch, KV use and inter-token gaps."""
        if decode is None:
            self.log.record_iteration(dt, batch, self._kv_planned, 0.0, 0, 0)
            return
        # Rows that decoded in the previous decode iteration waited since it ended (longer than
        # dt when prefill-only iterations came between); rows that joined since got their first
        # token when this iteration started.
        joined = decode.joined
        gap = now - self.last_decode_end
        self.log.record_iteration(dt, batch, self._kv_planned, gap, self.decoding - joined, joined)

    def close(self) -> None:
        """Fold the buffered statistics in (call once the simulation has ended)."""
        if self._serving is not None:
            self._serving.release(self)
        self.log.close()
