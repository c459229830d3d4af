"""Token-length distributions for prompts and outputs, drawn vectorised from a numpy Generator."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from specsim.workload.traces import read_trace
from specsim.workload_settings import LengthDist


class LengthSampler:
    """Draws integer lengths >= 1 for one ``LengthDist``.

    ``empirical`` resamples a trace column; ``column`` says which (``prompt`` or ``output``).
    """

    def __init__(self, spec: LengthDist, column: str, resolve: Callable[[str], Path]):
        self.spec = spec
        self.column = column
        self.values: np.ndarray | None = None
        self.trace_path: Path | None = None
        if spec.dist == "empirical":
            trace = read_trace(resolve(spec.trace), spec.format)
            self.trace_path = trace.path
            self.values = trace.prompt_tokens if column == "prompt" else trace.output_tokens

    def draw(self, rng: np.random.Generator, n: int, rows: np.ndarray | None = None) -> np.ndarray:
        """``n`` lengths. ``rows`` (empirical only) picks trace rows, for joint prompt/output."""
        spec = self.spec
        if spec.dist == "fixed":
            return np.full(n, spec.value, dtype=np.int64)
        if spec.dist == "uniform":
            return rng.integers(spec.low, spec.high, size=n, endpoint=True, dtype=np.int64)
        if spec.dist == "lognormal":
            raw = spec.median * np.exp(spec.sigma * rng.standard_normal(n))
            high = np.inf if spec.high is None else spec.high
            return np.clip(np.rint(raw), spec.low, high).astype(np.int64)
        if rows is None:
            rows = rng.integers(0, self.values.shape[0], size=n)
        return self.values[rows].astype(np.int64)


class LengthPairs:
    """Prompt and output lengths for requests; drawn jointly when both come from one trace."""

    def __init__(self, prompt: LengthSampler, output: LengthSampler):
        self.prompt = prompt
        self.output = output
        self.joint = (
            prompt.trace_path is not None
            and prompt.trace_path == output.trace_path
            and prompt.spec.format == output.spec.format
        )

    def draw(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        if self.joint:
            rows = rng.integers(0, self.prompt.values.shape[0], size=n)
            return self.prompt.draw(rng, n, rows), self.output.draw(rng, n, rows)
        return self.prompt.draw(rng, n), self.output.draw(rng, n)
