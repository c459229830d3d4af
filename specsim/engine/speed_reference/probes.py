"""The passes the reference clock times: a model's decode and prefill, and the engine's own work.

Each ``median_s`` is the median of a short burst of the same pass, back to back, in this
process's CPU time (or the ``now`` given): the probe that ``SpeedNormaliser`` compares with its
reference. ``validate`` also times ``ReferencePass`` before and after an engine run, on any
clock, to see whether the machine drifted since profiling.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch

from specsim import models
from specsim.engine.clock import sync
from specsim.engine.step import VERIFIERS, Sampling, StepUniforms
from specsim.sampling.logits import sample_from_probs
from specsim.sampling.randomness import VerifierRandomness

REFERENCE_CONTEXT = 128
PREFILL_TOKENS = 96  # the prefill probe's prompt; passes this wide or wider take its factor
BURST = 5  # passes per probe: the median of a few is steady, and a probe stays short


class ReferencePass:
    """One pass of ``model`` at batch 1: a decode after ``REFERENCE_CONTEXT`` cached tokens
    (``kind="decode"``) or a prefill of ``PREFILL_TOKENS`` (``kind="prefill"``)."""

    def __init__(self, model, now: Callable[[], float] = time.process_time, kind="decode"):
        if kind not in ("decode", "prefill"):
            raise ValueError(f"unknown reference pass {kind!r}")
        self.model = model
        self.now = now
        self.kind = kind
        top = model.config.max_position - 1
        self.context = min(REFERENCE_CONTEXT, top) if kind == "decode" else 0
        self.tokens = 1 if kind == "decode" else min(PREFILL_TOKENS, top)
        self._cache = None
        self._input = None

    @classmethod
    def load(cls, spec: str, device: str, dtype: str, now: Callable[[], float]) -> ReferencePass:
        """The decode pass of the model ``spec`` on ``device`` with parameters in ``dtype`` (a
        torch dtype's name, as ``--dtype`` gives it), so callers need not import torch."""
        # Looked up at call time, so a caller (or a test) that replaces the loader is heard.
        return cls(models.load_model(spec, device, getattr(torch, dtype)), now)

    def _ready(self) -> None:
        if self._cache is not None:
            return
        model = self.model
        self._cache = model.new_cache(1, self.context + self.tokens)
        self._input = torch.ones((1, self.tokens), dtype=torch.long, device=model.device)
        with torch.inference_mode():
            if self.context:
                ids = torch.ones((1, self.context), dtype=torch.long, device=model.device)
                model(ids, self._cache)
            for _ in range(2):  # warm-up: first calls pay for allocation
                self._pass()

    def _pass(self) -> float:
        self._cache.rollback([self.context])
        sync(self.model.device)
        began = self.now()
        self.model(self._input, self._cache)
        sync(self.model.device)
        return self.now() - began

    def median_s(self, passes: int = BURST) -> float:
        """Median seconds of ``passes`` reference passes, back to back."""
        self._ready()
        with torch.inference_mode():
            return float(np.median([self._pass() for _ in range(passes)]))


class HostPass:
    """The engine's own work in one speculative step, without a model pass: per-row uniforms,
    processing the drafter's and the target's logits, sampling the drafts, exact rejection
    verification and reading the result back, at batch 4, k = 2 over the built-in vocabulary.
    Small torch operations and Python: other tenants slow them unlike a model's pass."""

    def __init__(self, now: Callable[[], float] = time.process_time, batch=4, k=2, vocab=258):
        self.now = now
        self.k = k
        generator = torch.Generator().manual_seed(0)
        self.q_logits = torch.randn((batch, k, vocab), generator=generator)
        self.p_logits = torch.randn((batch, k + 1, vocab), generator=generator)
        self.n_drafts = torch.full((batch,), k, dtype=torch.long)
        self.streams = [torch.Generator().manual_seed(i) for i in range(batch)]

    def _pass(self) -> float:
        sampling = Sampling()
        began = self.now()
        uniforms = StepUniforms.per_row(self.streams, self.k)
        q = sampling.probs(self.q_logits)
        drafts = torch.stack(
            [
                sample_from_probs(q[:, i], uniforms.draft[:, i], validate=False)
                for i in range(self.k)
            ],
            dim=1,
        )
        randomness = VerifierRandomness(uniforms.accept, uniforms.sample)
        p = sampling.probs(self.p_logits)
        result = VERIFIERS["rejection"](p, q, drafts, self.n_drafts, randomness, validate=False)
        result.tokens.tolist()
        result.accepted.tolist()
        return self.now() - began

    def median_s(self, passes: int = BURST) -> float:
        """Median seconds of ``passes`` host passes, back to back."""
        with torch.inference_mode():
            self._pass()  # warm-up: first calls pay for allocation
            return float(np.median([self._pass() for _ in range(passes)]))
