"""The measured profiler: time real passes, measure acceptance, write a profile (torch).

``measure_profile`` loads the target and draft models on the device, times each over the grid
(one shared time budget, split evenly over the models still to time), fits the latency form,
measures the engine's sampling overhead, scores acceptance on a prompt set, and returns a
validated ``Profile`` plus the side files (per-request sequences) to write next to it.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from specsim.profiling.measure_inputs import (
    CPU_MAX_NEW,
    CUDA_MAX_NEW,
    DTYPES,
    MeasureOptions,
    check_model_configs,
    check_mtp_clock,
    check_options_device,
    device_name,
    hardware_block,
    load_models,
    prompt_ids,
    software,
)

# A median probe below this fraction of the reference: the references were taken while the
# machine was slow, and every pass is rescaled from far off
# (docs/notes/2026-11-29-reference-clock.md).
SLOW_REFERENCE = 0.9


@dataclass
class MeasureReport:
    profile: object
    side_files: dict[str, str]
    lines: list[str]


def _time_models(opts, models, points, timer, progress_file):
    """Latency sections per model, summary lines and notes. All models in interleaved rounds
    (``time_grids``) under one budget; drafters first in a round (cheap), so a cut falls on the
    target's largest points."""
    from tqdm import tqdm

    from specsim.engine.mtp_step import is_mtp
    from specsim.profiling.fit import latency_section
    from specsim.profiling.mtp_measure import TimedMTP
    from specsim.profiling.timing import time_grids

    budget = opts.time_budget if opts.time_budget is not None else math.inf
    deadline = time.monotonic() + budget
    order = [n for n in models if n != "target"] + ["target"]
    sections, lines, notes = {}, [], []
    total = len(points) * timer.repeats * len(order)
    with tqdm(
        total=total, desc="timing passes", unit="pass", file=progress_file, disable=None
    ) as bar:
        runs = time_grids(
            {
                name: TimedMTP(models[name], opts.seed) if is_mtp(models[name]) else models[name]
                for name in order
            },
            points,
            timer,
            seed=opts.seed,
            deadline=deadline,
            progress=bar,
        )
    for name in order:
        run = runs[name]
        sections[name] = latency_section(run.samples, source=f"{name} timing grid")
        held = sections[name].fit.held_out
        status = f"{run.planned} points"
        if run.stopped_early:
            repeats = sorted({s.repeats for s in run.samples})
            status = (
                f"stopped by the time budget with {len(run.samples)} of {run.planned} points "
                f"measured, {repeats[0]}"
                + (f"-{repeats[-1]}" if len(repeats) > 1 else "")
                + f" of {timer.repeats} repeats each"
            )
            notes.append(
                f"{name}: timing grid {status}; the valid range records what was measured."
            )
        lines.append(
            f"  {name}: {status} in {run.seconds:.0f} s; held-out error median "
            f"{held.median_rel_error:.1%}, max {held.max_rel_error:.1%}"
        )
    return sections, lines, notes


def _acceptance(opts, models, tokenizer, progress_file):
    """(AcceptanceResult, summary line, note) for the prompt set."""
    from tqdm import tqdm

    from specsim.profiling.acceptance_measure import measure_acceptance

    max_new = opts.max_new_tokens or (CPU_MAX_NEW if opts.device == "cpu" else CUDA_MAX_NEW)
    limit = min(m.config.max_position for m in models.values())
    ids, source, available = prompt_ids(opts, tokenizer, limit, max_new)
    runs = len({0.0, *opts.temperatures})
    with tqdm(
        total=len(ids) * runs,
        desc="scoring acceptance",
        unit="prompt",
        file=progress_file,
        disable=None,
    ) as bar:
        t0 = time.monotonic()
        result = measure_acceptance(
            models["target"],
            models,
            opts.drafters,
            ids,
            opts.temperatures,
            max_new_tokens=max_new,
            seed=opts.seed,
            eos_id=getattr(tokenizer, "eos_id", None),
            sequences_prefix=opts.sequences_prefix,
            progress=bar,
            tree_shapes=opts.trees,
        )
        seconds = time.monotonic() - t0
    note = (
        f"Acceptance: {len(ids)} of {available} prompts from {Path(source).name}, up to "
        f"{max_new} generated tokens each, scored along the target's own text (greedy on "
        "T=0 text; exact rejection and typical at each T>0 on text sampled at T), chain "
        "rates from walking the text in windows of 8. Typical acceptance is lossy: its "
        "output is not distributed as the target's; its tv_distance is the total-variation "
        "distance of the first token it emits from p, averaged over drafting positions."
    )
    line = (
        f"  acceptance: {result.tokens_scored} positions scored in {seconds:.0f} s "
        f"({result.tokens_scored / max(seconds, 1e-9):.0f} per s)"
    )
    return result, line, note


def _overhead(opts, models, axes, clock, passes_profile, progress_file=None):
    """The engine's serving iterations beyond what the latency fits (``passes_profile``: the
    profile so far) predict for their passes, fitted, with the iterations' spread; summary
    line. The real engine serves waves of requests at the grid's smallest, middle and largest
    batch, prompts of the grid's shortest prefill and 48 generated tokens (fewer when the
    models' positions end sooner), k = 0 alone and k = 2, 4 with each draft model."""
    from tqdm import tqdm

    from specsim.costs import StepCosts
    from specsim.profiling.overhead import measure_overhead

    batches = sorted(axes["batch"])
    batches = sorted({batches[0], batches[len(batches) // 2], batches[-1]})
    windows = (2, 4)
    max_position = min(m.config.max_position for m in models.values())
    prompt = max(min(axes.get("prefill") or (32,)), 8)
    output = max(min(48, max_position - prompt - max(windows) - 2), 2)
    names = [d.name for d in opts.drafters if not d.is_ngram]
    alone = StepCosts(passes_profile, None)
    per_drafter = [StepCosts(passes_profile, name) for name in names]

    def costs(index: int | None) -> StepCosts:
        return alone if index is None else per_drafter[index]

    started = time.monotonic()
    with tqdm(desc="engine overhead waves", unit="wave", file=progress_file, disable=None) as bar:
        fit = measure_overhead(
            models["target"],
            [models[name] for name in names],
            costs,
            batches=batches,
            windows=windows,
            prompt=prompt,
            output=output,
            clock=clock,
            names=names,
            progress=bar,
        )
    line = (
        f"  overhead: {fit.describe()}; {len(fit.points)} points in "
        f"{time.monotonic() - started:.0f} s, fit within {fit.max_abs_error_s * 1e3:.2f} ms"
    )
    return fit, line


def _timing_note(opts, axes, timer, dtype_name) -> str:
    from specsim.profiling.overhead import OVERHEAD_WAVES

    if opts.device != "cpu":
        method = "CUDA events with synchronisation."
    elif timer.clock == "cpu":
        method = (
            "synchronous CPU passes timed by the process's CPU time (one torch thread), which "
            "leaves out time given to other processes: the latency of a dedicated core."
        )
    elif timer.clock == "reference":
        method = (
            "synchronous CPU passes timed by the process's CPU time (one torch thread), each "
            "rescaled to the machine's quiet speed, by a factor between the model's own "
            "decode at batch 1 after 128 tokens (provenance.speed_reference: the target's "
            "decode_s, a drafter's under drafters) and its prefill of a 96-token prompt, by the "
            "tokens the pass feeds, and the engine's own work by a host pass of sampling and "
            "verification (host_s); all re-timed every 0.25 s of profiling."
        )
    else:
        method = "synchronous CPU passes timed with perf_counter_ns (wall clock)."
    return (
        f"Latency measured on {opts.device} ({dtype_name}): grid batch {list(axes['batch'])} x "
        f"context {list(axes['context'])} x new tokens {list(axes['new'])}, prefill "
        f"{list(axes.get('prefill', ()))}; {timer.warmup} warm-up rounds and {timer.repeats} "
        f"timed rounds (every point once per round), median and IQR per point; {method} "
        "Overhead: the real serving engine's prefill and decode iterations beyond what the "
        "latency fits predict for their passes, served in waves at the grid's smallest, "
        "middle and largest batch (k = 0 with the target alone, k = 2 and 4 with each draft "
        f"model; {OVERHEAD_WAVES} rounds), median per batch and k, fitted by non-negative "
        "least squares; jitter: each iteration's measured / predicted time over its group's "
        "median, pooled, decode and prefill iterations apart, scaled to average 1."
    )


def measure_profile(opts: MeasureOptions, progress_file=None) -> MeasureReport:
    """Measure everything and return the validated profile, its side files and summary lines.
    Progress bars go to ``progress_file`` (default: the current ``sys.stderr``)."""
    from specsim.engine.clock import start_clock
    from specsim.models import load_tokenizer
    from specsim.profile import LoadedProfile
    from specsim.profiling.model_configs import shape_from_object
    from specsim.profiling.timing import (
        PassTimer,
        grid_points,
        parse_grid,
    )
    from specsim.profiling.writer import build_profile, model_spec, ngram_spec, today

    started = time.monotonic()
    progress_file = progress_file if progress_file is not None else sys.stderr
    dtype_name, dtype = check_options_device(opts)
    check_mtp_clock(opts)
    parse_grid(opts.grid, opts.device)  # a malformed grid fails before the models load
    check_model_configs(opts)
    models = load_models(opts, dtype)
    max_position = min(m.config.max_position for m in models.values())
    axes = parse_grid(opts.grid, opts.device, max_position)
    points = grid_points(axes)
    measure_accept = opts.acceptance and bool(opts.drafters)
    # Fail on a missing tokenizer before minutes of timing, not after.
    tokenizer = load_tokenizer(opts.target) if measure_accept else None
    repeats = opts.repeats or (7 if opts.device == "cpu" else 20)
    timing = None  # the reference clock's probes (a shared CPU)
    if opts.clock == "reference":
        from specsim.engine.speed_reference import ReferenceTiming

        drafter_models = {name: model for name, model in models.items() if name != "target"}
        timing = ReferenceTiming(models["target"], drafter_models)
    timer = PassTimer(
        opts.device,
        warmup=2,
        repeats=repeats,
        clock=opts.clock,
        normalise=timing.factor if timing is not None else None,
    )
    sections, lines, notes = _time_models(opts, models, points, timer, progress_file)

    def spec_of(name: str, kind: str):
        shape = shape_from_object(models[name].config, models[name].config.name or name)
        if name in mtp_names:  # the module alone; the pass reads the target's head too
            module = shape.mtp_shape()
            label = f"{shape.name} MTP module"
            spec = model_spec(module, kind, DTYPES[dtype_name], sections[name], label)
            return {**spec, "method": "mtp"}
        return model_spec(shape, kind, DTYPES[dtype_name], sections[name], shape.name)

    mtp_names = {d.name for d in opts.drafters if d.is_mtp}

    target_spec = spec_of("target", "target")
    model_specs = {d.name: spec_of(d.name, "draft_model") for d in opts.drafters if not d.is_ngram}
    passes = build_profile(
        {
            "version": 1,
            "name": opts.name,
            "provenance": {"source": "measured", "device": opts.device, "date": today()},
            "hardware": hardware_block(opts.device),
            "target": target_spec,
            "drafters": model_specs,
        },
        opts.name,
    )
    overhead, overhead_line = _overhead(
        opts,
        models,
        axes,
        timing.clock() if timing is not None else start_clock(opts.clock, opts.device),
        LoadedProfile(passes, "<the latency fits>"),
        progress_file,
    )
    lines.append(overhead_line)
    for name, terms in overhead.drafters.items():
        model_specs[name] = {**model_specs[name], "overhead": terms}

    result = None
    if measure_accept:
        result, line, note = _acceptance(opts, models, tokenizer, progress_file)
        lines.append(line)
        notes += [*result.notes, note]
    drafter_specs = {}
    for d in opts.drafters:
        if d.is_ngram:
            step_s = result.lookup_seconds_per_step(d.name) if result is not None else 0.0
            drafter_specs[d.name] = ngram_spec(d.ngram, step_s)
        else:
            drafter_specs[d.name] = model_specs[d.name]
    if any(d.is_ngram for d in opts.drafters):
        notes.append(
            "Prompt lookup draft_step_s: this implementation's host-side n-gram search per "
            "sequence per step, measured over the scored text"
            + ("" if result is not None else " (not measured without acceptance: 0)")
            + "; vLLM's own lookup differs, edit it if yours is not negligible."
        )
    if timing is not None:
        slowdown = timing.slowdown()
        if slowdown < SLOW_REFERENCE:
            lines.append(
                f"  warning: the speed probes found the machine x{slowdown:.2f} as slow as at "
                "its reference for most of the profiling: the references were taken while it "
                "was slow, and every pass was rescaled from far off; profile again when it is "
                "steadier"
            )
    data = {
        "version": 1,
        "name": opts.name,
        "provenance": {
            "source": "measured",
            "device": device_name(opts.device),
            "date": today(),
            "software": software(),
            "command": opts.command,
            "notes": " ".join([_timing_note(opts, axes, timer, dtype_name), *notes]),
            "profiling_seconds": time.monotonic() - started,
            "speed_reference": _speed_reference(timing, overhead.pass_scale),
        },
        "hardware": hardware_block(opts.device),
        "target": target_spec,
        "drafters": drafter_specs,
        "overhead": {**overhead.terms, "source": "measured"},
        "jitter": _jitter(overhead.jitter, overhead.points, prefill=False),
        "prefill_jitter": _jitter(overhead.prefill_jitter, overhead.points, prefill=True),
        "acceptance": result.entries if result is not None else [],
    }
    trees = _kept_trees(opts, result)
    if trees:
        data["tree_acceptance"] = trees
    profile = build_profile(data, opts.name)
    lines.insert(0, f"profiled in {data['provenance']['profiling_seconds']:.0f} s")
    side_files = result.side_files if result is not None else {}
    return MeasureReport(profile=profile, side_files=side_files, lines=lines)


def measure_tree_acceptance(opts: MeasureOptions, progress_file=None) -> list[dict]:
    """The ``tree_acceptance`` entries of ``opts.trees`` alone (no timing): the models and the
    prompt set loaded and scored as ``measure_profile`` does."""
    from specsim.models import load_tokenizer

    _, dtype = check_options_device(opts)
    check_model_configs(opts)
    models = load_models(opts, dtype)
    tokenizer = load_tokenizer(opts.target)
    progress_file = progress_file if progress_file is not None else sys.stderr
    result, _, _ = _acceptance(opts, models, tokenizer, progress_file)
    return _kept_trees(opts, result)


def _kept_trees(opts: MeasureOptions, result) -> list[dict]:
    trees = [] if result is None else result.tree_entries
    if opts.tree_drafts:
        trees = [t for t in trees if t["drafts"] in opts.tree_drafts]
    return trees


def _speed_reference(timing, pass_scale: float | None) -> dict | None:
    """``provenance.speed_reference``: the reference clock's block, or on the plain CPU clock
    only the overhead waves' pass speed (nothing on the wall clock)."""
    if timing is not None:
        return timing.block(pass_scale)
    return {"overhead_pass_scale": pass_scale} if pass_scale is not None else None


def _jitter(quantiles: list[float], points, prefill: bool) -> dict | None:
    if not quantiles:
        return None
    samples = sum(len(p.spread) for p in points if p.is_prefill == prefill)
    return {"quantiles": quantiles, "samples": samples, "source": "measured"}
