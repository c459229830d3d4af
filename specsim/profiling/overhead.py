"""The engine's overhead per iteration, measured on the real serving loop and fitted (torch).

A latency fit predicts bare forward passes; the engine's iteration also samples, verifies, rolls
its caches back and does the serving loop's bookkeeping, and its passes run as the loop runs
them: rows of different lengths padded to the longest, the drafter's passes cache-cold after the
target's. ``measure_overhead`` serves waves of
identical requests on the real engine at a few batch sizes and windows k, for the target alone
and with every draft model (``specsim.engine.waves.serve_fixed_batch``), and compares each
iteration in its log with what the latency fits predict for its passes (``StepCosts`` of a
profile without overhead), at the speed at which the waves' target-alone passes ran against
those fits (``wave_pass_scale``: the machine's drift between the two measurements, which is
not the engine's). ``fit_overhead`` fits the profile's formula (see
``specsim.profile.schema.Overhead``)::

    decode:  per_step + per_sequence * B + k * (per_draft_step + per_draft_token * B)
    prefill: the same at k = 0, + per_prefill + per_prefill_token * prompt tokens

to the median difference per (kind, batch, k) by non-negative least squares, relative to the
iterations' time so large batches do not drown the small ones, and weighed by how many
iterations each median is over. Steps that ran fewer drafter passes than their window (every
row near its end) are left out. The same iterations give the iteration-time spread
(``jitter_quantiles``): each iteration's measured / predicted time over its group's median,
pooled and scaled to average 1, for decode iterations and apart from them for prefill
iterations (which vary less: see ``specsim.simulation.jitter``). The measurements behind these
choices: docs/notes/2026-11-29-engine-overhead-fit.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

TERMS = ("per_step_s", "per_sequence_s", "per_draft_step_s", "per_draft_token_s")
DRAFT_TERMS = ("per_draft_step_s", "per_draft_token_s")
STEP_TERMS = ("per_step_s", "per_sequence_s")
SPECULATIVE_TERMS = ("per_speculative_step_s", "per_speculative_sequence_s")
PREFILL_TERMS = ("per_prefill_s", "per_prefill_token_s")
# Multipliers at probabilities 0, 0.01, ..., 1: the last step spreads its mass linearly up to the
# largest sample, so coarser steps let one outlier lift the mean.
JITTER_QUANTILES = 101
MIN_DECODES = 5  # decode iterations at one batch size for a point (waves end ragged)
MIN_PREFILL_SPREAD = 20  # prefill iterations for a spread of their own (3 per wave group)
# Rounds of waves: with fewer, the fitted terms moved by a third from one measurement to the next.
OVERHEAD_WAVES = 8


@dataclass(frozen=True)
class OverheadPoint:
    batch: int
    k: int
    seconds: float  # the iteration's time beyond its forward passes
    drafter: str | None = None  # the draft model the point ran with (None: target alone)
    prompt_tokens: int = 0  # > 0: a prefill iteration over this many prompt tokens in all
    spread: tuple[float, ...] = ()  # each iteration's measured / predicted over their median
    iteration_s: float = 0.0  # the iterations' median time (0: unknown)
    iterations: int = 1  # how many iterations the median is over

    @property
    def is_prefill(self) -> bool:
        return self.prompt_tokens > 0


@dataclass(frozen=True)
class OverheadFit:
    terms: dict[str, float]  # TERMS and PREFILL_TERMS
    points: list[OverheadPoint]
    max_abs_error_s: float  # largest |fit - measured| over the decode points
    # Per draft model, its own draft and prefill terms (fitted on its points alone): a bigger
    # drafter's passes lose more to running cache-cold in the loop, so one shared term misfits
    # both.
    drafters: dict[str, dict[str, float]] = field(default_factory=dict)
    jitter: list[float] = field(default_factory=list)  # decode iterations: jitter_quantiles
    prefill_jitter: list[float] = field(default_factory=list)  # prefill iterations
    # The waves' decode passes against the latency fits' prediction (see ``wave_pass_scale``),
    # taken out of every decode point's gap (None: not known, on the wall clock).
    pass_scale: float | None = None

    def predict(self, batch: int, k: int) -> float:
        return float((_design([batch], [k]) @ np.asarray([self.terms[t] for t in TERMS]))[0])

    def describe(self) -> str:
        t = self.terms
        text = (
            f"{t['per_step_s'] * 1e3:.3f} ms per step + {t['per_sequence_s'] * 1e3:.3f} ms per "
            f"sequence + k x ({t['per_draft_step_s'] * 1e3:.3f} ms + "
            f"{t['per_draft_token_s'] * 1e3:.3f} ms per sequence); prefill + "
            f"{t['per_prefill_s'] * 1e3:.3f} ms + {t['per_prefill_token_s'] * 1e6:.2f} us per "
            "token"
        )
        for name, own in self.drafters.items():
            text += (
                f"; {name}: {own['per_speculative_step_s'] * 1e3:.3f} ms per step + "
                f"{own['per_speculative_sequence_s'] * 1e3:.3f} ms per sequence + "
                f"k x ({own['per_draft_step_s'] * 1e3:.3f} ms + "
                f"{own['per_draft_token_s'] * 1e3:.3f} ms per sequence), prefill + "
                f"{own['per_prefill_s'] * 1e3:.3f} ms + "
                f"{own['per_prefill_token_s'] * 1e6:.2f} us per token"
            )
        if self.pass_scale is not None:
            text += f"; the waves' decode passes ran x{self.pass_scale:.3f} of the latency fits"
        for kind, q in (("decode", self.jitter), ("prefill", self.prefill_jitter)):
            if q:
                text += (
                    f"; {kind} iteration time p10..p90 x{np.interp(0.1, _probs(q), q):.2f}.."
                    f"x{np.interp(0.9, _probs(q), q):.2f} of its mean"
                )
        return text


def _probs(quantiles) -> np.ndarray:
    return np.linspace(0.0, 1.0, len(quantiles))


def jitter_quantiles(points: Sequence[OverheadPoint]) -> list[float]:
    """The pooled spread of the points' timed iterations around their medians, as multipliers
    at ``JITTER_QUANTILES`` evenly spaced probabilities, scaled to average 1 as the simulator
    draws them (empty without any spread).

    Why average 1 and not median 1: the fitted terms give a group's median, and the simulator's
    mean iteration is that times the multipliers' mean. The profiler's waves run right-skewed
    (each opens with a prefill of every row; other tenants' bursts) where the engine's serving
    iterations do not, and the skew made every prediction that much slow."""
    ratios = np.concatenate([np.asarray(p.spread, dtype=float) for p in points] or [[]])
    if ratios.size < 2:
        return []
    probs = np.linspace(0.0, 1.0, JITTER_QUANTILES)
    quantiles = np.quantile(ratios, probs)
    quantiles /= np.trapezoid(quantiles, probs)  # the mean of a linear-interpolation draw
    return [round(float(v), 4) for v in quantiles]


def _design(batches: Sequence[int], ks: Sequence[int]) -> np.ndarray:
    b = np.asarray(batches, dtype=float)
    k = np.asarray(ks, dtype=float)
    return np.stack([np.ones_like(b), b, k, k * b], axis=1)


def fit_overhead(points: Sequence[OverheadPoint], pass_scale: float | None = None) -> OverheadFit:
    """Non-negative least squares of the overhead formula over all the decode points, and of
    each labelled draft model's points alone for its own draft terms; the prefill terms from
    the prefill points beyond what the decode formula already charges them (the shared ones
    from the target's own points, or every point when it has none). Terms the points cannot
    identify (no k > 0: the draft terms; no prefill points: the prefill terms) stay 0. A
    negative measured difference (noise around a tiny overhead) counts as 0."""
    decode = [p for p in points if not p.is_prefill]
    prefill = [p for p in points if p.is_prefill]
    shared = _fit_terms(decode)
    terms = dict(shared.terms)
    # The per-step terms from the target's own steps where there are some: a drafter's steps
    # carry costs of their own (below), which would otherwise leak into everyone's per step.
    alone_decode = [p for p in decode if p.drafter is None]
    if alone_decode and any(p.drafter is not None for p in decode):
        steps = _fit_terms(alone_decode).terms
        terms.update({t: steps[t] for t in STEP_TERMS})
    alone = [p for p in prefill if p.drafter is None] or prefill
    terms.update(_fit_prefill(alone, terms))
    names = sorted({p.drafter for p in points if p.drafter is not None})
    drafters = {}
    for name in names:
        drafters[name] = _own_step_terms([p for p in decode if p.drafter == name], terms)
        own_prefill = [p for p in prefill if p.drafter == name]
        drafters[name].update(
            _fit_prefill(own_prefill, terms)
            if own_prefill
            else {t: terms[t] for t in PREFILL_TERMS}
        )
    prefill_spread = sum(len(p.spread) for p in prefill)
    return OverheadFit(
        terms,
        list(points),
        shared.max_abs_error_s,
        drafters,
        jitter_quantiles(decode),
        jitter_quantiles(prefill) if prefill_spread >= MIN_PREFILL_SPREAD else [],
        pass_scale,
    )


def _fit_prefill(points: Sequence[OverheadPoint], decode_terms: dict[str, float]):
    """``per_prefill + per_prefill_token * tokens`` fitted (non-negative, relative to each
    point's size) to what the prefill points take beyond ``per_step + per_sequence * B``."""
    from scipy.optimize import nnls

    if not points:
        return dict.fromkeys(PREFILL_TERMS, 0.0)
    tokens = np.asarray([p.prompt_tokens for p in points], dtype=float)
    charged = decode_terms["per_step_s"] + decode_terms["per_sequence_s"] * np.asarray(
        [p.batch for p in points], dtype=float
    )
    extra = np.maximum(np.asarray([p.seconds for p in points]) - charged, 0.0)
    design = np.stack([np.ones_like(tokens), tokens], axis=1)
    if np.all(tokens == tokens[0]):
        design = design[:, :1]  # one prompt size cannot tell the two terms apart
    weight = 1.0 / tokens
    coef, _ = nnls(design * weight[:, None], extra * weight)
    full = np.zeros(2)
    full[: len(coef)] = coef
    return dict(zip(PREFILL_TERMS, map(float, full), strict=True))


def _own_step_terms(points: Sequence[OverheadPoint], terms: dict) -> dict[str, float]:
    """A drafter's draft terms and per-speculative-step terms: the same formula fitted to what
    its speculative steps (k > 0) take beyond the shared per-step terms; a step's constant
    (the target's pass running slower in such a step than alone) and its k-proportional part
    (each draft pass) come apart because every batch is measured at two values of k."""
    speculative = [p for p in points if p.k]
    if not speculative:
        return {**{t: terms[t] for t in DRAFT_TERMS}, **dict.fromkeys(SPECULATIVE_TERMS, 0.0)}
    base = terms["per_step_s"], terms["per_sequence_s"]
    beyond = [replace(p, seconds=p.seconds - base[0] - base[1] * p.batch) for p in speculative]
    own = _fit_terms(beyond).terms
    return {
        **{t: own[t] for t in DRAFT_TERMS},
        "per_speculative_step_s": own["per_step_s"],
        "per_speculative_sequence_s": own["per_sequence_s"],
    }


def _fit_terms(points: Sequence[OverheadPoint]) -> OverheadFit:
    from scipy.optimize import nnls

    if not points:
        raise ValueError("no overhead points to fit")
    design = _design([p.batch for p in points], [p.k for p in points])
    seconds = np.maximum([p.seconds for p in points], 0.0)
    used = [i for i in range(len(TERMS)) if np.any(design[:, i] != design[0, i]) or i == 0]
    if not any(p.k for p in points):
        used = [i for i in used if i < 2]
    # Errors count relative to the iterations the overhead is part of: each point weighted by
    # 1 / their time, or by 1 / (1 + B)(1 + k), a stand-in for it (which underweighs large
    # batches), where that is not known.
    iteration = np.asarray([p.iteration_s for p in points], dtype=float)
    if np.all(iteration > 0):
        weight = 1.0 / iteration
    else:
        weight = 1.0 / ((1.0 + design[:, 1]) * (1.0 + design[:, 2]))
    # And by the square root of how many iterations each median is over (its variance goes as
    # 1 / n): a wave's ragged end gives many points of few iterations, which would pull the fit.
    weight = weight * np.sqrt([max(p.iterations, 1) for p in points])
    coef, _ = nnls(design[:, used] * weight[:, None], seconds * weight)
    full = np.zeros(len(TERMS))
    full[used] = coef
    error = float(np.max(np.abs(design @ full - seconds)))
    return OverheadFit(dict(zip(TERMS, map(float, full), strict=True)), list(points), error)


def measure_overhead(
    target,
    drafters: Sequence,
    costs: Callable[[int | None], object],
    batches: Sequence[int] = (1, 4, 8),
    windows: Sequence[int] = (2, 4),
    prompt: int = 32,
    output: int = 48,
    waves: int = OVERHEAD_WAVES,
    clock=None,
    names: Sequence[str] | None = None,
    progress=None,
) -> OverheadFit:
    """Serve on the real engine at every batch (k = 0 with the target alone; every k in
    ``windows`` with each draft model in ``drafters``) and fit the overhead terms to what its
    iterations take beyond ``costs(drafter_index or None)`` (a ``StepCosts`` of the latency
    fits alone) predicts. ``names`` label the drafters' points, so each gets its own terms;
    ``clock``: the engine's clock (``specsim.engine.clock``; default wall); ``progress`` (a
    tqdm bar) is reset to the number of waves and updated after each."""
    from specsim.engine.waves import serve_fixed_batch

    drafting = tuple(k for k in windows if k)
    runs = [(None, None, (0,))] + [(i, d, drafting) for i, d in enumerate(drafters)]
    configs = [(i, d, batch, k) for i, d, ks in runs for batch in batches for k in ks]
    # One wave of every configuration per round (its own seed), ``waves`` rounds: each
    # configuration's iterations then span the whole measurement, not one phase of a machine
    # whose speed drifts.
    logs = {}
    if progress is not None:
        progress.reset(total=waves * len(configs))
    for wave in range(waves):
        for config in configs:
            index, drafter, batch, k = config
            log = serve_fixed_batch(target, drafter, batch, k, prompt, output, 1, clock, wave)
            logs[config] = logs[config].extend(log) if config in logs else log
            if progress is not None:
                progress.update(1)
    alone = [log for (index, *_), log in logs.items() if index is None]
    scale = wave_pass_scale(alone, costs(None))
    points: list[OverheadPoint] = []
    for (index, _, _, _), log in logs.items():
        name = None if index is None else (names[index] if names else f"drafter-{index}")
        points += log_points(log, costs(index), name, scale)
    return fit_overhead(points, scale)


def wave_pass_scale(logs, costs) -> float | None:
    """How fast the waves' target passes ran against the latency fits' prediction: the median,
    over the target-alone decode iterations, of the target pass's measured / predicted time
    (None without the engine's split of its time, which only the CPU clocks keep).

    The grid and the waves run minutes apart, and on a shared machine the speed references
    that rescale both follow its drift only in part. A gap of iteration minus predicted passes
    then also holds that drift times the passes, which can outweigh the engine's own work.
    Outside a speculative step a pass in the loop runs as it does alone, so their ratio in the
    waves is the drift; every gap is taken against the passes at this speed. What stays is the
    engine's own work, and what a loop costs the passes beyond that: a speculative step's slower
    target pass, and its growth with the batch."""
    from specsim.engine.log_groups import engine_log_groups

    ratios = []
    for log in logs:
        for (kind, _, _), group in engine_log_groups(log, costs).items():
            if kind != "decode" or group.measured_parts is None:
                continue
            ratios.append(group.measured_parts[:, 0] / group.predicted_parts[:, 0])
    if not ratios:
        return None
    return float(np.median(np.concatenate(ratios)))


def log_points(
    log, costs, name: str | None, pass_scale: float | None = None
) -> list[OverheadPoint]:
    """Overhead points from an engine iteration log: per (kind, k, batch), the median gap
    (decode groups of ``MIN_DECODES`` iterations or more; every prefill group), with each
    iteration's measured / predicted over the group's median as its spread. A decode gap is
    measured - predicted passes x ``pass_scale`` (1 when None). A prefill gap, where the
    engine kept the split of its time, is its own work alone: each wave opens with a prefill
    that runs cache-cold after the other configurations' waves, unlike continuous serving, so
    the passes' gap would charge every prefill with that cold start."""
    from specsim.engine.log_groups import engine_log_groups

    points = []
    for (kind, k, batch), group in engine_log_groups(log, costs).items():
        # A step whose rows were all too near their ends to draft k tokens ran fewer drafter
        # passes than the formula charges: its gap would read a k-pass step as cheap.
        used = group.full
        measured, predicted, new = group.measured[used], group.predicted[used], group.new[used]
        if kind == "decode" and len(measured) < MIN_DECODES:
            continue
        ratio = measured / predicted
        spread = tuple(float(v) for v in ratio / np.median(ratio)) if len(ratio) > 1 else ()
        if kind == "prefill" and group.measured_parts is not None:
            gap = float(np.median(group.measured_parts[used, 2]))
        else:
            gap = float(np.median(measured - predicted * (pass_scale or 1.0)))
        tokens = int(np.median(new)) if kind == "prefill" else 0
        iteration = float(np.median(measured))
        points.append(OverheadPoint(batch, k, gap, name, tokens, spread, iteration, len(measured)))
    return points
