"""What a sweep runs at each point: a task, wrapped so that a failure becomes a record.

Both live at module level so a process pool or a Dask worker can import them by name.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from specsim.errors import SpecsimError

# task(scenario_path, overrides) -> summary dict.
Task = Callable[[str, list[str]], dict[str, Any]]


def simulate_point(scenario: str, overrides: list[str]) -> dict[str, Any]:
    """The default task: run the simulator on one point and return its summary."""
    from specsim.scenario import load_scenario
    from specsim.simulation import run_simulation

    return run_simulation(load_scenario(scenario, overrides)).summary


def run_point(task: Task, scenario: str, overrides: list[str]) -> dict[str, Any]:
    """Run ``task`` and turn any failure into a record, so one bad point cannot stop a sweep.
    A success also records the CPU seconds the task took (this thread's: a Dask worker runs
    several)."""
    try:
        start = time.thread_time()
        summary = task(scenario, list(overrides))
        # Fail here, in the worker, if the summary cannot be stored as JSON.
        json.dumps(summary, allow_nan=False)
        return {"ok": True, "summary": summary, "cpu_s": round(time.thread_time() - start, 4)}
    except SpecsimError as exc:
        return {"ok": False, "error": exc.one_line()}
    except Exception as exc:
        text = " ".join(str(exc).split()) or "no message"
        return {"ok": False, "error": f"{type(exc).__name__}: {text}"}
