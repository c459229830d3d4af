"""specsim: profile, simulate and plan speculative decoding for LLM serving fleets.

Notation throughout: p is the target model's next-token distribution, q the drafter's, and k the
number of tokens drafted per speculative step (k = 0 means speculation off).

The Python API (``specsim.simulate``, ``plan_window``, ``plan_capacity``,
``plan_disaggregated``, ``drafter_swap``, ``load_run``; see ``specsim.api``) loads on first
use, so ``import specsim`` stays cheap.
"""

from __future__ import annotations

from specsim.version import __version__ as __version__

API = (
    "BenchValidationRun",
    "PlanResult",
    "Result",
    "ValidationRun",
    "drafter_swap",
    "load_run",
    "plan_capacity",
    "plan_disaggregated",
    "plan_window",
    "simulate",
)


def __getattr__(name: str):
    if name in API:
        from specsim import api

        return getattr(api, name)
    raise AttributeError(f"module 'specsim' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *API])
