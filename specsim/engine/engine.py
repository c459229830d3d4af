"""The real serving engine: continuous batching with speculative decoding, in wall-clock time.

One loop, one iteration at a time, the same schedule as the simulator's replica with
``chunked_prefill: false`` (so the two can be compared):

1. release requests whose arrival time has passed into the FCFS queue (sleep when idle);
2. admit from the head of the queue while the batch has room;
3. if admitted prompts wait, run a prefill iteration over as many of them as the token budget
   holds (the first always): one target pass and one drafter pass over the prompts, and the first
   token sampled from the target; that token is the request's first token (TTFT);
4. otherwise run one speculative step over every live row (``step.speculative_step``) with the
   window the policy picks and ``min(k, tokens still owed - 1)`` drafts per row, then retire rows
   that reached their output length (or EOS, unless ``ignore_eos``). With a tree
   (``EngineOptions.tree``) the step is a tree step (``tree_step.tree_step``): every row drafts
   and verifies the whole tree, keeps its accepted path's KV and emits at most the tokens it
   owes; its window (k, the logged drafts) is the tree's depth cut as a chain's would be, so
   the records and statistics count what the simulator counts.

Timestamps are seconds since the run started, taken at the end of each iteration, its
bookkeeping (emitted tokens appended, finished rows retired) included, as the simulator's
``env.now``; busy iterations follow one another without gaps. Only one replica; preemption never
happens (the cache is preallocated for ``max_batch`` full-length rows).
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from specsim.drafters import PromptLookup
from specsim.engine.batch import Batch
from specsim.engine.clock import MeteredModel
from specsim.engine.engine_steps import chain_step, check_tree_engine, engine_tree_step
from specsim.engine.iteration_log import IterationLog
from specsim.engine.step import Faults, Sampling, prefill_step
from specsim.engine.tree_step import TreeFaults
from specsim.engine.workload import EngineRequest, PromptBank
from specsim.errors import SpecsimError
from specsim.models import DecoderModel
from specsim.tree import TreeShape


@dataclass
class EngineOptions:
    max_batch: int = 8
    max_batched_tokens: int = 8192
    sampling: Sampling = field(default_factory=Sampling)
    window: Callable[[int], int] = lambda rows: 0
    k_max: int = 0
    ngram: int | None = None  # prompt-lookup n-gram size when the drafter is prompt lookup
    ignore_eos: bool = True
    eos_id: int | None = None
    seed: int = 0
    faults: Faults = field(default_factory=Faults)
    tree: TreeShape | None = None  # tree steps of this shape instead of chains (k_max: its depth)
    tree_drafts: str = "top-k"  # how the tree's children are drafted (tree_step.TREE_DRAFTS)
    tree_faults: TreeFaults = field(default_factory=TreeFaults)


class ServingEngine:
    """Serve requests on a target (and drafter) with continuous batching, in real time."""

    def __init__(
        self,
        target: DecoderModel,
        drafter: DecoderModel | None,
        prompts: PromptBank,
        options: EngineOptions,
        clock: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], None] = time.sleep,
        mark: Callable[..., None] | None = None,
        split: dict[str, float] | None = None,
    ):
        # With a CPU clock every pass marks its start and end on it (the reference clock
        # weighs each pass by its model and width), and the clock keeps the time ``split`` by
        # role (cumulative seconds, read at each iteration's ends for the log).
        if mark is not None:
            target = MeteredModel(target, "target", mark)
            drafter = None if drafter is None else MeteredModel(drafter, "drafter", mark)
        self.target, self.drafter = target, drafter
        self.split = split
        self.prompts = prompts
        self.opt = options
        self.clock = clock
        self.sleep = sleep
        # Told how many requests finished, at each iteration that finishes some. A tqdm bar
        # redraws at most every 0.1 s: well under 0.1 % of the engine's time.
        self.progress = None
        self.max_len = min(
            target.config.max_position,
            drafter.config.max_position if drafter is not None else target.config.max_position,
        )
        tree = options.tree
        if tree is not None:
            check_tree_engine(options, drafter)
        # The slots a step lays out past the sequence before its rollback.
        self.lookahead = tree.num_nodes if tree is not None else options.k_max

    # ---- the loop ----------------------------------------------------------------------------
    def run(self, requests: list[EngineRequest] | None = None, clients=None) -> list[EngineRequest]:
        """Serve an open-loop list of requests, or closed-loop ``clients`` (a workload source
        with ``concurrency``, ``may_issue``, ``next_lengths`` and ``think_time``)."""
        self.batch = Batch(self.target, self.drafter, self.opt.max_batch, self.max_len)
        self.live: list[EngineRequest] = []
        self.streams: list[torch.Generator] = []  # per live row: its request's random stream
        self.lookups: list[PromptLookup | None] = []
        self.log = IterationLog()
        self.done: list[EngineRequest] = []
        self.clients = clients
        self.issued = 0
        self.pending: list[tuple[float, int, EngineRequest]] = []
        for request in requests or []:
            self._enqueue(request)
        self.waiting: deque[EngineRequest] = deque()
        self.prefilling: list[EngineRequest] = []
        self.warm_up()
        self.t0 = self.clock()
        if clients is not None:
            for client in range(clients.concurrency):
                self._issue(client, 0.0)
        with torch.inference_mode():
            # Busy iterations tile the time: each starts where the last one ended, so the log
            # accounts for all of it, the bookkeeping after each step included (which a
            # profile fitted to the log then charges, as it charges the step).
            start = self._now()
            while self.pending or self.waiting or self.prefilling or self.batch.size:
                self._split_at_start = dict(self.split) if self.split is not None else None
                self._release(start)
                if not (self.waiting or self.prefilling or self.batch.size):
                    self.sleep(max(0.0, self.pending[0][0] - start))
                    start = self._now()
                    continue
                self._admit(start)
                if self.prefilling:
                    start = self._prefill_iteration(start)
                else:
                    start = self._decode_iteration(start)
        self.done.sort(key=lambda r: r.rid)
        return self.done

    def warm_up(self) -> None:
        """A few passes through the serving path before the clock starts, as a server warms up
        before taking traffic (first calls pay for allocations and lazy initialisation)."""
        from specsim.engine.generate import generate

        rows = min(2, self.opt.max_batch)
        prompt = self.prompts.prompt(0, 16)
        k = self.opt.k_max if self.drafter is not None else 0
        seed = self.opt.seed + 1  # its own stream: the served requests' draws do not move
        generate(
            self.target,
            self.drafter,
            [prompt] * rows,
            3,
            k,
            self.opt.sampling,
            seed,
            tree=self.opt.tree,
            tree_drafts=self.opt.tree_drafts,
        )

    def _stream(self, rid: int) -> torch.Generator:
        """Request ``rid``'s own random stream: its tokens depend on the seed and its id, not
        on which requests it shared a batch with (up to batched floating-point rounding)."""
        seed = np.random.SeedSequence([self.opt.seed, rid]).generate_state(1, np.uint64)[0]
        return torch.Generator().manual_seed(int(seed))

    def _now(self) -> float:
        return self.clock() - self.t0

    def _enqueue(self, request: EngineRequest) -> None:
        need = request.prompt_len + request.output_len + self.lookahead + 1
        if need > self.max_len:
            raise SpecsimError(
                f"request {request.rid} needs {need} tokens (prompt {request.prompt_len} + "
                f"output {request.output_len} + lookahead) but the models hold {self.max_len}",
                key="workload",
                fix="cap workload.prompt and workload.output lengths for the real engine",
            )
        request.prompt_ids = self.prompts.prompt(request.rid, request.prompt_len)
        heapq.heappush(self.pending, (request.arrival, request.rid, request))

    def _issue(self, client: int, at: float) -> None:
        """A closed-loop client sends its next request at time ``at``."""
        if not self.clients.may_issue(at):
            return
        prompt, output = self.clients.next_lengths()
        self._enqueue(EngineRequest(self.issued, at, int(prompt), int(output), client))
        self.issued += 1

    def _release(self, now: float) -> None:
        while self.pending and self.pending[0][0] <= now:
            self.waiting.append(heapq.heappop(self.pending)[2])

    def _admit(self, now: float) -> None:
        while self.waiting and self.batch.size + len(self.prefilling) < self.opt.max_batch:
            request = self.waiting.popleft()
            request.scheduled = now
            self.prefilling.append(request)

    # ---- prefill -----------------------------------------------------------------------------
    def _prefill_iteration(self, start: float) -> float:
        """Returns the time the iteration ended."""
        chosen, tokens = [], 0
        for request in self.prefilling:
            if chosen and tokens + request.prompt_len > self.opt.max_batched_tokens:
                break
            chosen.append(request)
            tokens += request.prompt_len
        self.prefilling = self.prefilling[len(chosen) :]
        first, stop = self.batch.add([r.prompt_ids for r in chosen])
        rows = self.batch.rows(first, stop)
        lengths = rows.s_len.clone()
        # The pass feeds every prompt at the longest one's length (a padded batch): that is the
        # work it does, and what a padded-attention simulation charges.
        longest = int(lengths.max())
        pass_shape = (len(chosen) * longest, 0, len(chosen) * longest * (longest + 1) / 2)
        streams = [self._stream(r.rid) for r in chosen]
        uniforms = torch.stack([torch.rand(1, generator=g, dtype=torch.float64) for g in streams])
        result = prefill_step(
            self.target, self.drafter, rows, self.opt.sampling, uniforms[:, 0], self.opt.faults
        )
        new_tokens = result.tokens.tolist()  # on a GPU this waits for the work
        logprobs = result.logprob.tolist()
        finished = []
        for i, request in enumerate(chosen):
            slot = first + i
            self.live.append(request)
            self.streams.append(streams[i])
            self.lookups.append(
                None if self.opt.ngram is None else PromptLookup(self.opt.ngram, request.prompt_ids)
            )
            self._emit(slot, request, [new_tokens[i]], [logprobs[i]])
            if self._is_done(request):
                finished.append(slot)
        kv_tokens = self._kv_tokens()
        retired = self._retire(finished)
        now = self._now()
        self.log.add(now - start, len(chosen), "prefill", 0, pass_shape, kv_tokens, self._passes())
        for request in chosen:
            request.first_token = request.last_emit = now
        self._finish(retired, now)
        return now

    # ---- decode ------------------------------------------------------------------------------
    def _decode_iteration(self, start: float) -> float:
        """Returns the time the iteration ended."""
        size = self.batch.size
        owed = torch.tensor([r.output_len - r.generated for r in self.live], dtype=torch.long)
        step = chain_step if self.opt.tree is None else engine_tree_step
        k, n_drafts, pass_shape, result = step(self, owed)
        tokens = result.tokens.tolist()  # on a GPU these wait for the step to finish
        accepted = result.accepted.tolist()
        logprob = result.logprob.tolist()
        drafted = n_drafts.tolist()
        self.log.accepted.append(np.asarray(accepted))
        self.log.drafted.append(np.asarray(drafted))
        self.log.decode_rows += size
        self.log.window_rows += k * size
        finished = []
        stepped = list(self.live)
        for slot, request in enumerate(stepped):
            emitted = tokens[slot][: accepted[slot] + 1]
            request.steps += 1
            request.drafted += drafted[slot]
            kept = self._emit(slot, request, emitted, logprob[slot])
            request.accepted += min(accepted[slot], kept - 1)
            if self._is_done(request):
                finished.append(slot)
        kv_tokens = self._kv_tokens()
        retired = self._retire(finished)
        now = self._now()
        self.log.add(now - start, size, "decode", k, pass_shape, kv_tokens, self._passes())
        for request in stepped:
            self.log.itl.append(now - request.last_emit)
            request.last_emit = now
        self._finish(retired, now)
        return now

    # ---- bookkeeping -------------------------------------------------------------------------
    def _emit(
        self, slot: int, request: EngineRequest, tokens: list[int], logprobs: list[float]
    ) -> int:
        """Append emitted tokens (cut after EOS unless ignored); returns how many were kept.
        ``logprobs[i]`` is the target's raw log-probability of ``tokens[i]``."""
        eos = self.opt.eos_id
        if not self.opt.ignore_eos and eos is not None and eos in tokens:
            tokens = tokens[: tokens.index(eos) + 1]
            request.eos = True
        self.batch.append(slot, tokens)
        request.output_ids.extend(tokens)
        if self.lookups[slot] is not None:
            self.lookups[slot].extend(tokens)
        request.generated += len(tokens)
        request.logprob_sum += sum(logprobs[: len(tokens)])
        return len(tokens)

    def _is_done(self, request: EngineRequest) -> bool:
        return request.eos or request.generated >= request.output_len

    def _retire(self, slots: list[int]) -> list[EngineRequest]:
        """Free the finished rows' slots; returns their requests (``_finish`` stamps them)."""
        retired = []
        for slot in sorted(slots, reverse=True):
            retired.append(self.live[slot])
            moved = self.batch.remove(slot)
            if moved is not None:
                self.live[slot] = self.live[moved]
                self.lookups[slot] = self.lookups[moved]
                self.streams[slot] = self.streams[moved]
            self.live.pop()
            self.lookups.pop()
            self.streams.pop()
        return retired

    def _finish(self, retired: list[EngineRequest], now: float) -> None:
        """Retired requests finish at the end of their last iteration; a closed-loop client
        then thinks before its next request."""
        for request in retired:
            request.finish = now
            self.done.append(request)
            if self.clients is not None and request.client >= 0:
                self._issue(request.client, now + self.clients.think_time())
        if retired and self.progress is not None:
            self.progress.update(len(retired))

    def _kv_tokens(self) -> int:
        """Target cache tokens held by the live rows (at an iteration's end, before any row
        retires: its peak)."""
        return int(self.batch.target_cache.lengths[: self.batch.size].sum())

    def _passes(self) -> tuple[float, float] | None:
        """The iteration's seconds in the target's and the drafter's passes (CPU clocks)."""
        if self.split is None:
            return None
        began = self._split_at_start
        return self.split["target"] - began["target"], self.split["drafter"] - began["drafter"]
