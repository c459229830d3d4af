"""The serving simulator: replicas with continuous batching and speculative decoding (SimPy).

from specsim.scenario import load_scenario
from specsim.simulation import run_simulation
result = run_simulation(load_scenario("scenarios/chat.yaml"), records_path="requests.csv")
result.summary["ttft_s"]["p99"]
"""

from __future__ import annotations

from specsim.simulation.run import SimulationResult, run_simulation

__all__ = ["SimulationResult", "run_simulation"]
