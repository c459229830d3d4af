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

from pydantic import Field, model_serializer, model_validator

from specsim.bounds import (
    MAX_COUNT,
    ByteCount,
    Bytes,
    Count,
    Dimension,
    Factor,
    Flops,
    PositiveFlops,
    Price,
    Seconds,
    TensorParallel,
)
from specsim.config import Name, StrictModel
from specsim.profile.acceptance import Acceptance, TreeAcceptance, tree_entry
from specsim.profile.kinds import DRAFTER_KINDS, DRAFTER_METHODS, MODEL_KINDS
from specsim.profile.latency import Latency
from specsim.profile.provenance import Provenance
from specsim.tree import TreeShape

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
    ``per_request_engine_s`` is an iteration's: each request admitted into the running batch
    in an iteration (a new one or one preempted before) adds it to that iteration's seconds.
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
    per_request_engine_s: Seconds = Field(
        default=0.0,
        description="the engine loop's own work on each request it admits (scheduling it, "
        "allocating its blocks, adding it to the input and sampling batches): added to the "
        "seconds of the iteration that admits it, so every request in the batch waits for it",
    )
    source: Literal["measured", "stated", "roofline"] = "stated"

    @model_serializer(mode="wrap")
    def _unstated_engine_cost_left_out(self, handler):
        # Profiles written before the term keep their bytes when it is 0.
        data = handler(self)
        if not data.get("per_request_engine_s"):
            data.pop("per_request_engine_s", None)
        return data


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
        """The measured entry for this tree, else one derived (``tree_entry``)."""
        return tree_entry(self, drafter, verifier, temperature, shape, drafts)
