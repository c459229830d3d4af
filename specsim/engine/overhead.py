"""What an engine iteration costs beyond its forward passes (sampling, verification, rollback,
the serving loop's bookkeeping).

The simulator charges a step as target pass + k drafter passes + the profile's overhead.
``step_overhead`` measures, on this machine, one decode iteration as the serving loop runs it
(per-request random streams, the speculative step, reading the results back, appending each
row's emitted tokens) and the same forward passes alone (same shapes, same caches) in
interleaved rounds, and reports the difference: the part of an iteration a latency fit of bare
passes cannot see. The profiler fits the profile's overhead terms to it over batch and k.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from specsim.engine.batch import Batch
from specsim.engine.speed import sync
from specsim.engine.step import Sampling, StepUniforms, prefill_step, speculative_step
from specsim.models import DecoderModel


@dataclass(frozen=True)
class StepOverhead:
    batch: int
    k: int  # the window of a decode iteration; 0 for a prefill
    context: int  # cached tokens per row (decode), or the prompt length (prefill)
    step_s: float  # median of the engine's serving iteration (see step_overhead)
    passes_s: float  # median of the same forward passes alone
    overhead_s: float  # step - passes
    # ``consecutive`` serving iterations timed back to back after the rounds, as the serving
    # loop runs them (no bare passes in between): their spread around their median.
    samples_s: tuple[float, ...] = ()


@dataclass(frozen=True)
class _Timing:
    """How to time one run: on which device and clock, and the reference factor's inputs
    (``tokens``: what the target's pass feeds)."""

    device: torch.device
    clock: str
    normalise: Callable[[float], float] | None
    tokens: int

    def seconds(self, fn: Callable[[], object], reset: Callable[[], object]) -> float:
        reset()
        now = time.perf_counter if self.clock == "wall" else time.process_time
        # Read before the pass: a speed probe, when one is due, stays out of the timing.
        factor = self.normalise(self.tokens) if self.normalise is not None else 1.0
        sync(self.device)
        began = now()
        fn()
        sync(self.device)
        return (now() - began) * factor


def _interleaved(whole, passes, reset, timing: _Timing, repeats: int):
    """Two warm-up rounds, then ``repeats`` rounds timing ``whole`` and ``passes`` in turn
    (interleaved, so a change in the machine's speed hits both alike), each after ``reset``."""
    for _ in range(2):
        for fn in (whole, passes):
            reset()
            fn()
    rounds = [(timing.seconds(whole, reset), timing.seconds(passes, reset)) for _ in range(repeats)]
    reset()
    return [w for w, _ in rounds], [p for _, p in rounds]


def _back_to_back(whole, reset, timing: _Timing, count: int) -> list[float]:
    """``count`` runs of ``whole``, timed one after another (each after ``reset``)."""
    out = [timing.seconds(whole, reset) for _ in range(count)]
    reset()
    return out


def _result(batch, k, context, whole, passes, samples=()) -> StepOverhead:
    step, alone = float(np.median(whole)), float(np.median(passes))
    return StepOverhead(batch, k, context, step, alone, step - alone, tuple(samples))


@torch.inference_mode()
def step_overhead(
    target: DecoderModel,
    drafter: DecoderModel | None,
    batch: int,
    k: int,
    context: int,
    repeats: int = 15,
    sampling: Sampling | None = None,
    clock: str = "wall",
    normalise: Callable[[float], float] | None = None,
    consecutive: int = 0,
) -> StepOverhead:
    """Median decode-iteration and bare-pass times over ``repeats`` interleaved rounds
    (``clock``: ``wall`` or this process's ``cpu`` time; ``reference``: CPU time times
    ``normalise(tokens)``, see ``specsim.engine.speed``), then ``consecutive`` iterations back
    to back for their spread."""
    sampling = sampling or Sampling()
    max_len = context + k + 2
    state = Batch(target, drafter if k else None, batch, max_len)
    state.add([[1 + (i % 200) for i in range(context)]] * batch)
    rows = state.rows()
    lengths = rows.s_len.clone()
    ids = rows.seq[:, :context]
    target(ids[:, :-1], rows.target_cache, lengths - 1)
    if rows.draft_cache is not None:
        drafter(ids[:, :-1], rows.draft_cache, lengths - 1)
    base_t = rows.target_cache.lengths.clone()
    base_d = None if rows.draft_cache is None else rows.draft_cache.lengths.clone()
    window = torch.zeros((batch, k + 1), dtype=torch.long, device=target.device)
    one = torch.zeros((batch, 1), dtype=torch.long, device=target.device)

    base_len = state.s_len.clone()
    streams = [torch.Generator().manual_seed(row) for row in range(batch)]  # one per request

    def reset():
        rows.target_cache.rollback(base_t)
        if base_d is not None:
            rows.draft_cache.rollback(base_d)
        state.s_len.copy_(base_len)

    def whole_step():
        # As ServingEngine._decode_iteration: window bookkeeping, per-row uniforms, the step,
        # the results read back to the host and each row's emitted tokens appended.
        owed = torch.tensor([10_000] * batch, dtype=torch.long)
        drafts = torch.clamp(torch.minimum(owed - 1, torch.full_like(owed, k)), min=0)
        lengths = state.target_cache.lengths[:batch].cpu()
        new = drafts + 1
        _pairs = float((new * lengths).sum()) + float((new * (new + 1)).sum()) / 2
        result = speculative_step(
            target,
            drafter if k else None,
            rows,
            drafts,
            sampling,
            StepUniforms.per_row(streams, k),
        )
        tokens = result.tokens.tolist()
        accepted = result.accepted.tolist()
        logprob = result.logprob.tolist()
        for slot in range(batch):
            kept = accepted[slot] + 1
            state.append(slot, tokens[slot][:kept])
            _logprob_sum = sum(logprob[slot][:kept])

    def passes_only():
        for _ in range(k):
            drafter(one, rows.draft_cache)
        target(window, rows.target_cache)

    timing = _Timing(target.device, clock, normalise, batch * (k + 1))
    whole, passes = _interleaved(whole_step, passes_only, reset, timing, repeats)
    samples = _back_to_back(whole_step, reset, timing, consecutive)
    return _result(batch, k, context, whole, passes, samples)


@torch.inference_mode()
def prefill_overhead(
    target: DecoderModel,
    drafter: DecoderModel | None,
    batch: int,
    prompt: int,
    repeats: int = 15,
    sampling: Sampling | None = None,
    clock: str = "wall",
    normalise: Callable[[float], float] | None = None,
    consecutive: int = 0,
) -> StepOverhead:
    """As ``step_overhead`` for a prefill iteration of ``batch`` prompts of ``prompt`` tokens:
    the serving loop's (the prompts put into free slots, per-request streams, both models'
    passes, the first token sampled and read back) against the two prompt passes alone."""
    sampling = sampling or Sampling()
    state = Batch(target, drafter, batch, prompt + 1)
    prompts = [[1 + (i + row) % 200 for i in range(prompt)] for row in range(batch)]
    state.add(prompts)
    rows = state.rows()
    lengths = rows.s_len.clone()
    ids = rows.seq[:, :prompt]

    def reset():
        state.size = 0
        rows.target_cache.reset()
        if rows.draft_cache is not None:
            rows.draft_cache.reset()

    def whole_iteration():
        # As ServingEngine._prefill_iteration.
        first, stop = state.add(prompts)
        view = state.rows(first, stop)
        streams = [torch.Generator().manual_seed(row) for row in range(batch)]
        uniforms = torch.stack([torch.rand(1, generator=g, dtype=torch.float64) for g in streams])
        result = prefill_step(target, drafter, view, sampling, uniforms[:, 0])
        result.tokens.tolist()
        result.logprob.tolist()

    def passes_only():
        target(ids, rows.target_cache, lengths)
        if drafter is not None:
            drafter(ids, rows.draft_cache, lengths)

    timing = _Timing(target.device, clock, normalise, batch * prompt)
    whole, passes = _interleaved(whole_iteration, passes_only, reset, timing, repeats)
    samples = _back_to_back(whole_iteration, reset, timing, consecutive)
    return _result(batch, 0, prompt, whole, passes, samples)
