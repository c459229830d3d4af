"""The terms a calibration fits: a few scale factors and one added cost on the prior profile.

The prior (a roofline or measured profile) gives the latency *form*: which passes are
memory-bound and which compute-bound, how cost grows with batch, context and new tokens. A
benchmark's percentiles cannot pin six coefficients per model, but they do pin how far each
part of the prior is off, so the fit scales the prior's parts rather than refitting them:

- ``target.decode``: one factor on the target's fixed, per-sequence and per-KV-token terms
  (and a mixture of experts' routed-expert read), the memory-bound part that every decode and
  verification pass pays (weights and cache read).
- ``target.prefill``: one factor on its per-batched-token term (past the knee): the matrix
  products that long prompts and large batches pay.
- ``target.attention``: one factor on its per-attention-pair terms (decoding rows' and, where
  the prior prices them apart, prompt chunks' at the prior's ratio): attention over the context
  a new token reads, run by other kernels (FlashAttention, MLA) at another utilisation than the
  matrix products, a share of a prompt's cost that grows with its length. Shared with the
  matrix products, a factor carried what short-prompt runs say of those onto long prompts'
  attention (docs/notes/2026-12-03-honest-fits.md); apart, short-prompt runs leave it
  undetermined, at the prior. Fitted where the prior prices attention.
- ``drafters.NAME.latency``: one factor on the whole latency fit of a draft model.
- ``drafters.NAME.per_speculative_step_s``: seconds added to every step that drafts (the
  drafter's ``overhead.per_speculative_step_s``): what a speculative iteration costs beyond the
  passes (proposal, rejection sampling, the verification pass run slower inside a step). For a
  drafter without a latency fit (prompt lookup, heads) it is the only drafter term: its fixed
  ``draft_step_s`` is paid once per speculative step too, and the two cannot be told apart.
- ``overhead.per_request_s``: the API server's delay on a request's way in (the profile's
  ``overhead.per_request_s``), paid once by its TTFT and E2E. Runs at low load determine it
  (TTFT at one client is the delay plus one prefill); under a queue it is a small share of TTFT
  and the posterior leaves it undetermined, at the prior. A prior that states no delay (0:
  runs served without an API server, as specsim's built-in engine and a measured CPU profile
  serve them) keeps it, unfitted: a true 0 sits on the term's bound, where a closed loop's
  next request jumps from an iteration's end into the next one at any delay at all.
- ``overhead.per_request_engine_s``: the engine loop's own work on each request it admits
  (scheduling it, allocating its blocks, adding it to the input and sampling batches), added
  to the iteration that admits it: unlike the delay it slows the engine, so runs that send
  many short requests at once (their throughput, every request's TTFT behind the others'
  admissions) determine it; one request at a time it adds to a TTFT what the delay adds, and
  is left undetermined. Its figures move smoothly from 0, so a normal prior of spread
  ``ENGINE_REQUEST_SPREAD_S`` serves. Fitted where the prior states one (> 0), and from 0
  for runs of an engine whose loop is known to pay per-request work (the registry's
  ``Engine.request_work``: vLLM); elsewhere kept as the prior states it. Fitted from 0 on every
  bundled deployment it helped a vLLM one and broke SGLang's fit
  (docs/notes/2026-12-03-engine-request-cost.md).

Runs with speculation off see the target's terms and the delay; runs with it on see all of
them. The factors are fitted as logarithms (prior 0, spread ``FACTOR_PRIOR_SD``: within a
factor of 4 at one standard deviation), a drafter's added seconds in units of the prior
target's decode pass (prior: the profile's value, spread one pass), the delay in the same unit
with a spread of ``REQUEST_SPREAD_S`` (50 ms: API servers' delays are tens of milliseconds, a
pass a few; the unit sets the optimiser's steps, small beside a low-load TTFT). The knee,
the engine's other overhead terms and every term the data leaves undetermined keep the
prior's values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from specsim.profile import LatencyModel, Profile
from specsim.profile.schema import DraftOverhead

FACTOR_PRIOR_SD = math.log(4.0)
FACTOR_BOUNDS = (math.log(1e-2), math.log(1e2))
SECONDS_PRIOR_SD = 1.0  # in decode passes
SECONDS_BOUNDS = (0.0, 50.0)
REQUEST_SPREAD_S = 0.05  # the request delay's prior spread
REQUEST_TERM = "overhead.per_request_s"
# The engine's cost per admitted request: a few milliseconds of Python per request in vLLM's
# scheduler and model runner (docs/notes/2026-12-03-engine-request-cost.md).
ENGINE_REQUEST_SPREAD_S = 0.01
ENGINE_REQUEST_TERM = "overhead.per_request_engine_s"
DECODE_TERMS = ("fixed_s", "per_sequence_s", "per_kv_token_s")
PREFILL_TERMS = ("per_batched_token_s",)
# A prompt chunk's pair cost keeps its prior ratio to a decoding row's (module docstring).
ATTENTION_TERMS = ("per_attention_pair_s", "per_prefill_pair_s")
DRAFT_TERMS = (*DECODE_TERMS, *PREFILL_TERMS, *ATTENTION_TERMS)
TARGET_PARTS = {"decode": DECODE_TERMS, "prefill": PREFILL_TERMS, "attention": ATTENTION_TERMS}
REFERENCE_CONTEXT = 1024


@dataclass(frozen=True)
class Term:
    """One fitted term: ``value(theta)`` is its factor or its seconds."""

    name: str
    kind: str  # "factor" or "seconds"
    prior: float  # the prior's factor (1) or seconds
    unit: float  # seconds per unit of theta (seconds terms), 1 for factors
    description: str
    model: str = "target"  # "target", "engine" (the profile's overhead) or the drafter's name
    part: str = "decode"  # decode, prefill, attention, latency, per_speculative_step_s, ...
    spread_s: float | None = None  # a seconds term's prior spread, when not one unit

    @property
    def theta0(self) -> float:
        return 0.0 if self.kind == "factor" else self.prior / self.unit

    @property
    def prior_sd(self) -> float:
        if self.kind == "factor":
            return FACTOR_PRIOR_SD
        return SECONDS_PRIOR_SD if self.spread_s is None else self.spread_s / self.unit

    @property
    def bounds(self) -> tuple[float, float]:
        if self.kind == "factor":
            return FACTOR_BOUNDS
        high = SECONDS_BOUNDS[1] * max(1.0, self.prior_sd)
        return (SECONDS_BOUNDS[0], max(high, 2 * self.theta0))

    def value(self, theta: float) -> float:
        return math.exp(theta) if self.kind == "factor" else theta * self.unit


def decode_seconds(profile: Profile) -> float:
    """The prior target's decode pass at batch 1 over 1024 cached tokens: the unit of the
    fitted seconds."""
    model = LatencyModel(profile.target.latency, "target")
    return model.seconds_from_totals(1, 1, REFERENCE_CONTEXT, REFERENCE_CONTEXT + 1)


def terms_for(profile: Profile, drafter: str | None, engine_cost: bool = False) -> list[Term]:
    """The terms a calibration fits: the target's two, the request delay where the prior
    states one, the engine's cost per admitted request where the prior states one or
    ``engine_cost`` (the runs' engine pays it), and the drafter's when runs speculate."""
    unit = decode_seconds(profile)
    terms = [
        Term("target.decode", "factor", 1.0, 1.0, "target: fixed, per-sequence, per-KV-token"),
        Term(
            "target.prefill",
            "factor",
            1.0,
            1.0,
            "target: per-batched-token (matrix products past the knee)",
            part="prefill",
        ),
    ]
    fit = profile.target.latency.fit
    if fit.per_attention_pair_s > 0 or fit.prefill_pair_s > 0:
        terms.append(
            Term(
                "target.attention",
                "factor",
                1.0,
                1.0,
                "target: per-attention-pair (attention over the context)" + _ratio(fit),
                part="attention",
            )
        )
    if profile.overhead.per_request_s > 0:  # 0: the prior states no API server (module doc)
        terms.append(engine_seconds_term(profile, unit, REQUEST_TERM))
    if engine_cost or profile.overhead.per_request_engine_s > 0:  # module doc
        terms.append(engine_seconds_term(profile, unit, ENGINE_REQUEST_TERM))
    if drafter is None:
        return terms
    spec = profile.drafters[drafter]
    if spec.latency is not None:
        terms.append(
            Term(
                f"drafters.{drafter}.latency",
                "factor",
                1.0,
                1.0,
                "the draft model's passes",
                drafter,
                "latency",
            )
        )
    own = spec.overhead.per_speculative_step_s if spec.overhead is not None else 0.0
    name = f"drafters.{drafter}.per_speculative_step_s"
    description = "seconds added to every speculative step"
    terms.append(
        Term(
            name,
            "seconds",
            own,
            unit,
            description,
            drafter,
            "per_speculative_step_s",
        )
    )
    return terms


def _ratio(fit) -> str:
    """How a prompt chunk's pair cost follows the factor, where the prior states it apart."""
    if fit.per_prefill_pair_s is None or fit.per_attention_pair_s == 0:
        return ""
    ratio = fit.per_prefill_pair_s / fit.per_attention_pair_s
    return f"; prompt chunks' pairs at the prior's ratio {ratio:.3g} to it, not fitted apart"


# Each engine overhead fitted in seconds: its name, its ``Overhead`` field, what it is and its
# prior spread (module docstring).
ENGINE_SECONDS = {
    REQUEST_TERM: (
        "per_request_s",
        "seconds from a request's send to the engine's queue (API server)",
        REQUEST_SPREAD_S,
    ),
    ENGINE_REQUEST_TERM: (
        "per_request_engine_s",
        "seconds an iteration adds for each request it admits (the engine's loop)",
        ENGINE_REQUEST_SPREAD_S,
    ),
}


def engine_seconds_term(profile: Profile, unit: float, name: str) -> Term:
    """An engine overhead of ``ENGINE_SECONDS`` as a fitted term."""
    field, description, spread = ENGINE_SECONDS[name]
    value = getattr(profile.overhead, field)
    return Term(name, "seconds", value, unit, description, "engine", field, spread)


def _scaled(fit, names: tuple[str, ...], factor: float):
    update = {name: getattr(fit, name) * factor for name in names if getattr(fit, name) is not None}
    if "fixed_s" in names and fit.experts is not None:  # the experts' read is a weight read
        update["experts"] = fit.experts.model_copy(
            update={"weights_s": fit.experts.weights_s * factor}
        )
    return fit.model_copy(update=update)


def _with_fit(spec, fit):
    latency = spec.latency.model_copy(update={"fit": fit})
    return spec.model_copy(update={"latency": latency})


def apply(profile: Profile, terms: list[Term], theta) -> Profile:
    """The prior with every term set to ``theta`` (copies; the prior is left as it was)."""
    target = profile.target
    overhead = profile.overhead
    drafters = dict(profile.drafters)
    for term, x in zip(terms, theta, strict=True):
        value = term.value(x)
        if term.model == "engine":
            overhead = overhead.model_copy(update={term.part: value})
            continue
        if term.model == "target":
            target = _with_fit(target, _scaled(target.latency.fit, TARGET_PARTS[term.part], value))
            continue
        spec = drafters[term.model]
        if term.part == "latency":
            drafters[term.model] = _with_fit(spec, _scaled(spec.latency.fit, DRAFT_TERMS, value))
        else:
            own = own_overhead(profile, spec, value)
            drafters[term.model] = spec.model_copy(update={"overhead": own})
    return profile.model_copy(update={"target": target, "overhead": overhead, "drafters": drafters})


def own_overhead(profile: Profile, spec, per_speculative_step_s: float) -> DraftOverhead:
    """The drafter's own overhead section with the fitted seconds per speculative step. A
    drafter without one gets the shared draft and prefill terms copied into it, which it then
    replaces (``StepCosts``), so that nothing else changes."""
    if spec.overhead is not None:
        base = spec.overhead
    else:
        shared = profile.overhead
        base = DraftOverhead(
            per_draft_step_s=shared.per_draft_step_s,
            per_draft_token_s=shared.per_draft_token_s,
            per_prefill_s=shared.per_prefill_s,
            per_prefill_token_s=shared.per_prefill_token_s,
        )
    return base.model_copy(update={"per_speculative_step_s": per_speculative_step_s})
