"""The planned workload as the engines' load testers can send it (``serving.bench_commands``).

Their ``random`` dataset draws lengths uniformly between two bounds, so each of the scenario's
length distributions becomes a ``LengthRange``: a fixed or uniform length exactly; a lognormal
(or a trace's or an empirical column) as the uniform range with its mean and, as far as its
bounds allow, its standard deviation. A uniform has no long tail, so the bench's longest
requests are shorter than the scenario's: the comparison stays fair because the results keep
each request's lengths (``--save-detailed``), from which ``validate --bench`` predicts.
Arrivals: Poisson, a gamma of the bursty workload's shape (1 / cv^2), evenly spaced for a fixed
rate, a trace's gaps by their own shape; a closed loop as that many concurrent clients.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from specsim.planning.rates import ArrivalScale
from specsim.serving import bench_commands, registry
from specsim.serving.bench_commands import BenchLoad, BenchPlan, LengthRange, label, number
from specsim.workload.lengths import LengthSampler

DRAWS = 200_000  # lognormal moments from a seeded draw: about 0.3 % error on the mean at sigma 1


@dataclass(frozen=True)
class PlannedLoad:
    """A load the plan ran, and what the bench must send there."""

    label: str  # the result file's stem: "rate-4", "concurrency-16", "share-2.5"
    description: str  # "4 req/s"
    rate: float | None  # requests per second (None: a closed loop)
    clients: int | None  # a closed loop's concurrency
    requests: int


def uniform_like(values: np.ndarray, low: float, high: float) -> LengthRange:
    """The uniform range with the values' mean and standard deviation, kept in [low, high]
    (a side that would cross its bound stops there, and the other moves so the mean stays)."""
    mean, spread = float(np.mean(values)), math.sqrt(3.0) * float(np.std(values))
    start, end = mean - spread, mean + spread
    if start < low:
        start, end = low, min(high, 2 * mean - low)
    if end > high:
        start, end = max(low, 2 * mean - high), high
    first = max(1, round(start))
    return LengthRange(first, max(first, round(end)))


def length_range(scenario, column: str) -> tuple[LengthRange, str]:
    """``column`` (prompt or output) as a range, and how it relates to the scenario's."""
    workload = scenario.workload
    if workload.kind == "trace":
        values = trace_columns(scenario)[column]
        span = uniform_like(values, float(values.min()), float(values.max()))
        return span, _approximated(f"the trace's {column} lengths", values, span)
    spec = getattr(workload, column)
    if spec.dist == "fixed":
        return LengthRange(spec.value, spec.value), f"{spec.value} tokens each (exact)"
    if spec.dist == "uniform":
        span = LengthRange(spec.low, spec.high)
        return span, f"uniform in [{spec.low}, {spec.high}] tokens (exact)"
    sampler = LengthSampler(spec, column, scenario.resolve)
    if spec.dist == "empirical":
        values = sampler.values
        span = uniform_like(values, float(values.min()), float(values.max()))
        return span, _approximated(f"the {column} lengths of {spec.trace}", values, span)
    values = sampler.draw(np.random.default_rng(0), DRAWS)
    high = math.inf if spec.high is None else spec.high
    span = uniform_like(values, spec.low, high)
    clip = f"at least {spec.low}" if spec.high is None else f"in [{spec.low}, {spec.high}]"
    what = f"the scenario's lognormal (median {spec.median:g}, sigma {spec.sigma:g}, {clip})"
    return span, _approximated(what, values, span)


def _approximated(what: str, values: np.ndarray, span: LengthRange) -> str:
    uniform_sd = math.sqrt(((span.high - span.low + 1) ** 2 - 1) / 12.0)
    return (
        f"{what}: mean {np.mean(values):.0f}, sd {np.std(values):.0f}, longest "
        f"{int(np.max(values))} tokens; written as uniform in [{span.low}, {span.high}] (mean "
        f"{(span.low + span.high) / 2:.0f}, sd {uniform_sd:.0f}), which has no long tail"
    )


def trace_columns(scenario) -> dict[str, np.ndarray]:
    """The prompt and output lengths, and the arrival gaps, of the rows the scenario replays."""
    from specsim.workload import read_trace

    workload = scenario.workload
    trace = read_trace(scenario.resolve(workload.trace), workload.format)
    scale = ArrivalScale(None, trace.arrival_s, workload.duration_s, workload.requests)
    count, _ = scale.replayed(1.0 / workload.time_scale)
    count = max(count, 1)
    return {
        "prompt": trace.prompt_tokens[:count],
        "output": trace.output_tokens[:count],
        "gaps": np.diff(np.sort(trace.arrival_s)[:count]),
    }


def burstiness(scenario) -> tuple[float, str]:
    """vLLM's ``--burstiness`` (the gamma shape of the gaps) and the arrivals in words."""
    workload = scenario.workload
    if workload.kind == "poisson":
        return 1.0, "Poisson"
    if workload.kind == "bursty":
        shape = float(f"{1.0 / workload.cv**2:.6g}")
        return shape, f"gamma gaps with cv {workload.cv:g} (burstiness {number(shape)})"
    if workload.kind == "fixed_rate":
        return math.inf, "evenly spaced (burstiness inf)"
    if workload.kind == "closed_loop":
        think = workload.think_time_s
        pause = f"; their think time of {think:g} s is not sent" if think else ""
        return 1.0, f"closed-loop clients sending at once (--max-concurrency){pause}"
    gaps = trace_columns(scenario)["gaps"]
    mean = float(np.mean(gaps)) if gaps.size else 0.0
    cv = float(np.std(gaps)) / mean if mean > 0 else 0.0
    shape = math.inf if cv == 0 else float(f"{1.0 / cv**2:.4g}")
    return shape, (
        f"the trace's arrivals as gamma gaps of the same cv ({cv:.3g}, burstiness "
        f"{number(shape)}) at its mean rate: the trace's own times are not replayed"
    )


def open_loop_requests(scenario, rate: float, scale: ArrivalScale | None, knob: float) -> int:
    """Requests a run at ``rate`` sends: the trace rows in its window at that speed, or rate x
    duration, capped by the workload's request limit."""
    workload = scenario.workload
    if scale is not None and scale.times is not None:
        return max(1, scale.replayed(knob)[0])
    count = math.inf if workload.duration_s is None else math.ceil(rate * workload.duration_s)
    if workload.requests is not None:
        count = min(count, workload.requests)
    return max(1, int(count))


def bench_plan(scenario, loads: list[PlannedLoad]) -> tuple[BenchPlan, list[str]]:
    """The bench's workload, and what it approximates, in words."""
    prompt, prompt_text = length_range(scenario, "prompt")
    output, output_text = length_range(scenario, "output")
    shape, arrivals = burstiness(scenario)
    bench = tuple(
        BenchLoad(
            label=label(load.label),
            request_rate=math.inf if load.rate is None else load.rate,
            max_concurrency=load.clients,
            num_prompts=load.requests,
        )
        for load in loads
    )
    plan = BenchPlan(prompt, output, shape, bench, seed=scenario.seed)
    return plan, [f"prompts: {prompt_text}", f"outputs: {output_text}", f"arrivals: {arrivals}"]


def bench_header(head: list[str], choice, setting, rendered, plan, notes) -> list[str]:
    """bench.sh's header: ``head`` (what the plan was and chose), the workload, the loads,
    the servers to start and the controlled test."""
    clients = registry.bench_clients(rendered)
    lines = list(head)
    lines += [f"Workload {note}." for note in notes]
    lines += [f"Note: {note}." for note in bench_commands.client_notes(plan, clients)]
    lines.append(
        "Loads: "
        + "; ".join(f"{load.label} ({load.num_prompts} requests)" for load in plan.loads)
        + ". --save-detailed keeps each request's lengths and send times, so that "
        "`specsim validate --bench` on this plan's folder predicts for the requests sent."
    )
    results = [e.bench.result_file("LABEL") for e in registry.ENGINES if e.bench is not None]
    lines += [
        f"Results: {' and '.join(results)} beside this script.",
        "The clients send their own default sampling temperature; set it to the planned one "
        "in the tool's request options if they differ.",
        "Start the planned server first, from this folder (vLLM's client talks to any of "
        "them through its OpenAI-compatible endpoint):",
        *[f"  {item.start}" for item in rendered.values()],
    ]
    controlled = bench_commands.controlled_servers(setting, tuple(rendered))
    if controlled:
        lines += [
            "Controlled test: acceptance forced to the profile's rates, the same for every "
            "request (simulate it with --set speculation.heterogeneity=false), so that the "
            "costs alone are compared; start this server instead:",
            *controlled,
        ]
        if choice.scenario.speculation.acceptance == "sequences":
            lines.append(
                "The scenario replays per-request acceptance sequences; the forced rates are "
                "the profile's per-position chain instead."
            )
    for engine in registry.entries(rendered):
        note = bench_commands.uncontrolled(setting, engine.name)
        if note:
            lines.append(note)
    return lines


def bench_summary(plan, clients: tuple[str, ...], notes: list[str], folder: str) -> dict:
    """summary.json's ``engine.bench``: the script (in ``folder``), its clients and what it
    sends."""
    return {
        "file": f"{folder}/{bench_commands.SCRIPT}",
        "clients": list(clients),
        "results": {c: f"{folder}/{registry.engine(c).bench.results}" for c in clients},
        "prompt_tokens": [plan.prompt.low, plan.prompt.high],
        "output_tokens": [plan.output.low, plan.output.high],
        "burstiness": None if plan.burstiness == float("inf") else plan.burstiness,
        "loads": [
            {
                "label": load.label,
                "request_rate": None if load.max_concurrency is not None else load.request_rate,
                "max_concurrency": load.max_concurrency,
                "num_prompts": load.num_prompts,
            }
            for load in plan.loads
        ],
        "notes": [*notes, *bench_commands.client_notes(plan, clients)],
    }
