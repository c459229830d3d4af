"""Workloads: arrival processes, length distributions and trace readers."""

from __future__ import annotations

import numpy as np

from specsim.scenario import Scenario
from specsim.workload.lengths import LengthPairs, LengthSampler
from specsim.workload.sources import ClientCap, ClosedLoopSource, OpenLoopSource, TraceSource
from specsim.workload.traces import Trace, read_trace

__all__ = [
    "ClientCap",
    "ClosedLoopSource",
    "LengthPairs",
    "LengthSampler",
    "OpenLoopSource",
    "Trace",
    "TraceSource",
    "build_source",
    "read_trace",
]

Source = OpenLoopSource | TraceSource | ClosedLoopSource


def build_source(
    scenario: Scenario, arrivals_rng: np.random.Generator, lengths_rng: np.random.Generator
) -> Source:
    """The request source a scenario's workload describes (files are read here, not later)."""
    workload = scenario.workload
    if workload.kind == "trace":
        return TraceSource(workload, read_trace(scenario.resolve(workload.trace), workload.format))
    lengths = LengthPairs(
        LengthSampler(workload.prompt, "prompt", scenario.resolve),
        LengthSampler(workload.output, "output", scenario.resolve),
    )
    if workload.kind == "closed_loop":
        return ClosedLoopSource(workload, lengths, arrivals_rng, lengths_rng)
    return OpenLoopSource(workload, lengths, arrivals_rng, lengths_rng)
