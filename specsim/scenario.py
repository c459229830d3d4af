"""The scenario file: what traffic to simulate, on which engine, with which speculation settings.

A scenario names a profile (``profile:``, relative to the scenario file) and sets the workload,
the engine, the speculation settings, the fleet, the SLO and the seed. ``specsim schema scenario``
prints its JSON Schema; every field below carries a description, from which the docs are built.
Command-line overrides (``--set speculation.k=3``) are applied before validation, so they are
type-checked by the same schema.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import pydantic
from pydantic import Field, PrivateAttr, model_validator

from specsim.bounds import (
    MAX_COUNT,
    BatchSize,
    PositiveSeconds,
    Seed,
    Share,
    TensorParallel,
    Tokens,
)
from specsim.config import Name, StrictModel, load_yaml_as
from specsim.fleet_settings import Fleet, Pool
from specsim.profile.tp_scaling import TensorParallelScaling
from specsim.speculation_settings import Speculation
from specsim.workload_settings import Workload


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
        description="fraction of the profile's hardware.memory_bytes given to weights, the "
        "engine's activations and buffers, and KV cache (the profile's figure is already what "
        "is available; lower it for headroom)",
    )
    kv_capacity_tokens: Annotated[int, Field(ge=1, le=MAX_COUNT)] | None = Field(
        default=None,
        description="override the KV-cache capacity in tokens (default: memory left after the "
        "target's and drafter's weights and the engine's activations and buffers, divided by "
        "their KV bytes per token)",
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
