"""A scenario's ``workload`` section: the arrival process, the request lengths and the prefix
cache's hits (``specsim.scenario`` holds the whole file)."""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import Field, model_validator

from specsim.bounds import (
    MAX_CV,
    MAX_FACTOR,
    MAX_REQUESTS,
    MAX_SIGMA,
    MAX_TOKENS,
    MIN_FACTOR,
    PositiveSeconds,
    Probability,
    Rate,
    Requests,
    Seconds,
    Tokens,
)
from specsim.config import Name, StrictModel
from specsim.trace_formats import AUTO, TraceFormatName, trace_format_descriptions


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
