"""Whether a scenario's longest request can ever be admitted, checked before any run.

The rule is the admission's (``admission.never_fits``: prompt + output + the lookahead slots,
in tokens or KV blocks, against the replica's cache), applied to the longest request the
workload can offer: a trace's longest row (prompt + output, among the first
``workload.requests`` rows when that is set: a faster replay can reach any row before
``duration_s``), or a distribution's upper bounds. A lognormal without ``high`` has none, so it
is not checked here (its runs still refuse such a request when they meet one).
"""

from __future__ import annotations

import numpy as np

from specsim.costs import StepCosts, kv_capacity_tokens
from specsim.costs.kv_cache import kv_capacity_blocks
from specsim.scenario import Scenario
from specsim.simulation.admission import kv_lookahead, never_fits
from specsim.simulation.policy import build_policy
from specsim.workload import read_trace
from specsim.workload.lengths import LengthPairs, LengthSampler
from specsim.workload_settings import LengthDist


def longest_request(scenario: Scenario) -> tuple[int, int] | None:
    """(prompt, output) of the longest request the workload can offer (None: unbounded)."""
    workload = scenario.workload
    if workload.kind == "trace":
        trace = read_trace(scenario.resolve(workload.trace), workload.format)
        rows = len(trace) if workload.requests is None else min(len(trace), workload.requests)
        prompts, outputs = trace.prompt_tokens[:rows], trace.output_tokens[:rows]
        at = int(np.argmax(prompts + outputs))
        return int(prompts[at]), int(outputs[at])
    pairs = LengthPairs(
        LengthSampler(workload.prompt, "prompt", scenario.resolve),
        LengthSampler(workload.output, "output", scenario.resolve),
    )
    if pairs.joint:
        at = int(np.argmax(pairs.prompt.values + pairs.output.values))
        return int(pairs.prompt.values[at]), int(pairs.output.values[at])
    prompt, output = _upper_bound(pairs.prompt), _upper_bound(pairs.output)
    return None if prompt is None or output is None else (prompt, output)


def longest_prompt(scenario: Scenario) -> int | None:
    """The longest prompt the workload can offer (None: unbounded)."""
    workload = scenario.workload
    if workload.kind == "trace":
        trace = read_trace(scenario.resolve(workload.trace), workload.format)
        rows = len(trace) if workload.requests is None else min(len(trace), workload.requests)
        return int(trace.prompt_tokens[:rows].max())
    return _upper_bound(LengthSampler(workload.prompt, "prompt", scenario.resolve))


def _upper_bound(sampler: LengthSampler) -> int | None:
    spec: LengthDist = sampler.spec
    if spec.dist == "fixed":
        return int(spec.value)
    if spec.dist == "empirical":
        return int(sampler.values.max())
    return None if spec.high is None else int(spec.high)  # uniform, lognormal's clip


def longest_request_misfit(scenario: Scenario, profile) -> str | None:
    """Why the workload's longest request never fits a replica's KV cache (None: it fits, or
    the workload has no bound). One replica of the scenario's own speculation, as a capacity
    search runs it (no pools, no split fleet)."""
    longest = longest_request(scenario)
    if longest is None:
        return None
    spec, engine = scenario.speculation, scenario.engine
    enabled = spec.enabled
    costs = StepCosts(profile, spec.drafter if enabled else None, spec.tree_shape)
    capacity = kv_capacity_tokens(profile, spec.drafter, enabled, engine)
    if engine.block_size is not None:
        capacity = kv_capacity_blocks(capacity, engine.block_size)
    k_max = build_policy(spec, engine.max_batch).k_max
    lookahead = kv_lookahead(k_max, costs, engine.block_size)
    why = never_fits(*longest, lookahead, capacity, engine.block_size)
    return None if why is None else f"the workload's longest request {why}"


def longest_prompt_misfit(scenario: Scenario, profile) -> str | None:
    """Why the workload's longest prompt never fits a prefill replica's KV cache (None: it
    fits, or prompts are unbounded): a prefill replica holds a prompt and the one verified
    slot of a pass without speculation, not its output (``disagg.PrefillAdmission``)."""
    prompt = longest_prompt(scenario)
    if prompt is None:
        return None
    engine = scenario.engine
    capacity = kv_capacity_tokens(profile, None, False, engine)
    if engine.block_size is not None:
        capacity = kv_capacity_blocks(capacity, engine.block_size)
    lookahead = kv_lookahead(0, StepCosts(profile, None), engine.block_size)
    why = never_fits(prompt, 0, lookahead, capacity, engine.block_size)
    return None if why is None else f"the workload's longest prompt {why} as a prefill replica"
