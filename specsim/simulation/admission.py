"""A replica's waiting queue and its prompts in prefill: admission, preemption and chunking.

- Admission: waiting requests join FCFS while the batch has room and the KV cache can hold the
  prompt plus k + 1 lookahead slots (head-of-line blocking, as vLLM does); with chunked prefill
  no more join once a token budget's worth of prompt tokens is pending.
- Preemption: while the cache cannot hold the running sequences' next step, the most recently
  admitted one goes back to the head of the queue (its KV is dropped; it later recomputes its
  prompt and the tokens it had generated).
- Chunking: which prompt tokens ride in the next iteration, in queue order, within the token
  budget (whole prompts in iterations of their own, without chunked prefill).
- Prefix caching: an admitted request starts prefill past its cached prefix (``prefilled`` =
  the hit), so chunking and cost see only the uncached tokens, while its reservation holds the
  whole prompt. The hit is at most the prompt less one token (vLLM recomputes the last one for
  its logits: ``max_cache_hit_length = num_tokens - 1`` in vllm/v1/core/kv_cache_manager.py) and
  whole blocks only; a preempted request is readmitted with the same hit, its own generated
  tokens recomputed.
- Shared prefixes (a ``system_prompt`` source): as vLLM's reference-counted blocks, one physical
  copy per replica, counted once while any admitted sequence holds it (``SharedPrefix``), so an
  admission needs only what the others do not hold; unreferenced, it is a free cached block. A
  session's remembered turn, once hit, is its sequence's until that sequence is preempted.
- KV blocks (``engine.block_size``): capacity, reservations and use are counted in blocks, each
  sequence holding cdiv(its tokens + lookahead, block_size), as vLLM's ``allocate_slots`` asks
  for cdiv(num_computed + num_new + num_lookahead_tokens, block_size)
  (vllm/v1/core/kv_cache_manager.py, vllm/v1/core/single_type_kv_cache_manager.py). The replica
  gives the lookahead: the k + 1 positions a step verifies (vLLM's num_new for a decoding row:
  the last sampled token and k drafts), and with a draft model k more (num_lookahead_tokens).

The running batch itself (the decoding rows) is the replica's; the calls that need it take
what they read of it.
"""

from __future__ import annotations

from collections import deque
from typing import Protocol

import numpy as np

from specsim.costs import PassTotals
from specsim.costs.kv_cache import blocks_for
from specsim.errors import SpecsimError
from specsim.scenario import Engine
from specsim.simulation.request import Request
from specsim.workload.prefix import NoPrefix

Chunks = list[tuple[Request, float]]  # (request, prompt tokens it runs this iteration)


FITS_FIX = (
    "cap the lengths, or give the engine more memory (engine.memory_utilisation, "
    "engine.kv_capacity_tokens, a larger device in the profile)"
)


def verify_lookahead(k_max: int, tree_rows) -> int:
    """Positions a step verifies past a sequence's tokens: k + 1, or a tree's nodes."""
    return k_max + 1 if tree_rows is None else int(tree_rows.verified[-1])


def kv_lookahead(k_max: int, costs, block_size: int | None) -> int:
    """KV slots each sequence holds beyond its tokens: the verified positions and, with KV
    blocks, the k of a drafter with a KV cache of its own (vLLM's v1 scheduler allocates
    num_lookahead_tokens = k slots for a proposer that writes KV of its own: draft models,
    EAGLE-type and parallel drafters; not n-gram or Medusa; vllm/v1/core/sched/scheduler.py,
    into KVCacheManager.allocate_slots). specsim's heads keep no cache of their own."""
    slots = verify_lookahead(k_max, costs.tree_rows)
    passes = costs.drafter.passes
    if block_size is not None and costs.tree_rows is None and passes and passes.own_cache:
        slots += k_max
    return slots


def never_fits(
    prompt: int, output: int, lookahead: int, kv_capacity: int, block_size: int | None
) -> str | None:
    """Why a request of these lengths can never be admitted (None: it can): its whole
    sequence and the lookahead need more of the cache (tokens, or blocks with a block size)
    than a replica holds."""
    tokens = prompt + output + lookahead
    need = tokens if block_size is None else float(blocks_for(int(tokens), block_size))
    if need <= kv_capacity:
        return None
    unit = "tokens" if block_size is None else f"blocks of {block_size}"
    return (
        f"needs {need:.0f} KV-cache {unit} (prompt {prompt} + output {output} + lookahead) "
        f"but a replica holds {kv_capacity}"
    )


def fitting(prompts, outputs, lookahead: int, kv_capacity: float, block_size=None) -> int:
    """How many of these requests, in order, come before the first that ``never_fits``."""
    need = prompts + outputs + lookahead
    too_long = (need if block_size is None else -(-need // block_size)) > kv_capacity
    return int(too_long.argmax()) if too_long.any() else int(too_long.shape[0])


class SharedPrefix:
    """The holders of one shared prefix (a system prompt) on one replica: each holds the
    prompt's first ``size`` tokens (blocks, with a block size). Hits of different sizes (short
    prompts capped at their length less one) are prefixes of one sequence, so the physical
    copy is the largest held; the cache's per-sequence sum overcounts it by ``savings``."""

    def __init__(self):
        self.holders: dict[int, int] = {}  # request number -> size held
        self.total = 0  # sum of the sizes held
        self.top = 0  # the largest size held: the physical copy

    @property
    def savings(self) -> int:
        """What the per-sequence sum counts beyond the one physical copy."""
        return self.total - self.top

    def overlap(self, size: int) -> int:
        """Of a new holder's ``size``, what is already held (its admission needs the rest)."""
        return min(size, self.top)

    def hold(self, rid: int, size: int) -> None:
        self.holders[rid] = size
        self.total += size
        self.top = max(self.top, size)

    def release(self, rid: int) -> None:
        size = self.holders.pop(rid, 0)
        if not size:
            return
        self.total -= size
        if size == self.top:
            self.top = max(self.holders.values(), default=0)


class RunningBatch(Protocol):
    """What preemption needs of the replica's decoding rows."""

    decoding: int  # rows decoding
    decode_kv: float  # KV-cache tokens they hold

    def decode_blocks(self) -> float:
        """KV-cache blocks they hold, lookahead included (with ``engine.block_size`` only)."""
        ...

    def evict_youngest(self) -> Request:
        """Take the most recently admitted decoding row out of the batch."""
        ...


class Admission:
    """The queue, the prompts being prefilled and the KV cache they have reserved."""

    def __init__(
        self,
        engine: Engine,
        lookahead: int,
        kv_capacity: int,
        acceptance,
        rng: np.random.Generator,
        prefix=None,
    ):
        self.chunked = engine.chunked_prefill
        self.token_budget = engine.max_batched_tokens
        self.max_batch = engine.max_batch
        self.lookahead = lookahead
        self.block_size = engine.block_size
        self.kv_capacity = kv_capacity  # in blocks with a block size, else in tokens
        self.prefix = NoPrefix() if prefix is None else prefix  # ``specsim.workload.prefix``
        self.prefix_queried = 0  # prompt tokens looked up in the cache, every admission
        self.prefix_hits = 0  # of those, cached
        self.prefill_computed = 0.0  # prompt tokens run through prefill (recomputation too)
        self.acceptance = acceptance
        self.rng = rng  # the replica's stream (acceptance levels are drawn from it too)
        self.queue: deque[Request] = deque()
        self.prefilling: list[Request] = []  # admitted, prompt not yet through, in order
        self.reserved = 0.0  # KV-cache tokens (blocks) reserved for the prompts in prefill
        self.pending = 0.0  # prompt tokens admitted but not yet processed
        self.admissions = 0
        self._levels: list[int] = []
        # Only a source whose hits are one shared sequence shares blocks between sequences.
        self.shared = SharedPrefix() if getattr(self.prefix, "shared", False) else None

    def slots(self, tokens: float) -> float:
        """The cache ``tokens`` slots take: themselves, or whole blocks with a block size."""
        if self.block_size is None:
            return tokens
        return float(blocks_for(int(tokens), self.block_size))

    def reservation(self, request: Request) -> float:
        """What an admitted prompt holds while in prefill: its tokens and the lookahead."""
        return self.slots(request.prefill_target + self.lookahead)

    def check_fits(self, request: Request) -> None:
        why = never_fits(
            request.prompt, self.output_held(request), self.lookahead, self.kv_capacity,
            self.block_size,
        )  # fmt: skip
        if why is not None:
            raise SpecsimError(f"request {request.rid} {why}", key="workload", fix=FITS_FIX)

    def output_held(self, request: Request) -> int:
        """The output tokens whose KV this replica holds for ``request`` (all of them)."""
        return request.output

    def kv_in_use(self, decoding: int, decode_kv: float) -> float:
        """KV-cache tokens held: the decoding rows' context and lookahead, and the prompts'
        reservations. With a block size, ``decode_kv`` is the rows' blocks, lookahead included,
        and so is the answer. A shared prefix counts once."""
        if self.block_size is not None:
            used = decode_kv + self.reserved
        else:
            used = decode_kv + decoding * self.lookahead + self.reserved
        if self.shared is not None:
            used -= self.shared.savings
        return used

    def _held(self, batch: RunningBatch) -> float:
        return batch.decode_kv if self.block_size is None else batch.decode_blocks()

    def capped_hit(self, request: Request) -> int:
        """The request's hit as the engine takes it: at most the prompt less one, whole blocks."""
        hit = min(self.prefix.cached(request), request.prompt - 1)
        if self.block_size is not None:
            hit -= hit % self.block_size
        return hit

    def hits(self, rids: np.ndarray, prompts: np.ndarray) -> np.ndarray:
        """``capped_hit`` of the requests numbered ``rids`` (``prefix.by_request`` only)."""
        hits = np.minimum(self.prefix.cached_many(rids, prompts), prompts - 1).astype(np.float64)
        return hits if self.block_size is None else hits - hits % self.block_size

    def _shared_size(self, request: Request) -> int:
        """The cache a shared-prefix hit holds: its tokens, or blocks with a block size (whole
        blocks, so cdiv(tokens + lookahead) splits into these and the sequence's own)."""
        return self.capped_hit(request) // (self.block_size or 1)

    def _cached(self, request: Request, used: float) -> int:
        """The request's prefix-cache hit in tokens (counted in the hit-rate totals); ``used``:
        the cache held before it, whose free rest is all that remembered prefixes may keep."""
        self.prefix.trim((self.kv_capacity - used) * (self.block_size or 1))
        hit = self.capped_hit(request)
        self.prefix_queried += request.prefill_target
        self.prefix_hits += hit
        return hit

    # ---- admission and preemption ----------------------------------------------------------
    def _next_level(self, request: Request) -> int:
        """The next request's acceptance level, drawn in chunks from the replica's stream (a
        rate model moves it to the shifted rates past the workload's shift)."""
        if not self._levels:
            self._levels = self.acceptance.assign_levels(self.rng, 4096)[::-1].tolist()
        level = self._levels.pop()
        if getattr(self.acceptance, "shift", None) is None:
            return level
        return self.acceptance.request_level(level, request.rid, request.arrival)

    def admit(self, now: float, decoding: int, decode_kv: float) -> None:
        queue = self.queue
        running = decoding + len(self.prefilling)
        if not queue or running >= self.max_batch:
            return
        used = self.kv_in_use(decoding, decode_kv)
        while queue and running < self.max_batch:
            request = queue[0]
            joins = self.joins(request)
            if not joins and self.chunked and self.pending >= self.token_budget:
                break
            need = self.reservation(request)
            if self.shared is not None and not joins:
                need -= self.shared.overlap(self._shared_size(request))
            if used + need > self.kv_capacity:
                break
            queue.popleft()
            request.admit_order = self.admissions
            self.admissions += 1
            if joins:
                self.join(request)
            else:
                self._start_prefill(request, now, used)
            used += need
            running += 1

    def joins(self, request: Request) -> bool:
        """Whether an admitted request joins the decoding batch at once, its prompt's KV cache
        already in place (a disaggregated decode replica's transfers); here never."""
        return False

    def join(self, request: Request) -> None:
        """Put a request that ``joins`` into the decoding batch (with ``joins`` only)."""
        raise NotImplementedError

    def _start_prefill(self, request: Request, now: float, used: float) -> None:
        if request.scheduled < 0:
            request.scheduled = now
            request.level = self._next_level(request)
        request.prefilled = self._cached(request, used)
        if self.shared is not None and request.prefilled:
            self.shared.hold(request.rid, request.prefilled // (self.block_size or 1))
        self.prefilling.append(request)
        self.reserved += self.reservation(request)
        self.pending += request.prefill_target - request.prefilled

    def make_room(self, batch: RunningBatch) -> None:
        """Preempt the youngest sequences until the cache holds the batch's next step."""
        while self.kv_in_use(batch.decoding, self._held(batch)) > self.kv_capacity:
            if batch.decoding + len(self.prefilling) <= 1:
                raise SpecsimError(
                    "one sequence outgrew the whole KV cache", key="engine", fix="add memory"
                )
            # Prompts in prefill were admitted after every decoding row: they go first.
            if self.prefilling:
                request = self.prefilling.pop()
                self.reserved -= self.reservation(request)
                self.pending -= request.prefill_target - request.prefilled
            else:
                request = batch.evict_youngest()
            self.release(request)
            request.prefilled = 0
            request.preemptions += 1
            self.queue.appendleft(request)

    def release(self, request: Request) -> None:
        """A sequence leaves the cache unfinished (preempted): its references to shared prefix
        blocks go, and a remembered turn it hit is the memory's again."""
        if self.shared is not None:
            self.shared.release(request.rid)
        self.prefix.released(request)

    def finished(self, request: Request) -> None:
        """A request leaves the replica done: its references go, and its prefix source learns
        of it (a session's memory keeps the turn)."""
        if self.shared is not None:
            self.shared.release(request.rid)
        self.prefix.finished(request)

    # ---- chunking ----------------------------------------------------------------------------
    def whole_prompts(self) -> tuple[Chunks, PassTotals]:
        """The prompts of an iteration without chunked prefill: whole ones, in order, within the
        token budget (the first always), and their totals."""
        return self.chunks(self.token_budget, whole=True)

    def chunks(self, budget: float, whole: bool = False) -> tuple[Chunks, PassTotals]:
        """Prompt chunks for what the decoding rows leave of the token budget (chunked
        prefill), or ``whole`` prompts within it, and their totals."""
        chunks = []
        tokens = kv = pairs = 0.0
        left = budget
        for request in self.prefilling:
            chunk = request.prefill_target - request.prefilled
            if (chunks and tokens + chunk > budget) if whole else left <= 0:
                break
            if not whole:
                chunk = min(chunk, left)
                left -= chunk
            chunks.append((request, chunk))
            tokens += chunk
            kv += request.prefilled
            pairs += chunk * (request.prefilled + (chunk + 1) / 2.0)
        return chunks, PassTotals(len(chunks), tokens, kv, pairs)

    def chunk_totals(self, budget: float) -> PassTotals:
        """The totals of the prompt chunks a budget would admit (for the window policy)."""
        return self.chunks(budget)[1]

    @staticmethod
    def completing(chunks: Chunks) -> int:
        """How many requests ``chunks`` take through their prompt (``complete``'s rule)."""
        return sum(
            1 for request, chunk in chunks if request.prefilled + chunk >= request.prefill_target
        )

    def complete(self, chunks: Chunks, now: float) -> list[Request]:
        """Count the chunks as run; the requests whose prompt is now through leave prefill
        (their first token sampled, their reservation released) and are returned in order."""
        done = []
        for request, chunk in chunks:
            request.prefilled += chunk
            self.pending -= chunk
            self.prefill_computed += chunk
            if request.prefilled >= request.prefill_target:
                done.append(request)
        if not done:
            return done
        # Chunks go out in queue order and only the last can be partial: done is a prefix.
        del self.prefilling[: len(done)]
        for request in done:
            self.reserved -= self.reservation(request)
            if request.first_token < 0:
                request.first_token = now
            request.generated += 1  # the prefill pass samples the next token
        return done


def prefix_summary(admissions: list[Admission]) -> dict[str, float]:
    """summary.json's ``prefix_cache``: vLLM's prefix-cache hit rate (hit tokens over queried
    tokens, every admission counted) and the prompt tokens prefill computed and skipped."""
    queried = sum(a.prefix_queried for a in admissions)
    hits = sum(a.prefix_hits for a in admissions)
    return {
        "hit_rate_tokens": hits / queried if queried else 0.0,
        "queried_tokens": queried,
        "cached_tokens": hits,
        "prefill_tokens_computed": int(sum(a.prefill_computed for a in admissions)),
    }
