"""The real serving loop on fixed-batch waves: what an engine iteration costs beyond its forward
passes (sampling, verification, rollback, the serving loop's bookkeeping).

The simulator charges a step as target pass + k drafter passes + the profile's overhead.
``serve_fixed_batch`` runs the real ``ServingEngine`` on waves of identical requests at one
batch size and window and returns its iteration log: every prefill and decode iteration as the
loop runs it (ragged contexts, padded attention, retirements, per-request streams, the drafter's
passes cache-cold after the target's). The profiler compares each iteration with what the latency
fits predict for its passes and fits the profile's overhead terms to the difference
(``specsim.profiling.overhead``). ``step_overhead`` is a diagnostic: one decode iteration against
the same forward passes alone, in interleaved rounds.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from specsim.engine.batch import Batch
from specsim.engine.clock import sync
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
    normalise: Callable[..., float] | None = None,
) -> StepOverhead:
    """Median decode-iteration and bare-pass times over ``repeats`` interleaved rounds
    (``clock``: ``wall`` or this process's ``cpu`` time; ``reference``: CPU time times
    ``normalise(tokens)``, see ``specsim.engine.speed_reference``)."""
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

    now = time.perf_counter if clock == "wall" else time.process_time
    timings = {whole_step: [], passes_only: []}
    for _ in range(2):  # warm-up
        for fn in timings:
            reset()
            fn()
    for _ in range(repeats):
        for fn, out in timings.items():
            reset()
            # Read before the pass: a speed probe, when one is due, stays out of the timing.
            factor = normalise(batch * (k + 1), target) if normalise is not None else 1.0
            sync(target.device)
            began = now()
            fn()
            sync(target.device)
            out.append((now() - began) * factor)
    reset()
    step = float(np.median(timings[whole_step]))
    passes = float(np.median(timings[passes_only]))
    return StepOverhead(batch, k, context, step, passes, step - passes)


class SyntheticPrompts:
    """Prompt ids for calibration runs, without a tokenizer: request i's prompt is a fixed
    pseudo-random walk over the vocabulary (what the ids are does not change a pass's time)."""

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def prompt(self, index: int, length: int) -> list[int]:
        return [1 + (index * 7919 + i * 104729) % (self.vocab_size - 1) for i in range(length)]


def serve_fixed_batch(
    target: DecoderModel,
    drafter: DecoderModel | None,
    batch: int,
    k: int,
    prompt: int,
    output: int,
    waves: int = 3,
    clock=None,
    seed: int = 0,
):
    """Serve ``waves`` x ``batch`` requests of ``prompt`` + ``output`` tokens, all arriving at
    once, on the real engine with ``max_batch = batch`` and window k (the drafter only when
    k > 0): each wave is a prefill of ``batch`` prompts, then decode steps at that batch until
    its rows finish. ``clock``: a ``specsim.engine.clock`` clock (default wall). Returns the
    engine's ``IterationLog``."""
    from specsim.engine.clock import WallClock
    from specsim.engine.engine import EngineOptions, ServingEngine
    from specsim.engine.workload import EngineRequest

    clock = clock or WallClock()
    options = EngineOptions(max_batch=batch, window=lambda rows: k, k_max=k, seed=seed)
    engine = ServingEngine(
        target,
        drafter if k else None,
        SyntheticPrompts(target.config.vocab_size),
        options,
        clock.now,
        clock.sleep,
        clock.mark,
        clock.split,
    )
    engine.run([EngineRequest(rid, 0.0, prompt, output) for rid in range(waves * batch)])
    return engine.log
