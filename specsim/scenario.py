"""The scenario file: what traffic to simulate, on which engine, with which speculation settings.

A scenario names a profile (``profile:``, relative to the scenario file) and sets the workload,
the engine, the speculation settings, the fleet, the SLO and the seed. ``specsim schema scenario``
prints its JSON Schema; every field below carries a description, from which the docs are built.
Command-line overrides (``--set speculation.k=3``) are applied before validation, so they are
type-checked by the same schema.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Literal

import pydantic
from pydantic import Field, PrivateAttr, model_validator

from specsim.bounds import (
    MAX_COUNT,
    MAX_CV,
    MAX_FACTOR,
    MAX_REPLICAS,
    MAX_REQUESTS,
    MAX_SIGMA,
    MAX_TOKENS,
    MIN_FACTOR,
    BatchSize,
    Bytes,
    PositiveSeconds,
    Probability,
    Rate,
    Replicas,
    Requests,
    Seconds,
    Seed,
    Share,
    Temperature,
    TensorParallel,
    Tokens,
    WindowSize,
)
from specsim.choices import ROUTERS, WINDOW_POLICIES, schema_description, schema_literal
from specsim.config import Name, StrictModel, load_yaml_as
from specsim.errors import SpecsimError
from specsim.policy_settings import AcceptanceGate, AcceptanceShift, AdaptiveSteps
from specsim.profile.acceptance import TREE_DRAFTS
from specsim.profile.tp_scaling import TensorParallelScaling
from specsim.sampling.kinds import DEFAULT_VERIFIER, VerifierName, verifier_descriptions
from specsim.trace_formats import AUTO, TraceFormatName, trace_format_descriptions
from specsim.tree import TreeShape


class LengthDist(StrictModel):
    """A token-length distribution for prompts or outputs (at least 1 token is always drawn)."""

    dist: Literal["fixed", "uniform", "lognormal", "empirical"] = Field(
        description="'fixed': always `value`; 'uniform': integers in [low, high]; 'lognormal': "
        "median `median` and log-space standard deviation `sigma`, clipped to [low, high]; "
        "'empirical': resample the matching column of a trace file (`trace`)"
    )
    value: Tokens | None = Field(default=None, description="tokens, for 'fixed'")
    low: Tokens = Field(default=1, description="smallest length (uniform, lognormal clip)")
    high: Tokens | None = Field(
        default=None, description="largest length (uniform; lognormal clip, default unbounded)"
    )
    median: Annotated[float, Field(ge=1, le=MAX_TOKENS)] | None = Field(
        default=None, description="median tokens, for 'lognormal'"
    )
    sigma: Annotated[float, Field(ge=0, le=MAX_SIGMA)] = Field(
        default=1.0, description="standard deviation of log(length), for 'lognormal'"
    )
    trace: str | None = Field(
        default=None,
        description="trace file for 'empirical' (relative to the scenario file); prompt and "
        "output read from the same trace are drawn jointly, row by row",
    )
    format: TraceFormatName = Field(default=AUTO, description="trace column layout (see workload)")

    @model_validator(mode="after")
    def _complete(self) -> LengthDist:
        needs = {"fixed": ("value",), "uniform": ("high",), "lognormal": ("median",)}
        needs["empirical"] = ("trace",)
        for name in needs[self.dist]:
            if getattr(self, name) is None:
                raise ValueError(f"a {self.dist!r} length needs '{name}'")
        if self.dist == "uniform" and self.high < self.low:
            raise ValueError(f"uniform length has high {self.high} < low {self.low}")
        return self


PREFIX_SOURCES = {
    "column": "a trace column gives each request's cached prefix in tokens (`column`, default "
    "`cached_tokens`: the OpenAI usage field prompt_tokens_details.cached_tokens, vLLM's "
    "num_cached_tokens); the hit is taken as given",
    "session": "a trace column names each request's session (`column`, default `SessionID`, "
    "BurstGPT's, or `session_id`): a turn's prompt starts with the previous turn's prompt and "
    "output, which are cached if that turn finished on the same replica and the replica still "
    "remembers it (least recently used first out, within the KV cache its running sequences "
    "leave free)",
    "fraction": "a share of every prompt (`fraction`) is cached, for a request drawn as a hit "
    "with probability `hit_rate`",
    "system_prompt": "a shared system prompt of `length` tokens is cached, for a request drawn "
    "as a hit with probability `hit_rate`",
}


TRACE_PREFIXES = ("column", "session")


class PrefixCache(StrictModel):
    """Cached prompt prefixes (multi-turn conversations, shared system prompts): cached tokens
    skip prefill compute but still occupy the KV cache (a shared system prompt's once per
    replica while sequences hold it; other sources' each sequence its own copy). A hit is at
    most the prompt less one token (the engine computes the last one for its logits) and, with
    ``engine.block_size``, whole blocks only, as vLLM's prefix cache holds them."""

    source: Literal[tuple(PREFIX_SOURCES)] = Field(  # type: ignore[valid-type]
        description="where each request's cached prefix comes from: "
        + "; ".join(f"'{k}': {v}" for k, v in PREFIX_SOURCES.items())
    )
    column: Name | None = Field(
        default=None, description="'column' and 'session': the trace column to read"
    )
    fraction: Probability | None = Field(
        default=None, description="'fraction': the cached share of each prompt (rounded down)"
    )
    length: Tokens | None = Field(
        default=None, description="'system_prompt': the shared prefix in tokens"
    )
    hit_rate: Probability = Field(
        default=1.0,
        description="'fraction' and 'system_prompt': the probability that a request's prefix "
        "is cached (drawn per request from a stream of its own)",
    )

    @model_validator(mode="after")
    def _complete(self) -> PrefixCache:
        needs = {"fraction": "fraction", "system_prompt": "length"}
        for source, key in needs.items():
            if self.source == source and getattr(self, key) is None:
                raise ValueError(f"a {source!r} prefix needs {key!r}")
        allowed = {
            "column": {"column"},
            "session": {"column"},
            "fraction": {"fraction", "hit_rate"},
            "system_prompt": {"length", "hit_rate"},
        }[self.source]
        extra = sorted(self.model_fields_set - allowed - {"source"})
        if extra:
            raise ValueError(
                f"{', '.join(extra)} do(es) not apply to a {self.source!r} prefix; fix: remove it"
            )
        return self


class Workload(StrictModel):
    """Where requests come from and how long they are.

    Open loop (``poisson``, ``bursty``, ``fixed_rate``): requests arrive at ``rate`` per second
    regardless of how the engine copes; stop after ``duration_s`` seconds or ``requests`` requests
    (whichever comes first; at least one is required). Closed loop (``closed_loop``):
    ``concurrency`` clients each send their next request when the previous one completes, after
    an optional think time. Trace replay (``trace``): arrival times and lengths from a file.
    """

    kind: Literal["poisson", "bursty", "fixed_rate", "closed_loop", "trace"] = Field(
        description="arrival process"
    )
    rate: Rate | None = Field(
        default=None, description="mean arrival rate in requests per second (open loop)"
    )
    cv: Annotated[float, Field(ge=MIN_FACTOR, le=MAX_CV)] = Field(
        default=2.0,
        description="'bursty': coefficient of variation of the gamma inter-arrival times "
        "(1 = Poisson, larger = burstier)",
    )
    duration_s: PositiveSeconds | None = Field(
        default=None, description="stop issuing requests after this many simulated seconds"
    )
    requests: Requests | None = Field(default=None, description="stop after this many requests")
    concurrency: Requests | None = Field(
        default=None, description="'closed_loop': number of concurrent clients"
    )
    think_time_s: Seconds = Field(
        default=0.0,
        description="'closed_loop': mean think time between a response and the next request "
        "(exponentially distributed; 0 = send at once)",
    )
    trace: str | None = Field(
        default=None,
        description="'trace': the trace file, relative to the scenario file. Formats (other "
        f"columns are ignored): {trace_format_descriptions()}",
    )
    format: TraceFormatName = Field(
        default=AUTO, description="trace format; 'auto' reads the header"
    )
    max_concurrency: Requests | None = Field(
        default=None,
        description="open loop and trace: the load-test client's cap on requests in flight "
        "(vLLM's and SGLang's bench --max-concurrency). A request due while this many are in "
        "flight waits at the client, first come first served, and is sent when one finishes; "
        "its arrival_s, and so its TTFT and E2E, count from when it was sent, as the "
        "benchmark clients time them. Absent: no cap",
    )
    time_scale: Annotated[float, Field(ge=MIN_FACTOR, le=MAX_FACTOR)] = Field(
        default=1.0,
        description="'trace': multiply the trace's inter-arrival times by this factor "
        "(0.5 replays twice as fast, i.e. double the rate)",
    )
    prompt: LengthDist | None = Field(
        default=None, description="prompt lengths (required unless the workload is a trace)"
    )
    output: LengthDist | None = Field(
        default=None, description="output lengths (required unless the workload is a trace)"
    )
    prefix: PrefixCache | None = Field(
        default=None,
        description="cached prompt prefixes (prefix caching); absent: no request hits a cache",
    )

    @model_validator(mode="after")
    def _complete(self) -> Workload:
        kind = self.kind
        if kind in ("poisson", "bursty", "fixed_rate"):
            if self.rate is None:
                raise ValueError(f"a {kind!r} workload needs 'rate' (requests per second)")
            if self.duration_s is None and self.requests is None:
                raise ValueError(f"a {kind!r} workload needs 'duration_s' or 'requests'")
            expected = min(
                self.requests if self.requests is not None else math.inf,
                self.rate * self.duration_s if self.duration_s is not None else math.inf,
            )
            if expected > MAX_REQUESTS:
                # A slip such as rate: 1e9 would otherwise run until memory runs out.
                raise ValueError(
                    f"about {expected:.3g} requests (rate x duration_s) is more than one run "
                    f"simulates ({MAX_REQUESTS:,}); fix: lower rate or duration_s, or set requests"
                )
        if kind == "closed_loop":
            if self.max_concurrency is not None:
                raise ValueError(
                    "max_concurrency caps an open loop or a trace; a 'closed_loop' workload "
                    "has 'concurrency' clients instead"
                )
            if self.concurrency is None:
                raise ValueError("a 'closed_loop' workload needs 'concurrency'")
            if self.duration_s is None and self.requests is None:
                raise ValueError("a 'closed_loop' workload needs 'duration_s' or 'requests'")
        if kind != "trace" and self.prefix is not None and self.prefix.source in TRACE_PREFIXES:
            raise ValueError(
                f"a {self.prefix.source!r} prefix reads a trace column, so it needs a 'trace' "
                "workload; fix: use prefix source 'fraction' or 'system_prompt'"
            )
        if kind == "trace":
            if self.trace is None:
                raise ValueError("a 'trace' workload needs 'trace' (a file)")
        elif self.prompt is None or self.output is None:
            raise ValueError(f"a {kind!r} workload needs 'prompt' and 'output' length settings")
        return self


class Engine(StrictModel):
    """One serving replica: continuous batching with FCFS admission (vLLM-style scheduler)."""

    max_batch: BatchSize = Field(default=256, description="most sequences running at once")
    chunked_prefill: bool = Field(
        default=True,
        description="true: prompts are processed in chunks inside the decode iterations, "
        "within `max_batched_tokens` per iteration; false: a prefill runs as its own iteration",
    )
    max_batched_tokens: Tokens = Field(
        default=8192,
        description="token budget per iteration (verification positions plus prefill tokens); "
        "with chunked prefill, the share left after decoding rows goes to prompt chunks",
    )
    memory_utilisation: Share = Field(
        default=1.0,
        description="fraction of the profile's hardware.memory_bytes given to weights and KV "
        "cache (the profile's figure is already what is available; lower it for headroom)",
    )
    kv_capacity_tokens: Annotated[int, Field(ge=1, le=MAX_COUNT)] | None = Field(
        default=None,
        description="override the KV-cache capacity in tokens (default: memory left after the "
        "target's and drafter's weights, divided by their KV bytes per token)",
    )
    tensor_parallel_size: TensorParallel | None = Field(
        default=None,
        description="devices one replica spans; must be the profile's "
        "hardware.tensor_parallel_size (absent: whatever the profile describes) unless "
        "tensor_parallel_scaling is given",
    )
    tensor_parallel_scaling: TensorParallelScaling | None = Field(
        default=None,
        description="opt in: a roofline profile written for another TP is scaled to "
        "tensor_parallel_size by the roofline's arithmetic over this link, and the run is "
        "flagged as derived (measured and calibrated profiles are refused)",
    )
    padded_attention: bool = Field(
        default=False,
        description="true: a batched pass pads every row to the longest one, so attention "
        "reads each row's KV cache to the longest row's context, and a whole-prompt prefill "
        "feeds every prompt at the longest prompt's length (specsim's own engine, Hugging Face "
        "generate); false: each row attends over its own context (paged attention: vLLM, "
        "SGLang)",
    )
    block_size: Annotated[int, Field(ge=1, le=1024)] | None = Field(
        default=None,
        description="KV-cache block size in tokens (vLLM's --block-size, default there 16; "
        "SGLang's --page-size): capacity is counted in blocks, and each sequence holds "
        "ceil((its tokens + lookahead) / block_size) of them, so a part-filled last block is "
        "memory lost. The lookahead is the k + 1 positions a step verifies, and k more for a "
        "draft model (vLLM's num_lookahead_tokens, for proposers with KV of their own); a "
        "cached prefix counts whole blocks only. Absent: the cache is counted in tokens",
    )
    jitter: bool = Field(
        default=True,
        description="true: each iteration's time is its median times a seeded draw from the "
        "profile's measured spread (`jitter`), when the profile has one; false: every "
        "iteration takes its median time",
    )


class KByBatch(StrictModel):
    """A row of the 'by_batch' policy: use ``k`` while the batch is at most ``max_batch``."""

    max_batch: BatchSize = Field(description="largest running batch this row applies to")
    k: WindowSize = Field(description="window size for such batches")


WindowPolicyName = schema_literal(WINDOW_POLICIES)
TreeDraftsName = Literal[tuple(TREE_DRAFTS)]  # type: ignore[valid-type]
TreeText = str | list[list[int]]


def parse_tree(tree: TreeText) -> TreeShape:
    """A scenario's ``speculation.tree``: widths per depth (``2,2,1``) or a list of paths."""
    if isinstance(tree, list):
        return TreeShape.from_paths(tree)
    return TreeShape.parse(tree)


def _tree_error(exc: SpecsimError) -> ValueError:
    return ValueError(f"speculation.tree: {exc.message}" + (f"; fix: {exc.fix}" if exc.fix else ""))


class Speculation(StrictModel):
    """Speculative decoding settings: which drafter, how many tokens per step, which verifier."""

    drafter: Name | None = Field(
        default=None,
        description="a drafter named in the profile's `drafters`; none = speculation off",
    )
    k: WindowSize = Field(
        default=4, description="window size: tokens drafted per step (0 = speculation off)"
    )
    verifier: VerifierName = Field(default=DEFAULT_VERIFIER, description=verifier_descriptions())
    temperature: Temperature = Field(
        default=1.0, description="sampling temperature; picks the profile's acceptance entry"
    )
    policy: WindowPolicyName = Field(
        default="fixed", description=schema_description(WINDOW_POLICIES)
    )
    k_by_batch: list[KByBatch] = Field(
        default_factory=list,
        description="'by_batch' table, rows sorted by max_batch; batches above the last row "
        "use k = 0",
    )
    acceptance: Literal["per_position", "iid", "sequences"] = Field(
        default="per_position",
        description="acceptance model: 'per_position' conditional rates from the profile; "
        "'iid': one rate for every position (`acceptance_rate`, default the profile's first "
        "position); 'sequences': replay the profile's per-request sequences",
    )
    acceptance_rate: Probability | None = Field(
        default=None, description="'iid': the per-draft acceptance rate (default: profile's)"
    )
    heterogeneity: bool = Field(
        default=True,
        description="draw a per-request acceptance level from the profile's "
        "request_concentration (when it has one)",
    )
    tree: TreeText | None = Field(
        default=None,
        description="draft a tree per step instead of a chain: widths per depth (`2,2,1`: two "
        "children per node at depths 1 and 2, one at depth 3; 10 nodes) or a list of paths of "
        "child ranks (`[[0], [1], [0, 0]]`, as vLLM's speculative_token_tree). k is the tree's "
        "depth (set from it; a k that differs is refused). Each step's accepted length is drawn "
        "from the profile's tree_acceptance table for this shape (derived from its rates when "
        "the shape was not measured; no per-request heterogeneity); policy 'fixed' and "
        "acceptance 'per_position' only; draft models and decoding heads only",
    )
    tree_drafts: TreeDraftsName = Field(
        default="top-k",
        description="how the tree's children are drafted (picks the profile's tree_acceptance "
        "entry): " + "; ".join(f"'{k}': {v}" for k, v in TREE_DRAFTS.items()),
    )
    max_concurrency: BatchSize | None = Field(
        default=None,
        description="policy 'fixed': speculation off (k = 0) while more sequences than this "
        "run (TensorRT-LLM's max_concurrency; a k_by_batch table ends its own rows instead); "
        "absent: no cut-off",
    )
    acceptance_gate: AcceptanceGate | None = Field(
        default=None,
        description="TensorRT-LLM's acceptance off-switch, with policy 'fixed' or 'by_batch'; "
        "absent: speculation stays on whatever the acceptance",
    )
    adaptive_steps: AdaptiveSteps | None = Field(
        default=None,
        description="policy 'adaptive_steps': SGLang's adaptive config (absent: its defaults)",
    )
    acceptance_shift: AcceptanceShift | None = Field(
        default=None,
        description="a change of acceptance part-way through the workload (rate models only); "
        "absent: every request accepts as the profile says",
    )

    @model_validator(mode="before")
    @classmethod
    def _k_from_tree(cls, data):
        # k is the tree's depth: taken from the tree unless given (a given k is checked below).
        if isinstance(data, dict) and data.get("tree") is not None and "k" not in data:
            tree = data["tree"]
            try:
                shape = parse_tree(str(tree) if isinstance(tree, int) else tree)
            except SpecsimError as exc:
                raise _tree_error(exc) from None
            except (TypeError, ValueError):
                return data  # the field's own type check says what is wrong
            data = {**data, "k": shape.depth}
        if isinstance(data, dict) and isinstance(data.get("tree"), int):
            data = {**data, "tree": str(data["tree"])}
        return data

    @property
    def tree_shape(self) -> TreeShape | None:
        return None if self.tree is None else parse_tree(self.tree)

    def _check_tree(self) -> None:
        if self.tree is None:
            # An explicit tree: null turns a tree off (the baseline run) and leaves its drafts.
            if "tree_drafts" in self.model_fields_set and "tree" not in self.model_fields_set:
                raise ValueError("tree_drafts applies only with a tree (speculation.tree)")
            return
        try:
            shape = parse_tree(self.tree)
        except SpecsimError as exc:
            raise _tree_error(exc) from None
        if self.k != shape.depth:
            raise ValueError(
                f"k is {self.k} but the tree {self.tree!r} has depth {shape.depth}: with a "
                f"tree, k is its depth; fix: remove k or set it to {shape.depth}"
            )
        if self.policy != "fixed" or self.k_by_batch:
            raise ValueError(
                f"a tree runs with policy 'fixed' only (got {self.policy!r}"
                + (" and a k_by_batch table" if self.k_by_batch else "")
                + "); fix: remove speculation.tree or use policy: fixed"
            )
        if self.acceptance != "per_position":
            raise ValueError(
                f"a tree's accepted lengths come from the profile's tree_acceptance table, not "
                f"acceptance {self.acceptance!r}; fix: remove acceptance (per_position)"
            )

    @model_validator(mode="after")
    def _complete(self) -> Speculation:
        self._check_tree()
        if self.policy == "by_batch":
            if not self.k_by_batch:
                raise ValueError("policy 'by_batch' needs a 'k_by_batch' table")
            sizes = [row.max_batch for row in self.k_by_batch]
            if sizes != sorted(set(sizes)):
                raise ValueError("k_by_batch rows must have increasing max_batch")
        if self.acceptance_rate is not None and self.acceptance != "iid":
            raise ValueError("acceptance_rate applies only with acceptance: iid")
        self._check_switches()
        return self

    def _check_switches(self) -> None:
        """The engine switches go with the policies whose engines have them."""
        policy = self.policy
        if self.max_concurrency is not None and policy != "fixed":
            raise ValueError(
                f"max_concurrency cuts a fixed k off (policy 'fixed'), not policy {policy!r}"
                + ("; fix: end the k_by_batch table there" if policy == "by_batch" else "")
            )
        if self.acceptance_gate is not None and policy not in ("fixed", "by_batch"):
            raise ValueError(
                f"acceptance_gate is TensorRT-LLM's, for policy 'fixed' or 'by_batch', not "
                f"{policy!r}; fix: remove acceptance_gate or change the policy"
            )
        if self.adaptive_steps is not None and policy != "adaptive_steps":
            raise ValueError("adaptive_steps applies only with policy: adaptive_steps")
        if policy == "adaptive_steps":
            steps = self.steps_config.candidate_steps
            if self.k not in steps:
                raise ValueError(
                    f"k (the initial steps) is {self.k}, not one of the candidate steps "
                    f"{steps}; fix: set k to one of them (SGLang refuses it too)"
                )
        if policy == "adaptive_verification" and self.acceptance == "sequences":
            raise ValueError(
                "adaptive_verification ranks drafts by the rate models' expected survival, "
                "which replayed sequences do not give; fix: use acceptance per_position or iid"
            )
        if self.acceptance_shift is not None and self.acceptance == "sequences":
            raise ValueError(
                "acceptance_shift scales the rate models' rates, not replayed sequences; fix: "
                "use acceptance per_position or iid"
            )
        if self.acceptance_shift is not None and self.tree is not None:
            raise ValueError("acceptance_shift applies to chains, not speculation.tree")

    @property
    def steps_config(self) -> AdaptiveSteps:
        """Policy 'adaptive_steps': the scenario's config, else SGLang's defaults."""
        return self.adaptive_steps if self.adaptive_steps is not None else AdaptiveSteps()

    @property
    def enabled(self) -> bool:
        if self.drafter is None:
            return False
        return self.max_k > 0

    @property
    def max_k(self) -> int:
        """The widest window the policy may choose (0: speculation off)."""
        if self.drafter is None:
            return 0
        if self.policy == "by_batch":
            return max(row.k for row in self.k_by_batch)
        if self.policy == "adaptive_steps":
            return max(self.steps_config.candidate_steps)
        return self.k


class SpeculationOverride(StrictModel):
    """A pool's changes to the scenario's speculation settings (unset fields are inherited)."""

    drafter: Name | None = Field(default=None, description="see speculation.drafter")
    k: WindowSize | None = Field(default=None, description="see speculation.k")
    verifier: VerifierName | None = Field(default=None, description="see speculation.verifier")
    temperature: Temperature | None = Field(default=None, description="see speculation.temperature")
    policy: WindowPolicyName | None = Field(default=None, description="see speculation.policy")
    k_by_batch: list[KByBatch] | None = Field(
        default=None, description="see speculation.k_by_batch"
    )
    acceptance: Literal["per_position", "iid", "sequences"] | None = Field(
        default=None, description="see speculation.acceptance"
    )
    acceptance_rate: Probability | None = Field(
        default=None, description="see speculation.acceptance_rate"
    )
    heterogeneity: bool | None = Field(default=None, description="see speculation.heterogeneity")
    tree: TreeText | None = Field(
        default=None, description="see speculation.tree; null turns the scenario's tree off"
    )
    tree_drafts: TreeDraftsName | None = Field(
        default=None, description="see speculation.tree_drafts"
    )
    max_concurrency: BatchSize | None = Field(
        default=None, description="see speculation.max_concurrency"
    )
    acceptance_gate: AcceptanceGate | None = Field(
        default=None, description="see speculation.acceptance_gate"
    )
    adaptive_steps: AdaptiveSteps | None = Field(
        default=None, description="see speculation.adaptive_steps"
    )
    acceptance_shift: AcceptanceShift | None = Field(
        default=None, description="see speculation.acceptance_shift"
    )


class Pool(StrictModel):
    """A group of replicas sharing speculation settings (an A/B arm), reported separately."""

    name: Name = Field(description="label in the records and the summary")
    replicas: Replicas = Field(default=1, description="replicas in this pool")
    speculation: SpeculationOverride = Field(
        default_factory=SpeculationOverride,
        description="changes to the scenario's speculation settings for this pool",
    )


RouterName = schema_literal(ROUTERS)
KV_LINKS = ("nvlink", "pcie")  # the hardware file's interconnect sections


class DisaggregatedPool(StrictModel):
    """One side of a disaggregated fleet: its replicas and, when it differs, its profile."""

    replicas: Replicas = Field(default=1, description="replicas in this pool (x or y in xPyD)")
    profile: str | None = Field(
        default=None,
        description="this pool's profile (relative to the scenario file; absent: the "
        "scenario's); it must describe the same target model",
    )
    tensor_parallel_size: TensorParallel | None = Field(
        default=None,
        description="devices one replica of this pool spans; must be its profile's (absent: "
        "engine.tensor_parallel_size)",
    )


class KvTransfer(StrictModel):
    """The link a prompt's KV cache crosses from a prefill replica to a decode replica (vLLM's
    kv_transfer_config, SGLang's --disaggregation-transfer-backend): either its figures, or a
    hardware file's interconnect section."""

    bandwidth_bytes_per_s: Bytes | None = Field(
        default=None,
        description="bytes per second per device pair, one direction (each of min(prefill "
        "TP, decode TP) device pairs moves its shard at once); with `latency_s`",
    )
    latency_s: Seconds | None = Field(
        default=None, description="fixed time per transfer (set-up, first byte); with bandwidth"
    )
    hardware: str | None = Field(
        default=None,
        description="a hardware file (relative to the scenario file) whose `link` section "
        "gives the bandwidth and latency, times its efficiency.interconnect",
    )
    link: Literal[KV_LINKS] | None = Field(  # type: ignore[valid-type]
        default=None, description="the hardware file's section: 'nvlink' or 'pcie'"
    )

    @model_validator(mode="after")
    def _one_source(self) -> KvTransfer:
        figures = (self.bandwidth_bytes_per_s, self.latency_s)
        named = (self.hardware, self.link)
        if all(v is None for v in named) and None not in figures:
            return self
        if all(v is None for v in figures) and None not in named:
            return self
        raise ValueError(
            "kv_transfer needs either bandwidth_bytes_per_s and latency_s, or hardware and "
            "link (a hardware file's nvlink or pcie section), not a mix"
        )


class Disaggregation(StrictModel):
    """Prefill and decode on separate pools (xPyD; SGLang's --disaggregation-mode prefill |
    decode, vLLM's kv_producer and kv_consumer): a prefill replica computes the prompt and its
    first token, the KV cache crosses `kv_transfer`, and a decode replica decodes the rest,
    with the scenario's speculation."""

    prefill: DisaggregatedPool = Field(description="the prefill pool (x replicas)")
    decode: DisaggregatedPool = Field(description="the decode pool (y replicas)")
    kv_transfer: KvTransfer = Field(description="the link between the pools")
    decode_router: RouterName | None = Field(
        default=None,
        description="how a decode replica is picked when a prompt's prefill ends (absent: "
        "fleet.router, which spreads arrivals over the prefill pool)",
    )


class Fleet(StrictModel):
    """Replicas behind a router."""

    replicas: Replicas | None = Field(
        default=None,
        description="number of replicas (default 1); with pools, the total, which must match",
    )
    router: RouterName = Field(
        default="round_robin", description="how arrivals are spread: " + schema_description(ROUTERS)
    )
    balance_abs_threshold: int | None = Field(
        default=None,
        ge=0,
        le=MAX_REQUESTS,
        description="'cache_aware' only: the most outstanding requests by which the replica "
        "holding a session may exceed the least loaded one and still take its turn "
        "(sglang-router's --balance-abs-threshold; absent: 32, its default)",
    )
    pools: list[Pool] = Field(
        default_factory=list,
        description="optional pools with their own speculation settings; absent = one pool "
        "'main' with the scenario's settings",
    )
    disaggregation: Disaggregation | None = Field(
        default=None,
        description="split the fleet into prefill and decode pools (absent: every replica "
        "serves both); not with pools",
    )

    @model_validator(mode="after")
    def _consistent(self) -> Fleet:
        if self.balance_abs_threshold is not None and self.router != "cache_aware":
            raise ValueError(
                f"fleet.balance_abs_threshold applies to the 'cache_aware' router, not "
                f"{self.router!r}; fix: remove it or set fleet.router: cache_aware"
            )
        split = self.disaggregation
        if split is not None:
            if self.pools:
                raise ValueError("a disaggregated fleet has no pools; fix: remove fleet.pools")
            total = split.prefill.replicas + split.decode.replicas
            if self.replicas is not None and self.replicas != total:
                raise ValueError(
                    f"fleet.replicas is {self.replicas} but the disaggregated pools hold {total}"
                )
            if total > MAX_REPLICAS:
                raise ValueError(
                    f"the pools hold {total:,} replicas, more than one run simulates "
                    f"({MAX_REPLICAS:,}); fix: lower the pools' replicas"
                )
        if self.pools:
            names = [p.name for p in self.pools]
            if len(set(names)) != len(names):
                raise ValueError("pool names must be unique")
            total = sum(p.replicas for p in self.pools)
            if total > MAX_REPLICAS:
                raise ValueError(
                    f"the pools hold {total:,} replicas, more than one run simulates "
                    f"({MAX_REPLICAS:,}); fix: lower pools' replicas"
                )
            if self.replicas is not None and self.replicas != total:
                raise ValueError(
                    f"fleet.replicas is {self.replicas} but the pools hold {total} replicas"
                )
        return self

    @property
    def total_replicas(self) -> int:
        if self.disaggregation is not None:
            return self.disaggregation.prefill.replicas + self.disaggregation.decode.replicas
        if self.pools:
            return sum(p.replicas for p in self.pools)
        return self.replicas or 1


class Slo(StrictModel):
    """Per-request service-level objective; a request meets it when every given limit holds."""

    ttft_s: PositiveSeconds | None = Field(default=None, description="time to first token limit")
    tpot_s: PositiveSeconds | None = Field(default=None, description="time per output token limit")
    e2e_s: PositiveSeconds | None = Field(default=None, description="end-to-end latency limit")
    queueing_s: PositiveSeconds | None = Field(default=None, description="queueing delay limit")

    @model_validator(mode="after")
    def _has_a_metric(self) -> Slo:
        if self.limits() == {}:
            raise ValueError(
                "an slo section needs at least one of ttft_s, tpot_s, e2e_s, queueing_s"
            )
        return self

    def limits(self) -> dict[str, float]:
        names = ("ttft_s", "tpot_s", "e2e_s", "queueing_s")
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}


class Scenario(StrictModel):
    """A simulation: profile, workload, engine, speculation, fleet, SLO and seed."""

    name: Name = Field(default="scenario", description="label for reports")
    description: str = Field(default="", description="free text")
    seed: Seed = Field(
        default=0, description="one seed for every random stream (arrivals, lengths, acceptance)"
    )
    profile: str = Field(description="profile YAML file, relative to the scenario file")
    workload: Workload = Field(description="arrival process and request lengths")
    engine: Engine = Field(default_factory=Engine, description="one replica's scheduler")
    speculation: Speculation = Field(
        default_factory=Speculation, description="drafter, window size k and verifier"
    )
    fleet: Fleet = Field(default_factory=Fleet, description="replicas, router and pools")
    slo: Slo | None = Field(default=None, description="objective for goodput; absent = none")

    _source: Path | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _pools_speculate(self) -> Scenario:
        # A pool's settings are merged with the scenario's, so only the merge can be checked.
        for i, pool in enumerate(self.fleet.pools):
            try:
                self.pool_speculation(pool)
            except pydantic.ValidationError as exc:
                err = exc.errors(include_url=False)[0]
                key = ".".join(str(p) for p in err["loc"] if not str(p).startswith("function"))
                message = err["msg"].removeprefix("Value error, ")
                if not message.startswith("speculation."):
                    message = f"speculation.{key}: {message}" if key else message
                raise ValueError(f"fleet.pools[{i}] ({pool.name!r}): {message}") from None
        return self

    @property
    def source(self) -> Path | None:
        """The scenario file this was read from (relative paths resolve against its folder)."""
        return self._source

    def with_source(self, path: str | Path | None) -> Scenario:
        self._source = None if path is None else Path(path)
        return self

    def resolve(self, relative: str) -> Path:
        """A path named in the scenario, relative to the scenario file's folder."""
        path = Path(relative)
        if path.is_absolute() or self._source is None:
            return path
        return self._source.parent / path

    def pool_speculation(self, pool: Pool | None) -> Speculation:
        """The speculation settings of a pool: the scenario's, with the pool's changes."""
        if pool is None:
            return self.speculation
        merged = self.speculation.model_dump(exclude_unset=True)
        changes = pool.speculation.model_dump(exclude_none=True)
        if "tree" in pool.speculation.model_fields_set and pool.speculation.tree is None:
            # An explicit tree: null turns the scenario's tree off: the pool drafts a chain.
            merged.pop("tree", None)
            merged.pop("tree_drafts", None)
            changes.pop("tree_drafts", None)
        if "tree" in changes and "k" not in changes:
            merged.pop("k", None)  # the pool's tree sets its own depth
        merged.update(changes)
        return Speculation.model_validate(merged)


def load_scenario(path: str | Path, overrides: list[str] | None = None) -> Scenario:
    """Read and validate a scenario file, with ``--set`` overrides applied first."""
    scenario = load_yaml_as(Scenario, path, overrides, what="scenario")
    return scenario.with_source(path)
