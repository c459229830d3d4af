"""The cost model: what an engine iteration costs on one replica, built once per pool from a
profile and a speculation setting.

``StepCosts`` (seconds and FLOPs of an iteration; an iteration's rows and prompt chunks come in
as ``PassTotals``), ``kv_capacity_tokens`` (the KV cache a
replica holds) and the drafter kinds' costs (``drafters``). The simulator charges it, the
profiler fits the engine's overhead against it, and the real engine's log is compared with it.
"""

from specsim.costs.drafters import drafter_cost
from specsim.costs.kv_cache import kv_capacity_tokens
from specsim.costs.step import NO_ROWS, IterationParts, PassTotals, StepCosts

__all__ = [
    "NO_ROWS",
    "IterationParts",
    "PassTotals",
    "StepCosts",
    "drafter_cost",
    "kv_capacity_tokens",
]
