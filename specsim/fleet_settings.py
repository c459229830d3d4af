"""A scenario's ``fleet`` section: replicas, router, pools, and a split fleet's prefill and
decode pools with the KV transfer between them (``specsim.scenario`` holds the whole file)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from specsim.bounds import (
    MAX_REPLICAS,
    MAX_REQUESTS,
    Bytes,
    Replicas,
    Seconds,
    TensorParallel,
)
from specsim.choices import ROUTERS, schema_description, schema_literal
from specsim.config import Name, StrictModel
from specsim.speculation_settings import SpeculationOverride


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
