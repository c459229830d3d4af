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
(``tests/test_sim_identity.py``). Elsewhere (replayed acceptance sequences, a policy that
trims each row's drafts, ...) the fast path steps here too.
"""

from __future__ import annotations

import math

import numpy as np

from specsim.costs import StepCosts
from specsim.costs.kv_cache import kv_capacity_blocks
from specsim.metrics import EngineStats
from specsim.scenario import Engine
from specsim.simulation.admission import Admission, kv_lookahead, verify_lookahead
from specsim.simulation.compiled_serving import ServingLoop
from specsim.simulation.compiled_stream import JumpStream
from specsim.simulation.fleet_serving import FleetServing
from specsim.simulation.plans import DecodePlan, Plan
from specsim.simulation.policy import window_terms
from specsim.simulation.replica_batch import BatchRows
from specsim.simulation.replica_plan import _ONE, IterationPlanning
from specsim.simulation.request import Request
from specsim.simulation.steplog import StepLog

_count_nonzero = np.count_nonzero


class Replica(IterationPlanning, BatchRows):
    """A serving engine with its own queue, batch, KV cache and random stream; it plans an
    iteration in ``replica_plan.py`` and keeps its batch's rows in ``replica_batch.py``."""

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
        # With a block size the cache is counted in blocks (``admission.py``).
        self.block_size = engine.block_size
        # Slots each sequence holds beyond its tokens.
        self.kv_lookahead = kv_lookahead(self.k_max, costs, self.block_size)
        if self.block_size is not None:
            kv_capacity = kv_capacity_blocks(kv_capacity, self.block_size)
        self.kv_capacity = kv_capacity
        self.rng = rng
        # The compiled loops need a rate model: replayed sequences depend on each row's
        # position, step by step, so they run per iteration. A policy that trims the drafts
        # (``engine_policies.py``) and one that observes each iteration where the kernel does
        # not carry its state (``window_terms``) run per iteration too: the kernels know neither.
        self.fast = (
            fast
            and not acceptance.needs_position
            and not (getattr(policy, "observes", False) and window_terms(policy) is None)
            and not getattr(policy, "trims", False)
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
        self._init_batch(cap)
        self.emitted_tokens = 0.0  # output tokens emitted so far (for steady-state windows)
        self.outstanding = 0
        self.idle_event = None
        self.decode_steps = 0
        self.last_decode_end = 0.0
        self._k_plus_1 = [np.float64(k + 1) for k in range(self.k_max + 1)]
        # Rate models draw for the occupied prefix of the batch (``draw_slots``); replayed
        # sequences need every row's position and draw over the whole arrays.
        self._by_slot = not acceptance.needs_position
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
