"""Benchmark runs of the built-in engine, written as ``vllm bench serve`` writes its own: the
measured side of calibrate -> predict -> compare on a machine without a serving engine.

``engine_bench`` serves a scenario's request lengths at each ``BenchLoad`` (a Poisson rate, or
a closed loop of clients, as ``bench.sh`` runs them) on the built-in engine and writes each run's
``vllm-bench.json`` as ``FOLDER/LABEL.json``; ``profile from-bench`` fits a profile to some of
them and ``validate --bench`` predicts the others (``benchmarks/bench_calibration.py``).
The files are specsim's engine's runs, not vLLM's: only their format is vLLM's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from specsim.fileio import write_text_atomic
from specsim.profile import load_profile
from specsim.scenario import Scenario, Workload
from specsim.serving.bench_commands import BenchLoad


def load_scenario_for(base: Scenario, load: BenchLoad) -> Scenario:
    """``base`` with its workload sent at ``load``: the same request lengths, ``num_prompts``
    requests, Poisson at the rate or a closed loop of ``max_concurrency`` clients."""
    workload = base.workload
    lengths = {"prompt": workload.prompt, "output": workload.output}
    if load.max_concurrency is not None and not math.isfinite(load.request_rate):
        sent = Workload(
            kind="closed_loop",
            concurrency=load.max_concurrency,
            requests=load.num_prompts,
            **lengths,
        )
    else:
        sent = Workload(
            kind="poisson",
            rate=load.request_rate,
            requests=load.num_prompts,
            max_concurrency=load.max_concurrency,
            **lengths,
        )
    scenario = base.model_copy(update={"workload": sent, "name": load.label})
    return scenario.with_source(base.source)


def engine_bench(
    base: Scenario,
    loads: Sequence[BenchLoad],
    folder: str | Path,
    *,
    clock: str = "cpu",
    target: str | None = None,
    drafters: dict[str, str] | None = None,
    prompts: str | None = None,
) -> list[Path]:
    """Serve ``base`` at each load on the built-in engine; one vLLM-format result per load.
    ``clock``: ``wall``, ``cpu`` (this process's CPU time; one torch thread) or ``reference``
    (CPU time rescaled, pass by pass, to the speed of the machine that measured the scenario's
    profile: its ``provenance.speed_reference``), as ``specsim validate --clock`` takes it."""
    from specsim.engine.run import DEFAULT_TARGET, bench_text, run_engine
    from specsim.engine.speed_reference import clock_setting

    setting: str | object = clock
    if clock == "reference":
        profile = load_profile(base.resolve(base.profile)).profile
        setting = clock_setting(clock, profile.provenance.speed_reference)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for load in loads:
        run = run_engine(
            load_scenario_for(base, load),
            target=target or DEFAULT_TARGET,
            drafters=drafters,
            prompts=prompts,
            clock=setting,
        )
        path = folder / f"{load.label}.json"
        write_text_atomic(path, bench_text(run.vllm_result()))
        files.append(path)
    return files
