"""What the serving engine logs per iteration and per step (``ServingEngine.log``): the
statistics' inputs, and each pass's shape for the latency model to be asked what it cost."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class IterationLog:
    """Per-iteration and per-step figures for the engine statistics."""

    dt: list[float] = field(default_factory=list)
    batch: list[int] = field(default_factory=list)
    kv_tokens: list[int] = field(default_factory=list)  # target cache tokens after the iteration
    # What each pass did, so a latency model can be asked what it should have cost:
    kind: list[str] = field(default_factory=list)  # "prefill" or "decode"
    window: list[int] = field(default_factory=list)  # k of a decode iteration (0 for prefill)
    new_tokens: list[int] = field(default_factory=list)  # target pass: tokens fed
    context: list[int] = field(default_factory=list)  # target pass: cached tokens read
    pairs: list[float] = field(default_factory=list)  # target pass: query-key pairs
    # Of dt, the target's and the drafter's passes (CPU clocks only: empty on the wall clock);
    # the rest is the engine's own work.
    target_s: list[float] = field(default_factory=list)
    drafter_s: list[float] = field(default_factory=list)
    accepted: list[np.ndarray] = field(default_factory=list)
    drafted: list[np.ndarray] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)
    decode_rows: int = 0
    window_rows: int = 0

    def add(self, dt, batch, kind, k, shape: tuple, kv_tokens: int, passes=None) -> None:
        """One iteration: ``shape``, its target pass's (new tokens, context, pairs); ``passes``,
        the seconds of it in the target's and the drafter's passes (CPU clocks only)."""
        names = ("dt", "batch", "kind", "window", "new_tokens", "context", "pairs", "kv_tokens")
        for name, value in zip(names, (dt, batch, kind, k, *shape, kv_tokens), strict=True):
            getattr(self, name).append(value)
        if passes is not None:
            self.target_s.append(passes[0])
            self.drafter_s.append(passes[1])

    def extend(self, other: IterationLog) -> IterationLog:
        """This log followed by ``other``'s iterations (another run's): returns self."""
        for name, value in vars(other).items():
            if isinstance(value, list):
                getattr(self, name).extend(value)
            else:
                setattr(self, name, getattr(self, name) + value)
        return self
