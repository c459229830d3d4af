"""specsim: profile, simulate and plan speculative decoding for LLM serving fleets.

Notation throughout: p is the target model's next-token distribution, q the drafter's, and k the
number of tokens drafted per speculative step (k = 0 means speculation off).

The Python API below runs the commands' own code and loads on first use, so ``import specsim``
stays cheap: ``simulate`` returns a ``Result`` (``.summary``: summary.json's dict,
``.requests``: requests.csv as a pandas DataFrame); ``plan_window``, ``plan_capacity``,
``plan_disaggregated`` and ``drafter_swap`` return a ``PlanResult`` (``.summary``, ``.tables``:
each report table as a DataFrame); ``load_run`` reads a run folder back into these objects.
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
# help(specsim) lists what __all__ names, though the objects live in specsim.api.
__all__ = list(API)


def __getattr__(name: str):
    if name in API:
        from specsim import api

        return getattr(api, name)
    raise AttributeError(f"module 'specsim' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *API])
