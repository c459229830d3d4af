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
from specsim.engine.step import Sampling, StepUniforms, speculative_step
from specsim.models import DecoderModel


@dataclass(frozen=True)
class StepOverhead:
    batch: int
    k: int
    context: int
    step_s: float  # median of the engine's serving iteration (see step_overhead)
    passes_s: float  # median of the same forward passes alone
    overhead_s: float  # step - passes


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
    normalise: Callable[[], float] | None = None,
) -> StepOverhead:
    """Median step and bare-pass times over ``repeats`` interleaved rounds (``clock``: ``wall``
    or this process's ``cpu`` time; ``reference``: CPU time times ``normalise()``, see
    ``specsim.engine.speed``)."""
    now = time.perf_counter if clock == "wall" else time.process_time
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

    timings = {whole_step: [], passes_only: []}
    for _ in range(2):  # warm-up
        for fn in timings:
            reset()
            fn()
    for _ in range(repeats):
        for fn, out in timings.items():
            reset()
            factor = normalise() if normalise is not None else 1.0
            sync(target.device)
            began = now()
            fn()
            sync(target.device)
            out.append((now() - began) * factor)
    reset()
    step = float(np.median(timings[whole_step]))
    passes = float(np.median(timings[passes_only]))
    return StepOverhead(batch, k, context, step, passes, step - passes)
