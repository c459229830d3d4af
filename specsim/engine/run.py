"""Run the real engine on a scenario: models, traffic, window policy, records and summary."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from specsim.engine.clock import ClockSetting, clock_name, start_clock
from specsim.engine.engine import EngineOptions, ServingEngine
from specsim.engine.iteration_log import IterationLog
from specsim.engine.records import (
    engine_summary,
    format_csv,
    format_iterations,
    record_columns,
)
from specsim.engine.step import Faults, Sampling
from specsim.engine.tree_step import TreeFaults
from specsim.engine.workload import PromptBank, build_engine_source, open_loop_requests
from specsim.errors import SpecsimError
from specsim.fileio import dump_json, write_text_atomic
from specsim.scenario import Scenario
from specsim.serving.runs import Traffic
from specsim.serving.vllm import bench_result

DEFAULT_TARGET = "specsim-target"
BENCH_FILE = "vllm-bench.json"  # the run as vllm bench serve --save-result writes its own
PRODUCED_BY = (
    "specsim's built-in engine (the built-in models in plain torch), not vLLM: only the format "
    "is vllm bench serve's"
)
# The drafter spec that means the target's own multi-token-prediction module (a profile's
# ``method: mtp``), loaded from the target's checkpoint.
MTP_SPEC = "mtp"
# Drafter names the shipped scenarios and profiles use, and the models behind them.
DEFAULT_DRAFTERS = {
    "small": "specsim-draft-small",
    "tiny": "specsim-draft-tiny",
    "ngram": "ngram",
    "mtp": MTP_SPEC,
}


@dataclass
class EngineRun:
    records: dict[str, np.ndarray]
    summary: dict[str, Any]
    log: IterationLog
    traffic: Traffic | None = None  # the load as a benchmark client states it (bench_traffic)

    def vllm_result(self) -> dict[str, Any]:
        """The run in vLLM's bench result format (``specsim.serving.vllm.bench_result``), as
        ``vllm bench serve --save-result --save-detailed --metric-percentiles 50,90,99``."""
        if self.traffic is None:
            raise ValueError("a run without its traffic has no benchmark result")
        scenario = self.summary["scenario"]
        result = bench_result(
            self.records,
            self.summary,
            self.traffic,
            scenario["target_model"],
            label=scenario["name"],
            percentiles=(50, 90, 99),
            save_detailed=True,
        )
        # A top-level key of one's own, as vllm bench serve --metadata KEY=VALUE adds them.
        result["produced_by"] = PRODUCED_BY
        return result


def bench_traffic(scenario: Scenario, arrivals: np.ndarray) -> Traffic:
    """The scenario's load in a benchmark client's terms: vLLM's ``--request-rate``,
    ``--burstiness`` (the gamma shape, 1 / cv^2; inf: evenly spaced) and ``--max-concurrency``
    (a closed loop's clients: rate inf). A trace has no rate of its own: its mean over the run
    (the saved send times are replayed exactly). A closed loop's think time has no client
    option and is not stated."""
    workload, n = scenario.workload, int(arrivals.size)
    if workload.kind == "closed_loop":
        return Traffic(math.inf, 1.0, workload.concurrency, n)
    burstiness = {"bursty": 1 / workload.cv**2, "fixed_rate": math.inf}.get(workload.kind, 1.0)
    if workload.kind == "trace":
        span = float(arrivals.max() - arrivals.min()) if n > 1 else 0.0
        rate = (n - 1) / span if span > 0 else math.inf
    else:
        rate = workload.rate
    return Traffic(rate, burstiness, workload.max_concurrency, n)


def window_policy(scenario: Scenario):
    """(rows -> k, k_max) for the scenario's speculation settings."""
    spec = scenario.speculation
    if not spec.enabled:
        return (lambda rows: 0), 0
    if spec.policy == "fixed":
        return (lambda rows: spec.k), spec.k
    if spec.policy == "by_batch":
        table = [(row.max_batch, row.k) for row in spec.k_by_batch]
        return (lambda rows: next((k for limit, k in table if rows <= limit), 0)), spec.max_k
    raise SpecsimError(
        "the real engine supports window policies 'fixed' and 'by_batch'",
        file=str(scenario.source) if scenario.source else None,
        key="speculation.policy",
        fix="use policy fixed or by_batch for validation",
    )


def check_supported(scenario: Scenario) -> None:
    where = str(scenario.source) if scenario.source else None
    if scenario.engine.chunked_prefill:
        raise SpecsimError(
            "the real engine prefills whole prompts in their own iteration",
            file=where,
            key="engine.chunked_prefill",
            fix="set engine.chunked_prefill: false (or --set engine.chunked_prefill=false)",
        )
    for key, value in (
        ("workload.prefix", scenario.workload.prefix),
        ("engine.block_size", scenario.engine.block_size),
    ):
        if value is not None:  # the simulator's caching models, which the real engine lacks
            raise SpecsimError(
                "the real engine has no prefix cache and counts its KV cache in tokens",
                file=where,
                key=key,
                fix=f"remove {key} for validation",
            )
    if scenario.fleet.total_replicas != 1 or scenario.fleet.pools:
        raise SpecsimError(
            "the real engine runs one replica",
            file=where,
            key="fleet",
            fix="validate with fleet.replicas 1 and no pools",
        )
    spec = scenario.speculation
    if spec.enabled and spec.tree is not None and spec.drafter == "ngram":
        raise SpecsimError(
            "the real engine drafts trees with a draft model, not prompt lookup",
            file=where,
            key="speculation.tree",
            fix="use a draft model's drafter, or remove speculation.tree",
        )


def drafters_for_profile(drafters: dict[str, str] | None, profile) -> dict[str, str]:
    """``drafters`` (None: ``DEFAULT_DRAFTERS``) with every drafter that ``profile`` (a
    ``Profile``) describes as the target's MTP module (``method: mtp``) run as that module,
    unless ``drafters`` names its model."""
    chosen = dict(drafters or DEFAULT_DRAFTERS)
    for name, spec in profile.drafters.items():
        if spec.method == "mtp" and name not in (drafters or {}):
            chosen[name] = MTP_SPEC
    return chosen


def resolve_drafter(name: str | None, drafters: dict[str, str], where: str | None) -> str | None:
    """The model spec (or ``ngram[:N]``) behind a scenario's drafter name."""
    if name is None:
        return None
    if name in drafters:
        return drafters[name]
    raise SpecsimError(
        f"no model known for drafter {name!r}",
        file=where,
        key="speculation.drafter",
        fix=f"pass --drafter {name}=MODEL (known: {', '.join(sorted(drafters))})",
    )


def run_engine(
    scenario: Scenario,
    *,
    target: str = DEFAULT_TARGET,
    drafters: dict[str, str] | None = None,
    prompts: str | Path | None = None,
    device: str = "cpu",
    ignore_eos: bool = True,
    eos_id: int | None = None,
    faults: Faults | None = None,
    tree_faults: TreeFaults | None = None,
    clock: str | ClockSetting = "wall",
    dtype: str = "float32",
    progress=None,
) -> EngineRun:
    """Serve the scenario's workload on real models in wall-clock time.

    Output lengths come from the workload, so EOS is ignored by default (as serving benchmarks
    do, and as the simulator assumes); with ``ignore_eos=False`` a request also stops at the
    tokenizer's EOS, or at ``eos_id`` when given. ``clock`` is ``wall``, ``cpu``, or a clock
    setting started on the run's models (``specsim.engine.clock.start_clock``). ``dtype`` is
    the models' parameter type: the one the profile it is compared with was measured in.
    ``progress`` (a tqdm bar, say) is updated with each batch of finished requests. With
    ``speculation.tree`` every step is a tree step; ``faults`` and ``tree_faults`` plant
    rollback bugs (tests only).
    """
    from specsim.drafters import parse_ngram
    from specsim.models import load_tokenizer

    check_supported(scenario)
    where = str(scenario.source) if scenario.source else None
    spec = scenario.speculation
    window, k_max = window_policy(scenario)
    drafter_spec = resolve_drafter(spec.drafter, drafters or DEFAULT_DRAFTERS, where)
    ngram = parse_ngram(drafter_spec) if (drafter_spec and spec.enabled) else None
    mtp = spec.enabled and drafter_spec == MTP_SPEC
    if mtp and clock_name(clock) == "reference":
        raise SpecsimError(
            "the reference clock does not probe MTP modules",
            file=where,
            key="--clock",
            fix="use --clock cpu or --clock wall with the mtp drafter",
        )
    own_model = drafter_spec if spec.enabled and ngram is None and not mtp else None
    target_model, drafter_model = _load_models(target, own_model, mtp, device, dtype)
    tokenizer = load_tokenizer(target)
    bank = PromptBank.from_file(prompts, tokenizer)
    options = EngineOptions(
        max_batch=scenario.engine.max_batch,
        max_batched_tokens=scenario.engine.max_batched_tokens,
        sampling=Sampling(temperature=spec.temperature, verifier=spec.verifier),
        window=window,
        k_max=k_max,
        ngram=ngram,
        ignore_eos=ignore_eos,
        eos_id=tokenizer.eos_id if eos_id is None else eos_id,
        seed=scenario.seed,
        faults=faults or Faults(),
        tree=spec.tree_shape if spec.enabled else None,
        tree_drafts=spec.tree_drafts,
        tree_faults=tree_faults or TreeFaults(),
    )
    drafter_models = {spec.drafter: drafter_model} if drafter_model is not None else {}
    timer = start_clock(clock, device, target_model, drafter_models)
    engine = ServingEngine(
        target_model, drafter_model, bank, options, timer.now, timer.sleep, timer.mark, timer.split
    )
    engine.progress = progress
    done = _serve(engine, scenario, where)
    records = record_columns(done)
    capacity = scenario.engine.max_batch * engine.max_len
    summary = engine_summary(records, engine.log, k_max, scenario.engine.max_batch, capacity)
    summary["scenario"] = {
        **_scenario_echo(scenario, target, drafter_spec, device),
        "dtype": str(next(target_model.parameters()).dtype).removeprefix("torch."),
        "seed": scenario.seed,
        "ignore_eos": ignore_eos,
        "clock": clock_name(clock),
        **tree_echo(options.tree, options.tree_drafts, engine.log),
    }
    machine_speed = timer.report()
    if machine_speed is not None:
        summary["machine_speed"] = machine_speed
    return EngineRun(records, summary, engine.log, bench_traffic(scenario, records["arrival_s"]))


def _serve(engine: ServingEngine, scenario: Scenario, where: str | None) -> list:
    """The requests the engine finished serving the scenario's workload (open or closed loop)."""
    source = build_engine_source(scenario)
    if source.closed_loop:
        done = engine.run(clients=source)
    else:
        done = engine.run(open_loop_requests(source))
    if not done:
        raise SpecsimError(
            "the workload issued no requests",
            file=where,
            key="workload",
            fix="lengthen workload.duration_s or raise workload.rate",
        )
    return done


def _load_models(target: str, drafter_spec: str | None, mtp: bool, device: str, dtype: str):
    """The target model and the drafter's: the target's MTP module, the model ``drafter_spec``
    names, or None."""
    import torch

    from specsim.models import load_model, load_mtp_drafter

    target_model = load_model(target, device, getattr(torch, dtype))
    if mtp:
        return target_model, load_mtp_drafter(target, target_model, device, getattr(torch, dtype))
    if drafter_spec is None:
        return target_model, None
    drafter_model = load_model(drafter_spec, device, getattr(torch, dtype))
    if drafter_model.config.vocab_size != target_model.config.vocab_size:
        raise SpecsimError(
            "drafter and target vocabularies differ",
            file=drafter_spec,
            key="vocab_size",
            fix="pair the target with a drafter that shares its tokenizer",
        )
    return target_model, drafter_model


def _scenario_echo(scenario: Scenario, target: str, drafter_spec, device: str) -> dict:
    """What the run served, as its summary's ``scenario`` block begins."""
    spec = scenario.speculation
    return {
        "name": scenario.name,
        "drafter": spec.drafter if spec.enabled else None,
        "k": spec.k if spec.enabled else 0,
        "verifier": spec.verifier,
        "temperature": spec.temperature,
        "policy": spec.policy,
        "target_model": target,
        "drafter_model": drafter_spec if spec.enabled else None,
        "device": device,
    }


def tree_echo(shape, drafts: str, log: IterationLog) -> dict[str, Any]:
    """A tree run's shape, as a simulation's summary names it, and the nodes its steps
    verified (every row verifies all of them); chain runs keep their keys."""
    if shape is None:
        return {}
    return {
        "tree": {
            **shape.summary(),
            "drafts": drafts,
            "nodes_verified": shape.num_nodes * log.decode_rows,
        }
    }


def write_run(run: EngineRun, folder: Path) -> None:
    """requests.csv, summary.json and iterations.csv of an engine run, into ``folder``, and the
    run in vLLM's bench result format (``BENCH_FILE``) when its traffic is known."""
    folder.mkdir(parents=True, exist_ok=True)
    write_text_atomic(folder / "requests.csv", format_csv(run.records))
    write_text_atomic(folder / "summary.json", dump_json(run.summary))
    write_text_atomic(folder / "iterations.csv", format_iterations(run.log))
    if run.traffic is not None:
        write_text_atomic(folder / BENCH_FILE, bench_text(run.vllm_result()))


def bench_text(result: dict[str, Any]) -> str:
    """A result file's text as vllm bench serve writes it: ``json.dump``, one line."""
    return json.dumps(result, allow_nan=False) + "\n"
