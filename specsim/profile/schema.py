"""The profile file: what the simulator knows about a target, its drafters and the hardware.

A profile is a versioned YAML file (``version: 1``). It records where its numbers came from
(``provenance``), the hardware, the models with their latency fits, a per-step overhead, and the
acceptance statistics per drafter x verifier x temperature (and, for speculation trees, per tree
shape). Nothing in code hard-codes a device's speed or price: it all comes from here.
``specsim schema profile`` prints the JSON Schema.
"""

from __future__ import annotations

import itertools
from typing import Annotated, Literal

import numpy as np
from pydantic import Field, model_validator

from specsim.bounds import (
    MAX_COUNT,
    MAX_FACTOR,
    MAX_K,
    MAX_TOKENS,
    BatchSize,
    ByteCount,
    Bytes,
    Count,
    Dimension,
    Factor,
    Flops,
    NonNegFactor,
    PositiveFlops,
    PositiveSeconds,
    Price,
    Probability,
    Requests,
    Seconds,
    Seed,
    Share,
    Temperature,
    TensorParallel,
    TokenCount,
    Tokens,
)
from specsim.config import Name, StrictModel
from specsim.errors import SpecsimError
from specsim.profile.kinds import DRAFTER_KINDS, DRAFTER_METHODS, MODEL_KINDS
from specsim.profile.reported import (
    AcceptanceHistogram,
    histogram_concentration,
    histogram_rates,
    table_rates,
)
from specsim.sampling.kinds import VERIFIER_KINDS, VerifierName, verifier_descriptions
from specsim.tree import MAX_TREE_NODES, TreeShape


class ReferencePasses(StrictModel):
    decode_s: PositiveSeconds = Field(description="the decode pass (batch 1, 128 cached tokens)")
    prefill_s: PositiveSeconds = Field(description="the prefill pass (batch 1, a 96-token prompt)")


class SpeedReference(StrictModel):
    """Timing on a shared CPU (``specsim.engine.speed_reference``): the speeds a profile taken
    with a CPU clock was rescaled to, and how far the machine ran from them."""

    decode_s: PositiveSeconds | None = Field(
        default=None,
        description="--clock reference: the target's decode pass (batch 1, 128 cached tokens) "
        "at the speed every timing is rescaled to; specsim validate --clock reference rescales "
        "the engine's time to it too",
    )
    prefill_s: PositiveSeconds | None = Field(
        default=None,
        description="--clock reference: the target's prefill pass (batch 1, a 96-token prompt) at "
        "the reference speed; passes feeding more tokens than a decode are rescaled between the "
        "two references",
    )
    host_s: PositiveSeconds | None = Field(
        default=None,
        description="--clock reference: the engine's own work in one speculative step without a "
        "model pass at the reference speed; the work between passes is rescaled by it",
    )
    drafters: dict[str, ReferencePasses] | None = Field(
        default=None,
        description="--clock reference: each draft model's own decode and prefill reference "
        "passes at the reference speed; its passes are rescaled by its own probes",
    )
    slowdown: Factor | None = Field(
        default=None,
        description="--clock reference: the median of the target's decode probes during "
        "profiling over its reference (1 = as fast). Well below 1, the references were taken "
        "while the machine was slow and every pass was rescaled from far off: profile again",
    )
    overhead_pass_scale: Factor | None = Field(
        default=None,
        description="--clock cpu or reference: how fast the target's decode passes ran in the "
        "overhead waves against the latency fits (the median of measured / predicted over "
        "target-alone decodes). The overhead terms are fitted against the passes at this "
        "speed, so that the machine's drift between the two measurements stays out of them",
    )


# Profiles written before the block existed carried its keys flat in ``provenance``: read
# them as the block (the mapping is one to one), so no measured profile has to be redone.
FLAT_SPEED_KEYS = {
    "reference_pass_s": "decode_s",
    "reference_prefill_s": "prefill_s",
    "reference_host_s": "host_s",
    "drafter_references": "drafters",
    "reference_slowdown": "slowdown",
    "overhead_pass_scale": "overhead_pass_scale",
}


class BenchFile(StrictModel):
    """A benchmark result file a calibration read (``specsim profile from-bench``)."""

    path: str = Field(description="the file as given on the command line")
    sha256: str = Field(description="of the whole file")
    runs: Annotated[int, Field(ge=1, le=MAX_COUNT)] = Field(description="runs read from it")
    format: str = Field(description="vllm-bench, sglang-bench or normalised-csv")
    engine: str = Field(description="vllm, sglang, trtllm or other, as the file says")
    engine_version: str | None = Field(default=None, description="where the file says")
    model: str | None = Field(default=None, description="the served model, where the file says")


class CalibratedTerm(StrictModel):
    """A term a calibration fitted on its prior profile (``specsim.calibration.terms``)."""

    name: str = Field(description="e.g. target.decode, drafters.NAME.per_speculative_step_s")
    kind: Literal["factor", "seconds"] = Field(
        description="factor: multiplies the prior's terms; seconds: the value itself"
    )
    value: Annotated[float, Field(ge=0, le=MAX_FACTOR)] = Field(description="as written")
    prior: Annotated[float, Field(ge=0, le=MAX_FACTOR)] = Field(description="the prior's value")
    determined: bool = Field(
        description="true: the runs determine it (spread_ratio below the calibration's "
        "threshold) and it was fitted; false: it keeps the prior's value"
    )
    spread_ratio: Annotated[float, Field(ge=0, le=1)] = Field(
        description="the term's posterior standard deviation over its prior's (1: the runs "
        "say nothing of it)"
    )


class HeldOut(StrictModel):
    """Leave one run out: fit on the others, predict it, over every fitted figure."""

    runs: Annotated[int, Field(ge=1, le=MAX_COUNT)]
    median_abs_error: NonNegFactor = Field(description="|predicted / measured - 1|, median")
    max_abs_error: NonNegFactor = Field(description="|predicted / measured - 1|, largest")


class CheckedFigure(StrictModel):
    """One figure over the runs a calibration never saw."""

    runs: Annotated[int, Field(ge=1, le=MAX_COUNT)] = Field(description="runs with the figure")
    median_abs_error: NonNegFactor = Field(description="|predicted / measured - 1|, median")
    max_abs_error: NonNegFactor = Field(description="|predicted / measured - 1|, largest")


class Checked(StrictModel):
    """Runs of the deployment the fit never saw (``profile from-bench --check-runs``),
    predicted on the fitted profile as ``validate --bench`` predicts them."""

    files: list[BenchFile] = Field(min_length=1)
    runs: list[str] = Field(min_length=1, description="the runs' labels")
    figures: dict[str, CheckedFigure] = Field(
        description="per figure (e.g. tpot_s.mean, throughput_tokens_per_s) the error over the runs"
    )


class Calibration(StrictModel):
    """How a calibrated profile was fitted to an engine's own benchmark runs."""

    prior: str = Field(description="the --into profile the terms scale")
    prior_source: str = Field(description="that profile's provenance.source")
    files: list[BenchFile] = Field(min_length=1)
    terms: list[CalibratedTerm]
    threshold: Share = Field(description="a term is determined when its spread ratio is below this")
    fit_median_abs_error: NonNegFactor = Field(
        description="|simulated / measured - 1| over every fitted figure of every run, median"
    )
    held_out: HeldOut | None = Field(
        default=None, description="absent with a single run, or when not computed"
    )
    runs_source: str | None = Field(
        default=None,
        description="where the runs come from, as stated with --runs-source (publication, "
        "address, engine version, date of the runs)",
    )
    checked: Checked | None = Field(
        default=None,
        description="the error on runs the fit never saw, per figure (absent without --check-runs)",
    )
    report: str | None = Field(
        default=None, description="the calibration report beside the profile (JSON)"
    )


class Provenance(StrictModel):
    source: Literal["measured", "calibrated", "published", "roofline"] = Field(
        description="measured on a device, calibrated to a serving engine's own benchmark "
        "runs (specsim profile from-bench), taken from a publication, or a roofline estimate"
    )
    device: str = Field(description="the device the numbers describe, in words")
    date: str = Field(description="ISO date the numbers were produced")
    software: dict[str, str] = Field(default_factory=dict, description="name -> version")
    command: str | None = Field(default=None, description="the command that wrote the profile")
    notes: str = ""
    profiling_seconds: Seconds | None = Field(default=None, description="wall time of profiling")
    calibration: Calibration | None = Field(
        default=None, description="source calibrated: the runs, the fitted terms, their errors"
    )
    speed_reference: SpeedReference | None = Field(
        default=None,
        description="profiled with a CPU clock on a shared machine: the reference speeds and "
        "the machine's drift (absent on a wall clock). The flat keys of older profiles "
        "(reference_pass_s, reference_prefill_s, reference_host_s, drafter_references, "
        "reference_slowdown, overhead_pass_scale) are read into it",
    )

    @model_validator(mode="before")
    @classmethod
    def _speed_keys_into_their_block(cls, data):
        if not isinstance(data, dict) or not FLAT_SPEED_KEYS.keys() & data.keys():
            return data
        if data.get("speed_reference") is not None:
            flat = ", ".join(k for k in FLAT_SPEED_KEYS if k in data)
            raise ValueError(
                f"{flat} and speed_reference both given; fix: keep speed_reference and drop "
                "the older flat keys"
            )
        block = {new: data[old] for old, new in FLAT_SPEED_KEYS.items() if old in data}
        rest = {k: v for k, v in data.items() if k not in FLAT_SPEED_KEYS}
        return {**rest, "speed_reference": block}


WEIGHT_DTYPES = ("bfloat16", "float16", "fp8", "int4", "nvfp4", "mxfp4")
KV_DTYPES = ("bfloat16", "float16", "fp8")


class Hardware(StrictModel):
    name: Name
    memory_bytes: Bytes = Field(description="one device's memory available to weights and KV cache")
    price_per_hour_usd: Price = Field(
        description="what one replica costs per hour: tensor_parallel_size devices (edit freely)"
    )
    peak_flops: PositiveFlops | None = Field(
        default=None, description="peak FLOP/s at the profile's dtype"
    )
    memory_bandwidth_bytes_per_s: Bytes | None = None
    tensor_parallel_size: TensorParallel | None = Field(
        default=None,
        description="devices one replica spans (tensor parallelism); absent = 1, as measured "
        "and calibrated profiles are unless they say otherwise",
    )

    @property
    def devices(self) -> int:
        return self.tensor_parallel_size or 1


class Sharding(StrictModel):
    """How a model is split over a replica's devices (tensor parallelism); what one device holds
    decides the KV-cache capacity."""

    tensor_parallel_size: TensorParallel = Field(
        description="devices the model is sharded over: 1 or the replica's (as vLLM allows)"
    )
    weight_bytes_per_device: ByteCount
    kv_bytes_per_token_per_device: ByteCount = Field(
        description="the KV heads one device holds (replicated when heads < devices)"
    )
    expert_parallel_size: TensorParallel | None = Field(
        default=None,
        description="devices a mixture of experts' experts are dealt out over whole (vLLM's "
        "--enable-expert-parallel: EP = TP for one engine), equal to tensor_parallel_size; "
        "absent: the experts are sharded like every other matrix",
    )

    @model_validator(mode="after")
    def _expert_parallel_is_the_tp(self) -> Sharding:
        ep = self.expert_parallel_size
        if ep is not None and ep != self.tensor_parallel_size:
            raise ValueError(
                f"expert_parallel_size {ep} is not tensor_parallel_size "
                f"{self.tensor_parallel_size} (one engine deals its experts over all its "
                "devices); fix: give the same size, or drop expert_parallel_size"
            )
        return self


class Precision(StrictModel):
    """Number formats of a model's weights and KV cache; absent = the profile's dtype."""

    weights: Literal[WEIGHT_DTYPES]  # type: ignore[valid-type]
    kv_cache: Literal[KV_DTYPES]  # type: ignore[valid-type]


class HeldOutError(StrictModel):
    method: str = Field(description="how the error was measured, e.g. 'leave-one-out'")
    points: Count
    median_rel_error: NonNegFactor
    max_rel_error: NonNegFactor


MAX_GRAPH_SIZES = 512  # captured CUDA-graph sizes one fit may list (vLLM's default: 51)


class ExpertRead(StrictModel):
    """A mixture of experts' routed experts, read as a pass's tokens route to them: a pass over
    ``N`` tokens reads, expected, the union of the experts its tokens pick, a share
    ``1 - (1 - experts_per_token / experts)^N`` of them (independent uniform routing): one
    token's ``experts_per_token``, all of them for large N."""

    weights_s: Seconds = Field(
        description="seconds to read every routed expert's weights the device holds, over all "
        "its MoE layers (shared experts, attention and dense layers are in fixed_s)"
    )
    experts: Annotated[int, Field(ge=1, le=MAX_COUNT)] = Field(
        description="routed experts per MoE layer"
    )
    experts_per_token: Annotated[int, Field(ge=1, le=MAX_COUNT)] = Field(
        description="routed experts each token picks (top-k)"
    )

    @model_validator(mode="after")
    def _topk_within(self) -> ExpertRead:
        if self.experts_per_token > self.experts:
            raise ValueError(
                f"experts_per_token {self.experts_per_token} above experts {self.experts}; fix: "
                "give the model's num_experts_per_tok and num_experts"
            )
        return self


class LatencyFit(StrictModel):
    """Seconds for one forward pass over a batch of sequences.

    With ``N`` = new tokens in the batch, ``KV`` = tokens read from the KV cache (sum of the
    sequences' context lengths), ``P`` = sum over sequences of new x (context + (new + 1) / 2)
    (query-key pairs of the new tokens) and ``B`` = sequences in the batch::

        seconds = fixed_s + per_sequence_s * B + per_batched_token_s * max(0, G(N) - knee_tokens)
                  + per_kv_token_s * KV + per_attention_pair_s * P
                  [+ experts.weights_s * (1 - (1 - experts_per_token / experts)^N)]

    ``knee_tokens`` > 0 models a pass that is memory-bound (flat in N) until N reaches the knee;
    with it at 0 the form is the plain linear one, easy to write by hand from a published fit.
    ``G(N)`` is N, or with ``graph_sizes`` the smallest captured size at or above N (a pass up
    to the largest runs as a CUDA graph padded to its size; above it, eager and unpadded).
    The bracketed term is there only with ``experts`` (a mixture of experts).
    """

    fixed_s: Seconds
    per_sequence_s: Seconds = 0.0
    per_batched_token_s: Seconds = 0.0
    knee_tokens: Annotated[float, Field(ge=0, le=MAX_TOKENS)] = 0.0
    per_kv_token_s: Seconds = 0.0
    per_attention_pair_s: Seconds = 0.0
    graph_sizes: Annotated[list[Tokens], Field(min_length=1, max_length=MAX_GRAPH_SIZES)] | None = (
        Field(
            default=None,
            description="token counts the engine captured CUDA graphs for (vLLM's "
            "cudagraph_capture_sizes), ascending: a pass of N tokens up to the largest is padded "
            "to the next one and pays per_batched_token_s on the padded count; absent: no padding",
        )
    )
    experts: ExpertRead | None = Field(
        default=None,
        description="a mixture of experts: its routed experts' read, by the share of them a "
        "pass's tokens route to (absent: fixed_s holds every weight read)",
    )
    held_out: HeldOutError | None = None

    @model_validator(mode="after")
    def _graph_sizes_ascending(self) -> LatencyFit:
        sizes = self.graph_sizes
        if sizes is not None and any(b <= a for a, b in itertools.pairwise(sizes)):
            raise ValueError("graph_sizes must ascend strictly; fix: sort them and drop repeats")
        return self


class LatencySample(StrictModel):
    """One measured grid point: all sequences in the batch share context and new-token counts."""

    batch: BatchSize
    context: TokenCount
    new_tokens: Tokens
    seconds: PositiveSeconds = Field(description="median of the repeats")
    spread_s: Seconds = Field(default=0.0, description="interquartile range of the repeats")
    repeats: Annotated[int, Field(ge=1, le=MAX_COUNT)] = 1
    phase: Literal["prefill", "decode", "verify"] | None = None


class ValidRange(StrictModel):
    """The measured region. Queries outside it follow ``Latency.outside_range``."""

    batch: tuple[BatchSize, BatchSize]
    context: tuple[TokenCount, TokenCount]
    new_tokens: tuple[Tokens, Tokens]

    @model_validator(mode="after")
    def _ordered(self) -> ValidRange:
        for name in ("batch", "context", "new_tokens"):
            low, high = getattr(self, name)
            if high < low:
                raise ValueError(f"{name} range [{low}, {high}] ends below its start")
        return self


class Latency(StrictModel):
    fit: LatencyFit
    valid_range: ValidRange | None = Field(
        default=None, description="absent for hand-written fits: valid everywhere"
    )
    outside_range: Literal["extrapolate", "error"] = Field(
        default="extrapolate",
        description="'extrapolate': use the fit's formula beyond the range and warn once; "
        "'error': refuse the query",
    )
    samples: list[LatencySample] = Field(default_factory=list)


class DraftOverhead(StrictModel):
    """A drafter's own overhead terms (see ``Overhead``), when it was measured: what one of its
    draft passes adds to a serving iteration beyond the latency fits (sampling, and its passes
    running cache-cold after the target's inside the loop, which grows with the drafter's size),
    and what a prefill iteration of a deployment with it adds. They replace the shared draft
    and prefill terms for this drafter."""

    per_draft_step_s: Seconds = 0.0
    per_draft_token_s: Seconds = 0.0
    per_prefill_s: Seconds = 0.0
    per_prefill_token_s: Seconds = 0.0
    per_speculative_step_s: Seconds = Field(
        default=0.0,
        description="added once per step in which this drafter drafted (k > 0), whatever k: "
        "the target's verification pass runs slower inside such a step than alone",
    )
    per_speculative_sequence_s: Seconds = Field(
        default=0.0, description="the same, per drafting sequence"
    )


HeadPasses = Literal["parallel", "autoregressive"]


class ModelSpec(StrictModel):
    """A target or drafter. FLOPs are forward-pass FLOPs (2 x multiply-adds)."""

    kind: Literal[tuple(MODEL_KINDS)] = Field(  # type: ignore[valid-type]
        description="; ".join(f"{k.name}: {k.description}" for k in MODEL_KINDS.values())
    )
    description: str = ""
    params: Count = 0
    layers: Dimension = 0
    hidden_size: Dimension = 0
    vocab_size: Dimension = 0
    kv_bytes_per_token: ByteCount = 0
    weight_bytes: ByteCount = 0
    flops_per_token: Flops = Field(default=0.0, description="weights part, ~2 x params")
    attention_flops_per_context_token: Flops = Field(
        default=0.0, description="extra FLOPs per new token per token of context it attends to"
    )
    latency: Latency | None = Field(
        default=None, description="pass latency; draft models and targets need it"
    )
    draft_step_s: Seconds | None = Field(
        default=None,
        description="fixed drafting cost per speculative step (n-gram lookup, heads) when the "
        "drafter has no latency fit of its own",
    )
    passes: HeadPasses | None = Field(
        default=None,
        description="heads only: how the heads draft the depths of a step. parallel (Medusa): "
        "one head per depth, all from one pass over the target's hidden states, one pass per "
        "step for a chain and a tree alike; autoregressive (EAGLE, EAGLE-3, MTP): one pass per "
        "drafted depth (a chain of k: k passes; a tree: one per depth over the nodes that "
        "expand there). Absent = parallel",
    )
    overhead: DraftOverhead | None = Field(
        default=None,
        description="draft models: this drafter's per-draft-pass overhead terms, in place of "
        "the profile's overhead.per_draft_step_s and per_draft_token_s",
    )
    sharding: Sharding | None = Field(
        default=None, description="tensor-parallel split; absent = the whole model on one device"
    )
    precision: Precision | None = Field(
        default=None, description="weight and KV-cache formats; absent = the profile's dtype"
    )
    method: Literal[DRAFTER_METHODS] | None = Field(  # type: ignore[valid-type]
        default=None,
        description="which engine method the drafter is. draft models: mtp, the target's own "
        "multi-token-prediction module (its checkpoint's MTP layers, costed as a draft model: "
        "the engines run it as their MTP method, with no model path of its own); absent = a "
        "separate model. block drafters (required): dflash, dspark, p_eagle (an EAGLE-3 head "
        "trained for parallel drafting) or pard (a draft model trained for it)",
    )
    max_k: Dimension | None = Field(
        default=None,
        description="block drafters: the most drafts one pass proposes (the mask slots of the "
        "block it was trained with, e.g. 15 for a DFlash b16 drafter); a window above it is "
        "refused. dspark runs exactly this many (vLLM's default num_speculative_tokens)",
    )

    @property
    def device_weight_bytes(self) -> int:
        """Weight bytes on the device that holds the most of this model."""
        return self.sharding.weight_bytes_per_device if self.sharding else self.weight_bytes

    @property
    def device_kv_bytes_per_token(self) -> int:
        return (
            self.sharding.kv_bytes_per_token_per_device
            if self.sharding
            else self.kv_bytes_per_token
        )

    @model_validator(mode="after")
    def _needs_a_cost(self) -> ModelSpec:
        needs_latency = MODEL_KINDS[self.kind].needs_latency
        if needs_latency and self.latency is None:
            raise ValueError(f"a {self.kind} needs a 'latency' section")
        if not needs_latency and self.latency is None and self.draft_step_s is None:
            raise ValueError(f"a {self.kind} drafter needs 'draft_step_s' or a 'latency' section")
        methods = MODEL_KINDS[self.kind].methods
        if self.method is not None and self.method not in methods:
            owner = next(k.name for k in DRAFTER_KINDS.values() if self.method in k.methods)
            raise ValueError(f"method {self.method} is a {owner}'s, not a {self.kind}'s")
        if self.kind == "block" and self.method is None:
            raise ValueError(f"a block drafter needs 'method': one of {', '.join(methods)}")
        if (self.max_k is not None) != (self.kind == "block"):
            raise ValueError("'max_k' is a block drafter's key, and every block drafter needs it")
        if self.passes is not None and self.kind != "heads":
            raise ValueError(
                f"'passes' describes decoding heads, not a {self.kind}; remove it from this model"
            )
        return self

    @property
    def head_passes(self) -> str:
        """How a heads drafter's passes are laid out (``passes``, parallel when absent)."""
        return self.passes or "parallel"


class Overhead(StrictModel):
    """Per-iteration engine cost outside the forward passes (scheduling, sampling, verifying,
    cache rollback, the serving loop's bookkeeping).

    An iteration over ``B`` sequences with window ``k`` (k draft passes) is charged::

        per_step_s + per_sequence_s * B + k * (per_draft_step_s + per_draft_token_s * B)

    on top of its forward passes, and one that carries ``T`` prompt tokens (a prefill, or
    chunks riding in a decode step) also ``per_prefill_s + per_prefill_token_s * T``. The draft
    terms are what each draft pass adds outside the drafter's forward pass (processing q and
    sampling a draft, and the verifier's work per position); the prefill terms what the
    serving loop's prefill adds (slots, first-token sampling, passes cache-cold after the other
    model's). All but the first two default to 0 so profiles written before them stay valid,
    and a drafter's own ``overhead`` section, when it has one, replaces the draft and prefill
    terms for that drafter. ``per_request_s`` is no iteration's: each request reaches the
    engine that long after its client sent it, so its TTFT and E2E pay it and no pass does.
    """

    per_step_s: Seconds = 0.0
    per_sequence_s: Seconds = 0.0
    per_draft_step_s: Seconds = 0.0
    per_draft_token_s: Seconds = 0.0
    per_prefill_s: Seconds = 0.0
    per_prefill_token_s: Seconds = 0.0
    per_request_s: Seconds = Field(
        default=0.0,
        description="each request's way in, from the client's send to the engine's queue (HTTP, "
        "chat template, tokenising in the API server): added to its TTFT and E2E, not to any "
        "iteration (the API server runs beside the engine's loop)",
    )
    source: Literal["measured", "stated", "roofline"] = "stated"


class IterationJitter(StrictModel):
    """How much one serving iteration's time varies on the profiled machine.

    ``quantiles[i]`` is the multiplier at probability ``i / (n - 1)``: the distribution of one
    timed iteration over the median of its shape, pooled over the profiler's repeated serving
    iterations, scaled so that a draw averages 1 (the profiler writes it so: its waves' spread
    runs right-skewed). The latency fits and overhead give the typical time; the simulator
    multiplies each iteration by an independent draw from this distribution (inverse transform
    of a seeded uniform, linear between quantiles), so latency tails (TTFT p90) and queueing feel
    the spread the machine has, and the mean iteration is the fitted time. Without it every
    iteration takes exactly the fitted time.
    """

    quantiles: list[Factor] = Field(min_length=2)
    samples: Annotated[int, Field(ge=2, le=MAX_COUNT)]
    source: Literal["measured", "stated"] = "measured"

    @model_validator(mode="after")
    def _sorted(self) -> IterationJitter:
        if any(b < a for a, b in itertools.pairwise(self.quantiles)):
            raise ValueError("jitter.quantiles must not decrease")
        return self


class AcceptanceSequences(StrictModel):
    """Per-request acceptance for trace-driven simulation, in a text file beside the profile.

    One request per line, whitespace-separated values, one per generated position:
    ``run_length``: how many tokens a step starting there would emit with unlimited k (a window
    of k emits min(value, k + 1)); ``beta``: the probability that a draft at that position is
    accepted (the profiler writes, for exact rejection, the probability given the token the text
    emits there: min(1, q / p) at it; see ``specsim.profiling.scoring``).
    """

    path: str = Field(description="relative to the profile file")
    kind: Literal["run_length", "beta"]
    requests: Requests


class Acceptance(StrictModel):
    """Acceptance of one drafter under one verifier at one temperature.

    ``per_position[i]`` is the conditional probability that draft i + 1 of a step is accepted
    given drafts 1..i were (the chain statistic, walked over real steps). For drafters that do not
    always propose (n-gram lookup), the rates are conditional on a proposal and
    ``proposal_rate`` is the share of steps that propose at all.

    ``per_position`` is walked with the widest window, whose steps start elsewhere than a
    narrower window's; where ``mean_acceptance_length`` holds every k from 1 up, the simulator
    chains the rates that reproduce each of those lengths instead
    (``specsim.simulation.acceptance.window_rates``).

    Acceptance as engines report it may stand in for ``per_position``: a mean acceptance length
    at one k or a table of them (``mean_acceptance_length``), or counts of steps by accepted
    drafts (``acceptance_histograms``). Where ``per_position`` is absent it is derived from them
    by the rules in ``specsim.profile.reported``; where given, it is kept.
    """

    drafter: Name
    verifier: VerifierName = Field(description=verifier_descriptions())
    temperature: Temperature
    per_position: list[Probability] = Field(
        default_factory=list,
        max_length=MAX_K,
        description="conditional rate of draft i + 1 given drafts 1..i were accepted. Absent: "
        "from the widest acceptance_histograms entry (u_i = share of steps that accepted at "
        "least i drafts, rate i = u_i / u_(i-1)), else from mean_acceptance_length (positions "
        "1..k0 of the smallest k given share the constant rate a with 1 + a + ... + a^k0 = "
        "L_k0, solved to rounding; each further k's rate is its gain L_k - L_(k-1) over the "
        "chain's reach, within [0, 1], so where the table falls the rates are 0 from there on; "
        "lengths of a drafter with proposal_rate r < 1 are first taken per proposal, "
        "1 + (L - 1) / r)",
    )
    mean_acceptance_length: dict[
        Annotated[int, Field(ge=1, le=MAX_K)], Annotated[float, Field(ge=1, le=MAX_K + 1)]
    ] = Field(
        default_factory=dict,
        description="k -> 1 + accepted / steps, as measured or published (at most k + 1): one "
        "k (a scalar length) or an AL(k) table, which need not rise with k; without gaps "
        "(every k from the smallest given to the largest), or the profile is refused. Absent "
        "with acceptance_histograms: their mean lengths, 1 + r x the mean accepted drafts at "
        "proposal_rate r (the histograms count the steps that proposed)",
    )
    acceptance_histograms: list[AcceptanceHistogram] = Field(
        default_factory=list,
        max_length=MAX_K,
        description="steps counted by accepted drafts, one histogram per k (vLLM's per-request "
        "metrics.speculative_decoding, SGLang's meta_info): where absent, mean_acceptance_length "
        "is each one's at its k, and per_position and (from per-request counts) "
        "request_concentration are the widest k's",
    )
    proposal_rate: Share = 1.0
    request_concentration: Factor | None = Field(
        default=None,
        description="heterogeneity across requests: each request's rate scale is drawn from a "
        "Beta with this concentration (larger = more alike); absent = all alike. Absent with "
        "per-request acceptance_histograms counts: fitted to the spread of the requests' "
        "first-draft acceptance by the method of moments (beta-binomial; none where the "
        "spread is within what the step counts alone give)",
    )
    token_beta_mean: Probability | None = Field(
        default=None, description="beta averaged over every position (overstates chains)"
    )
    tv_distance: Probability | None = Field(
        default=None, description="lossy verifiers: distance of their output from p"
    )
    sequences: AcceptanceSequences | None = None
    source: Literal["measured", "calibrated", "published", "assumed"] = "measured"
    tokens_scored: Count | None = None

    @model_validator(mode="after")
    def _lengths_from_histograms(self) -> Acceptance:
        # Before the length checks, so that a derived table is checked as a given one is.
        ks = [h.k for h in self.acceptance_histograms]
        if len(set(ks)) < len(ks):
            raise ValueError(
                f"acceptance_histograms for {self.drafter}/{self.verifier} has two at one k; "
                "fix: give one histogram per k (sum the runs)"
            )
        if not self.mean_acceptance_length:
            # The histograms count steps that proposed; the length is over every step.
            self.mean_acceptance_length = {
                h.k: 1.0 + self.proposal_rate * (h.mean_length() - 1.0)
                for h in self.acceptance_histograms
            }
        return self

    @model_validator(mode="after")
    def _lengths_within_windows(self) -> Acceptance:
        for k, length in self.mean_acceptance_length.items():
            if length > k + 1:
                raise ValueError(
                    f"mean_acceptance_length at k = {k} is {length:g}, more than the k + 1 = "
                    f"{k + 1} tokens a step emits; fix: give 1 + accepted / steps"
                )
        return self

    @model_validator(mode="after")
    def _lengths_without_a_gap(self) -> Acceptance:
        # The simulator chains the lengths from k = 1 up to the first missing k; past a gap a
        # length would be silently ignored (and the chain contradict it), so refuse one.
        ks = sorted(self.mean_acceptance_length)
        missing = sorted(set(range(ks[0], ks[-1] + 1)) - set(ks)) if ks else []
        if missing:
            given = ", ".join(map(str, ks))
            lacks = ", ".join(map(str, missing))
            raise ValueError(
                f"mean_acceptance_length for {self.drafter}/{self.verifier} has k = {given} but "
                f"not k = {lacks}: the simulator chains every k from 1 up and would ignore the "
                f"lengths past the gap; fix: add k = {lacks} (measure it), or remove the k "
                "values past the gap"
            )
        return self

    @model_validator(mode="after")
    def _derived_from_reported_forms(self) -> Acceptance:
        # Converted once at load time, so the simulator reads per_position as always.
        if self.acceptance_histograms:
            widest = max(self.acceptance_histograms, key=lambda h: h.k)
            if self.request_concentration is None and widest.requests:
                self.request_concentration = histogram_concentration(widest.requests)
            if not self.per_position:
                self.per_position = histogram_rates(widest.pooled())
        if self.per_position:
            return self
        if not self.mean_acceptance_length:
            raise ValueError(
                f"acceptance for {self.drafter}/{self.verifier} has no per_position, "
                "mean_acceptance_length or acceptance_histograms; fix: give one of them"
            )
        for k, length in self.mean_acceptance_length.items():
            if 1.0 + (length - 1.0) / self.proposal_rate > k + 1:
                raise ValueError(
                    f"mean_acceptance_length at k = {k} is {length:g}, more than k + 1 "
                    f"tokens per proposal at proposal_rate {self.proposal_rate:g}; fix: give "
                    "1 + accepted / steps over every step, or the share of steps that propose"
                )
        self.per_position = table_rates(self.mean_acceptance_length, self.proposal_rate)
        return self


TREE_DRAFTS = {
    "top-k": "rank r is the drafter's r-th most likely token (EAGLE-2's expansion)",
    "iid": "children drawn independently from q (SpecInfer)",
    "without-replacement": "children drawn from q without replacement (Sequoia, RSD)",
}
# Rounding to 6 significant digits leaves a distribution's sum this close to 1, and more.
TREE_SUM_TOLERANCE = 1e-4


class TreeMonteCarlo(StrictModel):
    """How a tree entry's estimated scores were drawn (``profiling.tree_without_replacement``)."""

    seed: Seed = Field(description="the estimate's generator seed")
    samples: Annotated[int, Field(ge=1, le=MAX_COUNT)] = Field(
        description="sibling histories drawn per scored position"
    )
    standard_error: Annotated[float, Field(ge=0, le=MAX_K)] = Field(
        description="of mean_acceptance_length: the spread of the replicates' walks / sqrt(count)"
    )


class TreeAcceptance(StrictModel):
    """Acceptance of one drafter's trees of one shape under one verifier at one temperature.

    ``accepted_length[j]`` is the probability that a step accepts j drafted nodes (j = 0 .. the
    tree's depth; the step emits j + 1 tokens), walked over the target's own text as the chain
    rates are (``specsim.profiling.tree_acceptance``). ``rates[d][r]`` is the conditional
    probability that the rank-r child of a node at depth d is accepted, given the step reached
    that node and rejected its elder siblings (null where no step tried it): what a shape that was
    not measured is derived from (``derive_tree_acceptance``, entries with source 'derived').
    """

    drafter: Name
    verifier: VerifierName = Field(description=verifier_descriptions())
    temperature: Temperature
    tree: list[list[Annotated[int, Field(ge=0, le=MAX_TREE_NODES)]]] = Field(
        min_length=1,
        description="the drafted nodes as paths of child ranks from the root, breadth-first "
        "(specsim.tree: [[0], [1], [0, 0]] is two children and one grandchild)",
    )
    drafts: Literal[tuple(TREE_DRAFTS)] = Field(  # type: ignore[valid-type]
        description="how each node's children were drafted: "
        + "; ".join(f"{k}: {v}" for k, v in TREE_DRAFTS.items())
    )
    accepted_length: list[Probability] = Field(
        min_length=2, description="P(a step accepts j nodes), j = 0 .. depth; sums to 1"
    )
    mean_acceptance_length: Annotated[float, Field(ge=1, le=MAX_K + 1)] = Field(
        description="1 + the mean accepted nodes per step"
    )
    rates: list[list[Probability | None]] = Field(
        default_factory=list,
        description="[depth][rank]: conditional acceptance of the rank-r child of a node at "
        "depth d (0: the root's children), null where no step tried it",
    )
    source: Literal["measured", "derived"] = Field(
        default="measured",
        description="measured: walked for this shape; derived: this shape was not measured and "
        "its distribution comes from another's rates (see derived_from)",
    )
    derived_from: str | None = Field(
        default=None, description="derived entries: the measurement the rates come from"
    )
    tokens_scored: Count | None = None
    monte_carlo: TreeMonteCarlo | None = Field(
        default=None,
        description="present where part of the scores was estimated (without-replacement "
        "children past the third of a node): the seed, histories and standard error",
    )

    @property
    def shape(self) -> TreeShape:
        return TreeShape(tuple(tuple(path) for path in self.tree))

    @model_validator(mode="after")
    def _consistent(self) -> TreeAcceptance:
        try:
            shape = self.shape
        except SpecsimError as exc:
            raise ValueError(exc.message + (f"; fix: {exc.fix}" if exc.fix else "")) from None
        if len(self.accepted_length) != shape.depth + 1:
            raise ValueError(
                f"accepted_length has {len(self.accepted_length)} entries for a tree of depth "
                f"{shape.depth}; fix: give one per accepted count 0..{shape.depth}"
            )
        total = sum(self.accepted_length)
        if abs(total - 1.0) > TREE_SUM_TOLERANCE:
            raise ValueError(f"accepted_length sums to {total:.6g}; fix: give probabilities")
        mean = 1.0 + sum(j * p for j, p in enumerate(self.accepted_length))
        if abs(mean - self.mean_acceptance_length) > 1e-3:
            raise ValueError(
                f"mean_acceptance_length {self.mean_acceptance_length:g} but accepted_length "
                f"gives {mean:.6g}; fix: give 1 + the mean of accepted_length"
            )
        return self


def derive_tree_acceptance(rates: list[list[float | None]], shape: TreeShape) -> list[float]:
    """The stated model for a shape that was not measured: each child is accepted, given the
    step reached its parent and rejected its elder siblings, at ``rates[d][r]`` of its depth and
    rank, independently of the rest. Depths past the rates take the deepest given depth's; a
    rank without a rate accepts nothing (an unmeasured sibling is not assumed to help).
    Returns P(j nodes accepted), j = 0 .. depth."""
    if not rates:
        raise ValueError("no rates to derive a tree from")
    dist = np.zeros(shape.depth + 1)
    mass = {-1: 1.0}
    for node in (-1, *range(shape.num_nodes)):
        depth = 0 if node < 0 else int(shape.depths[node])
        here = mass.pop(node)
        row = rates[min(depth, len(rates) - 1)]
        for rank, child in enumerate(shape.children(node)):
            rate = row[rank] if rank < len(row) and row[rank] is not None else 0.0
            mass[child] = here * rate
            here -= mass[child]
        dist[depth] += here
    return [float(p) for p in dist]


class Profile(StrictModel):
    version: Literal[1]
    name: Name
    provenance: Provenance
    hardware: Hardware
    target: ModelSpec
    drafters: dict[Name, ModelSpec] = Field(default_factory=dict)
    overhead: Overhead = Field(default_factory=Overhead)
    jitter: IterationJitter | None = None
    prefill_jitter: IterationJitter | None = Field(
        default=None,
        description="the spread of iterations that only prefill (long, compute-bound: they vary "
        "less than decodes); without it they take `jitter`'s",
    )
    acceptance: list[Acceptance] = Field(default_factory=list)
    tree_acceptance: list[TreeAcceptance] | None = Field(
        default=None,
        description="speculation trees: accepted-length distributions per drafter x verifier x "
        "temperature x tree shape x drafting (absent: no tree was profiled)",
    )

    @model_validator(mode="after")
    def _consistent(self) -> Profile:
        if self.target.kind != "target":
            raise ValueError("target.kind must be 'target'")
        for name, spec in self.drafters.items():
            if spec.kind == "target":
                kinds = "/".join(DRAFTER_KINDS)
                raise ValueError(f"drafter {name!r} has kind 'target'; use {kinds}")
        tp = self.hardware.devices
        if (self.target.sharding.tensor_parallel_size if self.target.sharding else 1) != tp:
            raise ValueError(
                f"hardware.tensor_parallel_size is {tp} but target.sharding describes "
                "another split; fix: give the target a sharding over the replica's devices"
            )
        for name, spec in self.drafters.items():
            if spec.sharding and spec.sharding.tensor_parallel_size not in (1, tp):
                raise ValueError(
                    f"drafter {name!r} is sharded over {spec.sharding.tensor_parallel_size} "
                    f"devices; fix: use 1 or the replica's {tp} (as vLLM allows)"
                )
        if self.prefill_jitter is not None and self.jitter is None:
            raise ValueError("prefill_jitter needs jitter (the decode iterations' spread) too")
        seen = set()
        for entry in self.acceptance:
            key = (entry.drafter, entry.verifier, entry.temperature)
            if key in seen:
                # A lookup would silently take one of them.
                raise ValueError(
                    f"two acceptance entries for drafter {entry.drafter!r}, verifier "
                    f"{entry.verifier!r} at temperature {entry.temperature:g}; keep one"
                )
            seen.add(key)
            if entry.drafter not in self.drafters:
                known = ", ".join(sorted(self.drafters)) or "none"
                raise ValueError(
                    f"acceptance names drafter {entry.drafter!r}, which is not under drafters "
                    f"(drafters: {known})"
                )
        self._consistent_trees()
        return self

    def _consistent_trees(self) -> None:
        seen = set()
        for entry in self.tree_acceptance or []:
            key = (entry.drafter, entry.verifier, entry.temperature, entry.drafts, entry.shape)
            if key in seen:
                raise ValueError(
                    f"two tree_acceptance entries for drafter {entry.drafter!r}, verifier "
                    f"{entry.verifier!r} at temperature {entry.temperature:g}, {entry.drafts} "
                    f"drafts and tree {entry.tree}; keep one"
                )
            seen.add(key)
            if entry.drafter not in self.drafters:
                raise ValueError(
                    f"tree_acceptance names drafter {entry.drafter!r}, which is not under "
                    "drafters; fix: add the drafter or remove the entry"
                )

    def tree_acceptance_for(
        self, drafter: str, verifier: str, temperature: float, shape: TreeShape, drafts: str
    ) -> TreeAcceptance:
        """The measured entry for this tree, else one derived (``derive_tree_acceptance``) from
        the largest measured tree of the same drafter, verifier, temperature and drafting, else
        from the chain entry's per-position rates as the best (rank-0) child's, siblings
        accepting nothing. Temperatures match within 0.05 unless the verifier is greedy."""
        free = VERIFIER_KINDS[verifier].greedy_reference

        def same(entry) -> bool:
            close = free or abs(entry.temperature - temperature) <= 0.05
            return entry.drafter == drafter and entry.verifier == verifier and close

        trees = [t for t in self.tree_acceptance or [] if same(t) and t.drafts == drafts]
        for entry in trees:
            if entry.shape == shape and entry.source == "measured":
                return entry
        measured = [t for t in trees if t.source == "measured" and t.rates]
        if measured:
            base = max(
                measured, key=lambda t: (t.shape.num_nodes, -abs(t.temperature - temperature))
            )
            rates, origin = base.rates, f"the measured tree {base.tree} ({base.drafts} drafts)"
        else:
            chains = [a for a in self.acceptance if same(a)]
            if not chains:
                raise SpecsimError(
                    f"no acceptance of drafter {drafter!r} under {verifier!r} at temperature "
                    f"{temperature:g} to derive a tree from",
                    key="tree_acceptance",
                    fix="profile the pair (a tree shape or its chain) with this verifier",
                )
            chain = min(chains, key=lambda a: abs(a.temperature - temperature))
            rates = [[rate] for rate in chain.per_position]
            origin = "the chain's per_position rates (rank 0 only)"
        dist = derive_tree_acceptance(rates, shape)
        return TreeAcceptance(
            drafter=drafter,
            verifier=verifier,
            temperature=temperature,
            tree=shape.to_paths(),
            drafts=drafts,
            accepted_length=dist,
            mean_acceptance_length=1.0 + float(np.dot(np.arange(len(dist)), dist)),
            source="derived",
            derived_from=origin,
        )
