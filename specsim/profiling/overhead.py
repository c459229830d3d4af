"""The engine's overhead per iteration, measured on the real serving loop and fitted (torch).

A latency fit predicts bare forward passes; the engine's iteration also samples, verifies, rolls
its caches back and does the serving loop's bookkeeping. ``measure_overhead`` times the engine's
own serving iterations (``step_overhead``, ``prefill_overhead``) at a few batch sizes and windows
k, for every draft model, and takes away what the latency fits predict for their passes
(``predict_passes``; without it, the same passes timed alone). Against the fits, the overhead
also holds what the fits miss inside the serving loop: passes there run cache-cold after the
other model's and after sampling, which a grid that times each model on its own cannot see (on a
CPU the drafter's passes in the loop took about 1.2x their isolated time). ``fit_overhead`` fits
the profile's formula (see ``specsim.profile.schema.Overhead``)::

    decode:  per_step + per_sequence * B + k * (per_draft_step + per_draft_token * B)
    prefill: the same at k = 0, + per_prefill + per_prefill_token * prompt tokens

by non-negative least squares, relative to each point's size so large batches do not drown the
small ones. The iteration-time spread (``jitter_quantiles``) comes from runs of serving
iterations timed back to back, as the loop runs them (decode at the middle batch and the largest
k for each draft model; prefill at the smallest batch and prompt): each over its run's median,
pooled.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

TERMS = ("per_step_s", "per_sequence_s", "per_draft_step_s", "per_draft_token_s")
DRAFT_TERMS = ("per_draft_step_s", "per_draft_token_s")
PREFILL_TERMS = ("per_prefill_s", "per_prefill_token_s")
# Multipliers at probabilities 0, 0.01, ..., 1. Finer than the sample needs in the middle, but
# the last step spreads its mass linearly up to the largest sample: at 0.05 steps one 2.3x
# outlier in 200 iterations put 5 % of the mass near 1.7x and the mean 3 % too high.
JITTER_QUANTILES = 101
SPREAD_DECODES = 60  # back-to-back decode iterations per draft model, for the spread
SPREAD_PREFILLS = 30  # back-to-back prefill iterations per model set


@dataclass(frozen=True)
class OverheadPoint:
    batch: int
    k: int
    seconds: float  # the iteration's time beyond its forward passes
    drafter: str | None = None  # the draft model the point ran with (None: target alone)
    prompt_tokens: int = 0  # > 0: a prefill iteration over this many prompt tokens in all
    spread: tuple[float, ...] = ()  # back-to-back iterations, each over their median

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
    jitter: list[float] = field(default_factory=list)  # see jitter_quantiles

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
                f"; {name}: k x ({own['per_draft_step_s'] * 1e3:.3f} ms + "
                f"{own['per_draft_token_s'] * 1e3:.3f} ms per sequence), prefill + "
                f"{own['per_prefill_s'] * 1e3:.3f} ms + "
                f"{own['per_prefill_token_s'] * 1e6:.2f} us per token"
            )
        if self.jitter:
            q = self.jitter
            text += (
                f"; iteration time p10..p90 x{np.interp(0.1, _probs(q), q):.2f}.."
                f"x{np.interp(0.9, _probs(q), q):.2f} of its median"
            )
        return text


def _probs(quantiles) -> np.ndarray:
    return np.linspace(0.0, 1.0, len(quantiles))


def jitter_quantiles(points: Sequence[OverheadPoint]) -> list[float]:
    """The pooled spread of the points' timed iterations around their medians, as multipliers
    at ``JITTER_QUANTILES`` evenly spaced probabilities (empty without any spread)."""
    ratios = np.concatenate([np.asarray(p.spread, dtype=float) for p in points] or [[]])
    if ratios.size < 2:
        return []
    quantiles = np.quantile(ratios, np.linspace(0.0, 1.0, JITTER_QUANTILES))
    return [round(float(v), 4) for v in quantiles]


def _design(batches: Sequence[int], ks: Sequence[int]) -> np.ndarray:
    b = np.asarray(batches, dtype=float)
    k = np.asarray(ks, dtype=float)
    return np.stack([np.ones_like(b), b, k, k * b], axis=1)


def fit_overhead(points: Sequence[OverheadPoint]) -> OverheadFit:
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
    alone = [p for p in prefill if p.drafter is None] or prefill
    terms.update(_fit_prefill(alone, terms))
    names = sorted({p.drafter for p in points if p.drafter is not None})
    drafters = {}
    for name in names:
        own_decode = [p for p in decode if p.drafter == name and p.k]
        own = _fit_terms(own_decode).terms if own_decode else terms
        drafters[name] = {t: own[t] for t in DRAFT_TERMS}
        own_prefill = [p for p in prefill if p.drafter == name]
        drafters[name].update(
            _fit_prefill(own_prefill, terms)
            if own_prefill
            else {t: terms[t] for t in PREFILL_TERMS}
        )
    return OverheadFit(
        terms, list(points), shared.max_abs_error_s, drafters, jitter_quantiles(points)
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


def _fit_terms(points: Sequence[OverheadPoint]) -> OverheadFit:
    from scipy.optimize import nnls

    if not points:
        raise ValueError("no overhead points to fit")
    design = _design([p.batch for p in points], [p.k for p in points])
    seconds = np.maximum([p.seconds for p in points], 0.0)
    used = [i for i in range(len(TERMS)) if np.any(design[:, i] != design[0, i]) or i == 0]
    if not any(p.k for p in points):
        used = [i for i in used if i < 2]
    # Each row weighted by 1 / its size (1 + B)(1 + k): errors count relative to the point.
    weight = 1.0 / ((1.0 + design[:, 1]) * (1.0 + design[:, 2]))
    coef, _ = nnls(design[:, used] * weight[:, None], seconds * weight)
    full = np.zeros(len(TERMS))
    full[used] = coef
    error = float(np.max(np.abs(design @ full - seconds)))
    return OverheadFit(dict(zip(TERMS, map(float, full), strict=True)), list(points), error)


def measure_overhead(
    target,
    drafters: Sequence,
    context: int,
    batches: Sequence[int] = (1, 4, 8),
    windows: Sequence[int] = (0, 2, 4),
    repeats: int = 9,
    clock: str = "wall",
    normalise=None,
    predict_passes=None,
    names: Sequence[str] | None = None,
    prompts: Sequence[int] = (),
    predict_prefill=None,
) -> OverheadFit:
    """Time the engine's serving iteration at every batch x k, for each draft model in
    ``drafters`` (k = 0 alone without one), and fit the overhead terms to what it takes beyond
    ``predict_passes(drafter_index, batch, k, context)`` (the latency fits' seconds for its
    passes; by default the passes timed alone). ``names`` label the drafters' points, so each
    gets its own draft terms. With ``prompts`` (prompt lengths), also prefill iterations of
    every batch x prompt, for the target alone and with each draft model, beyond
    ``predict_prefill(drafter_index or None, batch, prompt)``."""
    from specsim.engine.overhead import prefill_overhead, step_overhead

    timing = {"repeats": repeats, "clock": clock, "normalise": normalise}
    middle = sorted(batches)[len(batches) // 2]
    points = []
    for index, drafter in enumerate(drafters or [None]):
        name = names[index] if names and drafter is not None else None
        ks = windows if drafter is not None else (0,)
        for batch in batches:
            for k in ks:
                run = SPREAD_DECODES if (batch, k) == (middle, max(ks)) else 0
                result = step_overhead(
                    target, drafter, batch, k, context, **timing, consecutive=run
                )
                if predict_passes is None:
                    seconds = result.overhead_s
                else:
                    seconds = result.step_s - predict_passes(index, batch, k, context)
                points.append(OverheadPoint(batch, k, seconds, name, spread=_spread(result)))
    models = [(None, None)] + [(i, d) for i, d in enumerate(drafters) if d is not None]
    for index, drafter in models if prompts else ():
        name = None if index is None else (names[index] if names else f"drafter-{index}")
        for batch in batches:
            for prompt in prompts:
                run = SPREAD_PREFILLS if (batch, prompt) == (min(batches), min(prompts)) else 0
                result = prefill_overhead(target, drafter, batch, prompt, **timing, consecutive=run)
                if predict_prefill is None:
                    seconds = result.overhead_s
                else:
                    seconds = result.step_s - predict_prefill(index, batch, prompt)
                points.append(
                    OverheadPoint(batch, 0, seconds, name, batch * prompt, _spread(result))
                )
    return fit_overhead(points)


def _spread(result) -> tuple[float, ...]:
    samples = np.asarray(result.samples_s, dtype=float)
    if samples.size < 2:
        return ()
    return tuple(float(v) for v in samples / np.median(samples))
