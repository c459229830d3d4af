"""What a speculative step costs beyond its forward passes (sampling, verification, rollback).

The simulator charges a step as target pass + k drafter passes + the profile's per-step
overhead. ``step_overhead`` measures, on this machine, the engine's whole step and the same
forward passes alone (same shapes, same caches) in interleaved rounds, and reports the
difference: the part of a step a latency fit of bare passes cannot see.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from specsim.engine.batch import Batch
from specsim.engine.step import Sampling, StepUniforms, speculative_step
from specsim.models import DecoderModel


@dataclass(frozen=True)
class StepOverhead:
    batch: int
    k: int
    context: int
    step_s: float  # median of the engine's whole step
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
) -> StepOverhead:
    """Median step and bare-pass times over ``repeats`` interleaved rounds (``clock``: ``wall``
    or this process's ``cpu`` time)."""
    now = time.process_time if clock == "cpu" else time.perf_counter
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
    n_drafts = torch.full((batch,), k, dtype=torch.long)
    generator = torch.Generator().manual_seed(0)
    window = torch.zeros((batch, k + 1), dtype=torch.long, device=target.device)
    one = torch.zeros((batch, 1), dtype=torch.long, device=target.device)

    def reset():
        rows.target_cache.rollback(base_t)
        if base_d is not None:
            rows.draft_cache.rollback(base_d)

    def whole_step():
        speculative_step(
            target,
            drafter if k else None,
            rows,
            n_drafts,
            sampling,
            StepUniforms.draw(generator, batch, k),
        )

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
            _sync(target.device)
            began = now()
            fn()
            _sync(target.device)
            out.append(now() - began)
    reset()
    step = float(np.median(timings[whole_step]))
    passes = float(np.median(timings[passes_only]))
    return StepOverhead(batch, k, context, step, passes, step - passes)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
