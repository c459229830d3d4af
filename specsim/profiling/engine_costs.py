"""What a serving engine pays outside the forward passes, as the roofline prior states it: the
profile's ``overhead`` section (``specsim.profile.schema.Overhead``).

- ``step_s``: seconds per engine iteration whatever its size (the scheduler, building the
  batch's inputs, sampling's fixed part, the launches CUDA graphs do not cover);
- ``sequence_s``: seconds per sequence in an iteration (its sampling row, block-table and
  detokenising work);
- ``request_s``: seconds from a client's send to the engine's queue (HTTP, the chat template,
  tokenising in the API server), paid once by each request's TTFT and E2E, by no iteration;
- ``admit_s``: seconds the engine's own loop adds to the iteration that admits a request
  (``Overhead.per_request_engine_s``); 0 unless stated, as calibration fits it per engine.

The defaults were fitted on bundled public deployments, by deployment, and checked on the
others (``ROOFLINE_ENGINE_SOURCE``; figures in docs/notes/2026-12-02-efficiency-priors.md).
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_STEP_S = 5.0e-4
DEFAULT_SEQUENCE_S = 1.2e-4
DEFAULT_REQUEST_S = 5.0e-2
ROOFLINE_ENGINE_SOURCE = (
    "fitted on vLLM 0.11.0 runs of Qwen3-8B and Qwen3-14B on one H100, Qwen3-14B on one A100 "
    "and Qwen3-235B-A22B over 8 H100s (tests/data/engine_runs), checked on the other bundled "
    "deployments"
)


@dataclass(frozen=True)
class EngineCosts:
    """The roofline profile's engine costs outside the passes (see module docstring)."""

    step_s: float = DEFAULT_STEP_S
    sequence_s: float = DEFAULT_SEQUENCE_S
    request_s: float = DEFAULT_REQUEST_S
    admit_s: float = 0.0

    def overhead(self) -> dict:
        """The profile's ``overhead`` section."""
        return {
            "per_step_s": self.step_s,
            "per_sequence_s": self.sequence_s,
            "per_request_s": self.request_s,
            "per_request_engine_s": self.admit_s,
            "source": "stated",
        }

    def note(self) -> str:
        """The provenance note: the values, what they stand for, and where they came from."""
        defaults = self == EngineCosts()
        origin = ROOFLINE_ENGINE_SOURCE if defaults else "given on the command line"
        admitted = f", {self.admit_s:g} s per request admitted (its iteration pays it)"
        return (
            f"Engine overhead outside the passes: {self.step_s:g} s per iteration (scheduler, "
            f"sampling, launches), {self.sequence_s:g} s per sequence per iteration, and "
            f"{self.request_s:g} s per request on its way in (HTTP, chat template, tokenising; "
            f"TTFT and E2E pay it, no iteration does){admitted if self.admit_s > 0 else ''}: "
            f"stated, {origin}; not measured here."
        )
