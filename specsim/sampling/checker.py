"""The losslessness checker: exact enumeration plus a Monte Carlo test of the real implementation.

``check_sampler`` judges a verifier on a seeded toy target/drafter pair whose p and q depend on the
prefix (``problem.ToyModels``):

1. **Closed form** (numpy, float64; built-in verifiers and controls): the exact joint
   distribution of the first two emitted tokens, by enumerating every draft path and every
   accept/reject outcome, against what the target alone produces. An exact verifier matches to
   1e-12; the total-variation distance is reported either way.
2. **Monte Carlo** (torch; any verifier callable): many generations at once through the real
   batched implementation; a G-test of the first two emitted tokens against the target, with the
   sample size, seed, level and the smallest TV distance detected with 99% power.

What "lossless" means: for ``rejection`` (and any stochastic verifier), the emitted tokens are
distributed exactly as sampling from the target's processed p. For ``greedy`` it means the output
equals target-only greedy decoding (argmax at every step). ``typical`` (Medusa typical acceptance)
is lossy by design; the checker reports how far it is from the target.

A third-party verifier is checked by wrapping it in the verifier signature
``verifier(p, q, draft_tokens, n_drafts, randomness) -> result`` where ``result`` has
``.accepted`` ``[B]`` and ``.tokens`` ``[B, k+1]`` (see ``specsim.sampling`` for shapes). For
example, a sampler that takes time-major tensors (target probs ``[k+1, B, V]``, draft probs
``[k, B, V]``, draft ids ``[k, B]``, one uniform per position ``[k+1, B]``) and returns ids
``[B, k+1]`` padded with V plus lengths ``[B]`` is wrapped as (tested in
``tests/test_checker_monte_carlo.py``)::

    import torch
    from specsim.sampling import VerifyResult, check_sampler

    def adapter(p, q, draft_tokens, n_drafts, randomness):
        coins = torch.cat([randomness.accept, randomness.sample[:, None]], dim=1)
        ids, length = their_sampler(
            p.transpose(0, 1), q.transpose(0, 1), draft_tokens.t(), coins.t()
        )
        tokens = torch.where(ids == p.shape[-1], -1, ids)   # their padding -> ours
        k = draft_tokens.shape[1]
        return VerifyResult(length - 1, tokens, tokens[:, :k] >= 0)

    report = check_sampler(adapter, k=3, samples=200_000)
    print(report.lossless, report.p_value, report.detectable_tv)

Such a verifier has no closed form, so it is judged by the Monte Carlo test alone (its
``closed_form_max_abs_error`` is None); with ``ragged=False`` (the default) every row has
``n_drafts == k``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from specsim.errors import SpecsimError
from specsim.sampling import reference, stats
from specsim.sampling.controls import CONTROLS
from specsim.sampling.problem import DRAFTERS, Processing, ToyModels

EXACT_TOLERANCE = 1e-12
MAX_VOCAB = 16
MAX_K = 4
N_TOKENS = 2


@dataclass(frozen=True)
class Subject:
    """What is being checked: a built-in verifier, a negative control, or a user callable."""

    name: str
    description: str
    rule: reference.ClosedFormRule | None  # None: no closed form (a user callable)
    greedy_reference: bool  # judged against target greedy decoding instead of sampling
    lossy_by_design: bool
    verify_with_raw_q: bool  # the raw-q control: hand the verifier softmax(raw drafter logits)
    load: Callable[[], Callable]  # returns the torch verifier (imports torch)
    negative_control: bool = False


def _builtin(name: str, function: str, rule, greedy: bool, lossy: bool, what: str) -> Subject:
    def load():
        from specsim.sampling import verifiers

        return getattr(verifiers, function)

    return Subject(name, what, rule, greedy, lossy, False, load)


VERIFIERS: dict[str, Subject] = {
    s.name: s
    for s in (
        _builtin(
            "rejection", "verify_rejection", reference.REJECTION, False, False,
            "exact modified rejection sampling",
        ),
        _builtin(
            "greedy", "verify_greedy", reference.GREEDY, True, False,
            "greedy verification (lossless means: equals target-only greedy decoding)",
        ),
        _builtin(
            "typical", "verify_typical", reference.TYPICAL, False, True,
            "Medusa typical acceptance (lossy by design)",
        ),
    )
}  # fmt: skip


def subject_for(verifier: str | Callable, greedy_reference: bool = False) -> Subject:
    """The Subject for a built-in name, a control name, or a verifier callable."""
    if callable(verifier):
        name = getattr(verifier, "__name__", type(verifier).__name__)
        return Subject(
            name, "user-supplied verifier", None, greedy_reference, False, False, lambda: verifier
        )
    if verifier in VERIFIERS:
        return VERIFIERS[verifier]
    if verifier in CONTROLS:
        c = CONTROLS[verifier]
        return Subject(
            c.name, f"negative control: {c.description}", c.rule, False, False,
            c.verify_with_raw_q, lambda: c.verifier, negative_control=True,
        )  # fmt: skip
    names = ", ".join([*VERIFIERS, *CONTROLS])
    raise SpecsimError(f"unknown verifier {verifier!r}", key="--verifier", fix=f"use {names}")


@dataclass(frozen=True)
class SamplerCheck:
    """The verdict and the evidence (closed form, then Monte Carlo), and the set-up."""

    verifier: str
    description: str
    lossless: bool
    lossy_by_design: bool
    negative_control: bool  # a known-wrong verifier that the check must flag
    reference: str  # "target sampling" or "target greedy decoding"
    closed_form_max_abs_error: float | None  # None: no closed form for a user callable
    tv_distance: float | None  # closed form, exact
    p_value: float | None  # None: Monte Carlo skipped (see monte_carlo_note)
    g_statistic: float | None  # None also when an impossible outcome was seen (infinite)
    dof: int | None
    impossible_samples: int | None  # samples outside the target's support
    monte_carlo_tv: float | None  # plug-in TV of the empirical distribution (biased upwards)
    detectable_tv: float | None  # smallest TV detected with `power` at level `alpha`
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
    monte_carlo_note: str | None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def check_sampler(
    verifier: str | Callable = "rejection",
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
) -> SamplerCheck:
    """Check a verifier (a built-in or control name, or a callable) for losslessness.

    ``verifier``: "rejection", "greedy", "typical", a control name from ``controls.CONTROLS``
    (``resample-p``, ``argmax-on-reject``, ``residual-0.8q``, ``raw-q``, ``shared-uniform``), or
    a callable with the verifier signature (``greedy_reference=True`` judges a callable against
    greedy decoding instead of sampling). ``ragged=True`` draws each step's number of drafts
    uniformly from 0..k. ``samples=0`` skips the Monte Carlo test; it is also skipped, with a
    note, when torch is not installed. The verdict is lossless only if every test that ran
    passed: the closed form within 1e-12 and the G-test at level ``alpha``.
    """
    _validate(vocab, k, samples, temperature, top_k, top_p, drafter, alpha, power)
    for key, value in (("--seed", seed), ("--problem-seed", problem_seed)):
        if not (float(value).is_integer() and value >= 0):
            raise SpecsimError("value out of range", key=key, fix="use a whole number >= 0")
    subject = subject_for(verifier, greedy_reference)
    processing = Processing(float(temperature), int(top_k), float(top_p))
    _check_subject_fits(subject, processing, drafter, samples)
    models = ToyModels.make(vocab, problem_seed)
    target = reference.target_distribution(
        models.tables(processing).p, models.prompt, N_TOKENS, greedy=subject.greedy_reference
    )

    max_error = tv = None
    if subject.rule is not None:
        tables = models.tables(processing, drafter, verify_with_raw_q=subject.verify_with_raw_q)
        counts = tuple(range(k + 1)) if ragged else (k,)
        produced = reference.first_tokens_distribution(tables, models.prompt, counts, subject.rule)
        max_error = float(np.abs(produced - target).max())
        tv = reference.total_variation(produced, target)

    mc = _monte_carlo(subject, models, processing, drafter, k, samples, seed, ragged, target)
    if mc["p_value"] is not None:
        mc["detectable_tv"] = stats.detectable_tv(target, samples, alpha, power)
    verdicts = [] if max_error is None else [max_error <= EXACT_TOLERANCE]
    if mc["p_value"] is not None:
        verdicts.append(mc["p_value"] >= alpha)
    if not verdicts:
        raise SpecsimError(
            "nothing could be run: a verifier callable has no closed form and torch is missing",
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
        closed_form_max_abs_error=max_error,
        tv_distance=tv,
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
        **mc,
    )


def torch_available() -> bool:
    """Whether torch imports (the base install has no torch; the closed form needs none)."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def _monte_carlo(subject, models, processing, drafter, k, samples, seed, ragged, target) -> dict:
    result: dict[str, Any] = dict.fromkeys(
        ("p_value", "g_statistic", "dof", "impossible_samples", "monte_carlo_tv", "detectable_tv")
    )
    if samples == 0:
        return {**result, "monte_carlo_note": "skipped (--samples 0)"}
    if not torch_available():
        note = "skipped: torch is not installed (pip install 'specsim-llm[torch]')"
        return {**result, "monte_carlo_note": note}
    from specsim.sampling import montecarlo

    tables = montecarlo.torch_tables(models, processing, drafter, subject.verify_with_raw_q)
    counts = montecarlo.run_monte_carlo(
        subject.load(), tables, models.prompt, k, samples, seed, n_tokens=N_TOKENS, ragged=ragged
    )
    test = stats.g_test(counts, target)
    return {
        **result,
        "p_value": test.p_value,
        "g_statistic": test.statistic,
        "dof": test.dof,
        "impossible_samples": test.impossible_count,
        "monte_carlo_tv": reference.total_variation(counts / samples, target),
        "monte_carlo_note": None,
    }


def _check_subject_fits(subject: Subject, processing: Processing, drafter: str, samples: int):
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
    if subject.rule is None and samples == 0:
        raise SpecsimError(
            "a verifier callable has no closed form, so it needs Monte Carlo samples",
            key="samples",
            fix="pass samples > 0",
        )


def _validate(vocab, k, samples, temperature, top_k, top_p, drafter, alpha, power) -> None:
    checks = [
        (2 <= vocab <= MAX_VOCAB, "--vocab",
         f"use 2..{MAX_VOCAB}: the closed form enumerates every draft path"),
        (1 <= k <= MAX_K, "--k", f"use 1..{MAX_K}: the closed form enumerates V^k draft paths"),
        (samples >= 0, "--samples", "use 0 (closed form only) or a positive count"),
        (temperature >= 0 and np.isfinite(temperature), "--temperature", "use >= 0 (0: greedy)"),
        (top_k >= 0 and float(top_k).is_integer(), "--top-k", "use a whole number >= 0 (0: off)"),
        (0 < top_p <= 1, "--top-p", "use a value in (0, 1] (1: off)"),
        (drafter in DRAFTERS, "--drafter", f"use one of {', '.join(DRAFTERS)}"),
        (0 < alpha < 1, "--alpha", "use a level in (0, 1), e.g. 0.01"),
        (0 < power < 1, "power", "use a value in (0, 1), e.g. 0.99"),
    ]  # fmt: skip
    for ok, key, fix in checks:
        if not ok:
            raise SpecsimError("value out of range", key=key, fix=fix)
