"""The real speculative serving engine (torch): continuous batching over real models.

Public API::

    from specsim.engine import run_engine, write_run
    run = run_engine(scenario, target="specsim-target", drafters={"small": "specsim-draft-small"})
    run.records      # per-request columns, the simulator's record format plus quality columns
    run.summary      # summary.json keys, computed by specsim.metrics

    from specsim.engine.step import speculative_step, Sampling, Faults, Rows
    from specsim.engine.engine import ServingEngine, EngineOptions

- ``step``: one speculative step (k draft passes, one verification pass, per-row rollback of
  both caches); ``Faults`` plants rollback bugs for the end-to-end tests.
- ``tree_step``: one tree step (the drafter expands a ``specsim.tree.TreeShape`` depth by
  depth, one verification pass over every node, the accepted path's KV kept, the rest rolled
  back); ``tree_attention``: the tree attention mask and positions of those passes. Offline
  generation (``generate(..., tree=...)``) and the serving loop (``EngineOptions.tree``, from
  a scenario's ``speculation.tree``) run it.
- ``batch``: preallocated caches with live rows packed at the front.
- ``engine``: the continuous-batching loop in wall-clock time.
- ``workload``: the simulator's traffic from the same seed, and prompts from a prompt set.
- ``records``: requests.csv / summary.json in the simulator's format (no torch needed to read).
- ``clock``: wall-clock or CPU time; ``speed_reference``: the shared CPU's reference clock
  (``--clock reference``), which a dedicated machine never needs.
- ``waves``: the loop on fixed-batch waves, whose iterations the profiler's overhead fit reads.

Importing this package does not import torch; ``run_engine`` loads it.
"""

from __future__ import annotations

from typing import Any


def run_engine(*args: Any, **kwargs: Any):
    from specsim.engine.run import run_engine as _run

    return _run(*args, **kwargs)


def write_run(*args: Any, **kwargs: Any):
    from specsim.engine.run import write_run as _write

    return _write(*args, **kwargs)


__all__ = ["run_engine", "write_run"]
