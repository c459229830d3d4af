"""specsim's Python API: the CLI's commands as functions returning a ``Result`` or
``PlanResult``, whose tables are pandas DataFrames.

For example::

    import specsim
    result = specsim.simulate("scenarios/poisson.yaml", speculation__k=3)
    result.summary["e2e_s"]["p99"]          # summary.json's dict
    result.requests                         # requests.csv as a DataFrame
    result.save("runs/k3")                  # the files specsim simulate --out writes
    plan = specsim.plan_window("scenarios/poisson.yaml", k="0..4", loads=[2, 6, 10])
    plan.tables["best_k"]                   # every report table (and figure's data) as a frame
    specsim.load_run("runs/k3")             # a run folder read back into the same objects

Overrides are keyword arguments, a double underscore for each dot of ``--set``
(``speculation__k=3`` is ``--set speculation.k=3``), type-checked by the same schema. Each
function runs the same code as its command, so its results equal the command's files.
"""

from specsim.api.plan import drafter_swap, plan_capacity, plan_window
from specsim.api.plan_split import plan_disaggregated
from specsim.api.results import (
    BenchValidationRun,
    PlanResult,
    Result,
    ValidationRun,
    load_run,
)
from specsim.api.simulate import simulate

__all__ = [
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
]
