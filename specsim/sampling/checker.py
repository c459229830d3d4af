"""The losslessness checker: an exact result plus a Monte Carlo test of the real implementation.

``check_sampler`` judges a verifier on a seeded toy target/drafter pair whose p and q depend on the
prefix (``problem.ToyModels``), over the whole window: the first k + 1 emitted tokens, so every
draft position and the bonus token.

1. **Exact result**, against what the target alone produces:
   - a built-in verifier or control: its closed form (numpy, float64), the exact joint of the
     window by enumerating every draft path and every accept/reject outcome, chained over steps
     from the prompt; exact means within 1e-12;
   - a callable: ``enumeration.enumerate_step``, the exact distribution of its step from the
     prompt over every draft path and every outcome of its uniforms (it is deterministic given
     them), continued by the target; exact means within the rounding of its input dtype
     (``callable_tolerance``).
   The total-variation distance is reported either way.
2. **Monte Carlo** (torch; any verifier): many generations at once through the real batched
   implementation; a Cressie-Read test of the first j emitted tokens for each j = 1..k+1, each at
   level alpha / (k + 1), with the sample size, seed and the smallest TV distance each detects with
   99% power (``stats.window_tests``).

What "lossless" means: for ``rejection`` (and any stochastic verifier), the emitted tokens are
distributed exactly as sampling from the target's processed p. For ``greedy`` it means the output
equals target-only greedy decoding (argmax at every step). ``typical`` (Medusa typical acceptance)
is lossy by design; the checker reports how far it is from the target.

A third-party verifier is a callable with the signature ``harness`` documents (processed
probabilities, or raw logits with ``inputs="logits"``), named in the CLI as
``package.module:function``; one with other tensor conventions is wrapped by an adapter
(docs/guide/check-verifier.md shows one, tested in ``tests/test_checker_monte_carlo.py``).

A sampler that draws its own random numbers instead of using the uniforms it is given has no
enumeration (the check says so) and is judged by the Monte Carlo test alone. An output that
breaks the contract is a verdict (``malformed``), not an exception.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from specsim.bounds import MIN_FACTOR, MIN_LEVEL
from specsim.errors import SpecsimError
from specsim.sampling import reference, stats
from specsim.sampling.kinds import DEFAULT_VERIFIER
from specsim.sampling.problem import DRAFTERS, Processing, ToyModels
from specsim.sampling.subjects import Subject, subject_for

EXACT_TOLERANCE = 1e-12
MAX_VOCAB = 16
MAX_K = 4
MAX_WINDOW_CELLS = 1 << 16  # vocab^(k+1): the whole window's joint table
NO_TORCH = "skipped: torch is not installed (pip install 'specsim-llm[torch]')"


@dataclass(frozen=True)
class SamplerCheck:
    """The verdict and the evidence (exact result, then Monte Carlo), and the set-up."""

    verifier: str
    description: str
    lossless: bool
    lossy_by_design: bool
    negative_control: bool  # a known-wrong verifier that the check must flag
    reference: str  # "target sampling" or "target greedy decoding"
    judged_tokens: int  # the whole window: k + 1 emitted tokens
    exact_method: str | None  # "closed form", "enumeration", or None (not available)
    exact_scope: str | None  # what the exact result covers
    exact_tolerance: float  # largest |error| that counts as exact
    closed_form_max_abs_error: float | None  # None: no exact result
    tv_distance: float | None  # exact, on the whole window
    exact_note: str | None  # why there is no exact result
    enumeration_cases: int | None  # draft paths enumerated for a callable
    malformed: dict[str, Any] | None  # the verifier broke its output contract: why, which rows
    p_value: float | None  # the window tests' Bonferroni p-value; None: Monte Carlo skipped
    statistic: float | None  # whole-window test; None also when an impossible outcome was seen
    dof: int | None
    impossible_samples: int | None  # samples outside the target's support
    detectable_tv: float | None  # whole window: smallest TV detected with `power`
    window_tests: list[dict[str, Any]] | None  # one Cressie-Read test per prefix of the window
    power: float
    alpha: float
    samples: int
    seed: int
    problem_seed: int
    vocab: int
    k: int
    temperature: float
    top_k: int
    top_p: float
    drafter: str
    ragged: bool
    inputs: str  # "probs" or "logits": what the verifier was given
    dtype: str  # the verifier's input dtype (Monte Carlo and enumeration)
    monte_carlo_note: str | None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def check_sampler(
    verifier: str | Callable = DEFAULT_VERIFIER,
    *,
    vocab: int = 8,
    k: int = 3,
    samples: int = 200_000,
    seed: int = 0,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    drafter: str = "sample",
    ragged: bool = False,
    alpha: float = 0.01,
    power: float = 0.99,
    problem_seed: int = 0,
    greedy_reference: bool = False,
    lossy_by_design: bool = False,
    inputs: str = "probs",
    dtype: str = "float32",
) -> SamplerCheck:
    """Check a verifier (a built-in or control name, ``module:function``, or a callable).

    ``verifier``: a name from ``kinds.VERIFIER_KINDS``, a control name from ``controls.CONTROLS``,
    a ``package.module:function`` (or ``file.py:function``) name, or a callable with the
    verifier signature (``harness`` documents it; ``inputs="logits"`` hands it raw logits and
    the processing). ``greedy_reference=True`` judges a callable against greedy decoding,
    ``lossy_by_design=True`` marks it as meant to be lossy. ``ragged=True`` draws each step's
    number of drafts uniformly from 0..k. ``samples=0`` skips the Monte Carlo test; it is also
    skipped, with a note, when torch is not installed. The whole window of k + 1 emitted tokens
    is judged. The verdict is lossless only if every test that ran passed: the exact result
    within ``exact_tolerance`` and every window Cressie-Read test at level alpha / (k + 1).
    """
    _validate(vocab, k, samples, temperature, top_k, top_p, drafter, alpha, power, inputs, dtype)
    check_seeds(seed, problem_seed)
    subject = subject_for(verifier, greedy_reference, lossy_by_design)
    processing = Processing(float(temperature), int(top_k), float(top_p))
    _check_subject_fits(subject, processing, drafter, inputs)
    models = ToyModels.make(vocab, problem_seed)
    window = k + 1
    p_table = models.tables(processing).p
    target = reference.target_distribution(
        p_table, models.prompt, window, greedy=subject.greedy_reference
    )
    counts = tuple(range(k + 1)) if ragged else (k,)
    setup = _Setup(subject, models, processing, drafter, k, counts, inputs, dtype, seed)
    exact = _exact(setup, target)
    mc = _monte_carlo(setup, samples, target, alpha, power, exact.pop("malformed"))
    malformed = mc.pop("malformed")
    verdicts = exact_verdicts(exact, mc, malformed, alpha)
    if not verdicts:
        raise SpecsimError(
            "nothing could be run: a verifier callable needs torch for its enumeration and its "
            "Monte Carlo test",
            key="verifier",
            fix="install torch (pip install 'specsim-llm[torch]')",
        )
    return SamplerCheck(
        verifier=subject.name,
        description=subject.description,
        lossless=all(verdicts),
        lossy_by_design=subject.lossy_by_design,
        negative_control=subject.negative_control,
        reference="target greedy decoding" if subject.greedy_reference else "target sampling",
        judged_tokens=window,
        malformed=None if malformed is None else malformed.to_json(),
        power=power,
        alpha=alpha,
        samples=samples if mc["p_value"] is not None else 0,
        seed=seed,
        problem_seed=problem_seed,
        vocab=vocab,
        k=k,
        temperature=processing.temperature,
        top_k=processing.top_k,
        top_p=processing.top_p,
        drafter=drafter,
        ragged=ragged,
        inputs=inputs,
        dtype=dtype,
        **exact,
        **mc,
    )


@dataclass(frozen=True)
class _Setup:
    subject: Subject
    models: ToyModels
    processing: Processing
    drafter: str
    k: int
    draft_counts: tuple[int, ...]
    inputs: str
    dtype: str
    seed: int

    def tables(self):
        from specsim.sampling.harness import DTYPES, verifier_tables

        return verifier_tables(
            self.models, self.processing, self.drafter, self.subject.verify_with_raw_q,
            self.inputs, DTYPES[self.dtype],
        )  # fmt: skip


def callable_tolerance(dtype: str, vocab: int, k: int) -> float:
    """Largest |error| that counts as exact for a callable given ``dtype`` inputs: rounding the
    tables to the dtype moves each probability by one unit of roundoff, and the window's
    probabilities are products and sums of at most (k + 1) * vocab of them (the closed form of
    a built-in rule runs in float64 and uses ``EXACT_TOLERANCE``)."""
    import torch

    from specsim.sampling.harness import DTYPES

    eps = torch.finfo(DTYPES[dtype]).eps
    return max(EXACT_TOLERANCE, 2.0 * (k + 1) * vocab * eps)


def exact_fields(**fields) -> dict[str, Any]:
    """An exact result's fields before it is known, with ``fields`` on top."""
    keys = ("exact_method", "exact_scope", "closed_form_max_abs_error", "tv_distance")
    return {**dict.fromkeys(keys), "exact_tolerance": EXACT_TOLERANCE, "exact_note": None,
            "enumeration_cases": None, "malformed": None, **fields}  # fmt: skip


def record_window(result: dict, produced: np.ndarray, target: np.ndarray) -> dict:
    """``result`` with the exact window ``produced`` compared with the target's."""
    result.update(
        closed_form_max_abs_error=float(np.abs(produced - target).max()),
        tv_distance=reference.total_variation(produced, target),
    )
    return result


def exact_verdicts(exact: dict, mc: dict, malformed, alpha: float) -> list[bool]:
    """One verdict for each test that ran: the exact result, the Monte Carlo, the contract."""
    error = exact["closed_form_max_abs_error"]
    verdicts = [] if error is None else [error <= exact["exact_tolerance"]]
    if mc["p_value"] is not None:
        verdicts.append(mc["p_value"] >= alpha)
    return verdicts + ([] if malformed is None else [False])


def check_seeds(seed, problem_seed) -> None:
    for key, value in (("--seed", seed), ("--problem-seed", problem_seed)):
        if not (float(value).is_integer() and value >= 0):
            raise SpecsimError("value out of range", key=key, fix="use a whole number >= 0")


def record_enumeration(result: dict, enumerated, scope: str, window: int, tolerance: float):
    """``result``'s exact-check fields from an enumeration of one step (chain or tree)."""
    result.update(
        exact_method="enumeration",
        exact_scope=f"{scope} and every outcome of its uniforms, then the target; "
        f"tokens 1-{window}",
        exact_tolerance=tolerance,
        enumeration_cases=enumerated.cases,
        exact_note=enumerated.note,
        malformed=enumerated.malformed,
    )


def _exact(setup: _Setup, target: np.ndarray) -> dict[str, Any]:
    """The exact window: the closed form of a built-in rule, or the enumeration of a callable."""
    subject, models, window = setup.subject, setup.models, setup.k + 1
    result = exact_fields()
    if subject.rule is not None:
        tables = models.tables(
            setup.processing, setup.drafter, verify_with_raw_q=subject.verify_with_raw_q
        )
        produced = reference.first_tokens_distribution(
            tables, models.prompt, setup.draft_counts, subject.rule, window
        )
        result.update(
            exact_method="closed form",
            exact_scope=f"chained steps from the prompt, tokens 1-{window}",
        )
    elif not torch_available():
        result["exact_note"] = NO_TORCH
        return result
    else:
        from specsim.sampling.enumeration import enumerate_step

        enumerated = enumerate_step(
            subject.load(), setup.tables(), models.prompt, setup.k, setup.draft_counts,
            p_table=models.tables(setup.processing).p,
            greedy_reference=subject.greedy_reference, seed=setup.seed,
        )  # fmt: skip
        paths = "path" if enumerated.cases == 1 else "paths"
        scope = f"one step from the prompt over its {enumerated.cases} draft {paths}"
        tolerance = callable_tolerance(setup.dtype, models.vocab, setup.k)
        record_enumeration(result, enumerated, scope, window, tolerance)
        if enumerated.window is None:
            return result
        produced = enumerated.window
    return record_window(result, produced, target)


def torch_available() -> bool:
    """Whether torch imports (the base install has no torch; the closed form needs none)."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def monte_carlo_result(samples, malformed, run: Callable, target, alpha, power) -> dict:
    """The Monte Carlo fields: the window tests of ``run()``'s counts, or why it did not run
    (no samples, no torch, a malformed exact enumeration, a malformed output of its own)."""
    if malformed is not None:
        note = "not run: the exact enumeration found a malformed output"
    elif samples == 0:
        note = "skipped (--samples 0)"
    elif not torch_available():
        note = NO_TORCH
    else:
        from specsim.sampling.harness import Malformed

        counts = run()
        if not isinstance(counts, Malformed):
            return stats.window_result(counts, target, alpha, power)
        note, malformed = "stopped: the verifier's output broke the contract", counts
    keys = ("p_value", "statistic", "dof", "impossible_samples", "detectable_tv")
    return {**dict.fromkeys(keys), "window_tests": None, "malformed": malformed,
            "monte_carlo_note": note}  # fmt: skip


def _monte_carlo(setup: _Setup, samples, target, alpha, power, malformed) -> dict[str, Any]:
    def run():
        from specsim.sampling import montecarlo

        return montecarlo.run_monte_carlo(
            setup.subject.load(), setup.tables(), setup.models.prompt, setup.k, samples,
            setup.seed, n_tokens=setup.k + 1, ragged=len(setup.draft_counts) > 1,
        )  # fmt: skip

    return monte_carlo_result(samples, malformed, run, target, alpha, power)


def _check_subject_fits(subject: Subject, processing: Processing, drafter: str, inputs: str):
    if subject.verify_with_raw_q and processing.is_identity:
        raise SpecsimError(
            "the raw-q control needs logits processing, else raw and processed q coincide",
            key="--control raw-q",
            fix="add --top-k, --top-p or a temperature other than 1",
        )
    if subject.verify_with_raw_q and drafter != "sample":
        raise SpecsimError(
            "the raw-q control needs a sampling drafter", key="--drafter", fix="use sample"
        )
    if inputs == "logits" and subject.rule is not None:
        raise SpecsimError(
            "built-in verifiers and controls take processed probabilities",
            key="--inputs",
            fix="use --inputs logits only with a MODULE:FUNCTION verifier",
        )


def _validate(
    vocab, k, samples, temperature, top_k, top_p, drafter, alpha, power, inputs, dtype
) -> None:
    checks = [
        (2 <= vocab <= MAX_VOCAB, "--vocab",
         f"use 2..{MAX_VOCAB}: the exact result enumerates every draft path"),
        (1 <= k <= MAX_K, "--k", f"use 1..{MAX_K}: the exact result enumerates V^k draft paths"),
        (samples >= 0, "--samples", "use 0 (exact result only) or a positive count"),
        ((temperature == 0 or temperature >= MIN_FACTOR) and np.isfinite(temperature),
         "--temperature", f"use 0 (greedy) or from {MIN_FACTOR:g}"),
        (top_k >= 0 and float(top_k).is_integer(), "--top-k", "use a whole number >= 0 (0: off)"),
        (0 < top_p <= 1, "--top-p", "use a value in (0, 1] (1: off)"),
        (drafter in DRAFTERS, "--drafter", f"use one of {', '.join(DRAFTERS)}"),
        (MIN_LEVEL <= alpha < 1, "--alpha", f"use a level in [{MIN_LEVEL:g}, 1), e.g. 0.01"),
        (0 < power < 1, "power", "use a value in (0, 1), e.g. 0.99"),
        (inputs in ("probs", "logits"), "--inputs", "use probs or logits"),
        (dtype in ("float32", "float64"), "--dtype", "use float32 or float64"),
    ]  # fmt: skip
    for ok, key, fix in checks:
        if not ok:
            raise SpecsimError("value out of range", key=key, fix=fix)
    if vocab ** (k + 1) > MAX_WINDOW_CELLS:
        largest = max(v for v in range(2, MAX_VOCAB + 1) if v ** (k + 1) <= MAX_WINDOW_CELLS)
        raise SpecsimError(
            f"the whole window of {k + 1} tokens has {vocab}^{k + 1} = {vocab ** (k + 1):,} "
            f"outcomes, more than {MAX_WINDOW_CELLS:,}",
            key="--vocab",
            fix=f"use --vocab <= {largest} at --k {k}, or a smaller --k",
        )
