"""One benchmark run as the serving engines report it: the record every reader returns.

Metric keys use specsim's names (``ttft_s.mean``, ``tpot_s.p99``, ``itl_s.p50``, ``e2e_s.p90``,
``throughput_tokens_per_s`` = output tokens per second, ``request_throughput``) and seconds
everywhere; the engines' ``median`` is ``p50``, and a percentile a tool writes beyond specsim's
three keeps its own name (vLLM's ``p99.9_ttft_ms`` is ``ttft_s.p99.9``). See
docs/reference/engine-formats.md for the formats themselves.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from specsim.errors import SpecsimError

METRIC_NAMES = ("ttft_s", "tpot_s", "itl_s", "e2e_s")
THROUGHPUT_KEYS = ("throughput_tokens_per_s", "request_throughput")
# A real run falls this many standard deviations short of its arrivals' expected span with
# probability below 3e-7 (normal tail; a gamma sum's lower tail is lighter still).
PACE_SIGMAS = 5.0


@dataclass(frozen=True)
class Traffic:
    request_rate: float  # requests/s; math.inf = all at once
    burstiness: float = 1.0  # gamma shape (1 = Poisson); vLLM's --burstiness
    max_concurrency: int | None = None  # client-side cap (vLLM/SGLang --max-concurrency)
    num_prompts: int = 0


@dataclass(frozen=True)
class Lengths:
    """What is known of the request lengths (of the completed requests)."""

    input_mean: float
    output_mean: float
    input_lens: tuple[int, ...] | None = None  # per request, when saved (--save-detailed)
    output_lens: tuple[int, ...] | None = None
    start_times_s: tuple[float, ...] | None = None  # send times, the first at 0, when saved
    # From the run's start to its first send, when the file tells: vLLM's duration counts from
    # before its first send, which waits one gap of the schedule.
    lead_in_s: float | None = None
    input_range: tuple[int, int] | None = None  # uniform [low, high] when the file says so
    output_range: tuple[int, int] | None = None


@dataclass(frozen=True)
class SpecCounters:
    """vLLM's spec_decode_* deltas, or a scalar an engine reports (SGLang's accept_length)."""

    k: int | None  # drafted positions per step (len of per-position rates), when known
    num_drafts: int | None = None
    draft_tokens: int | None = None
    accepted_tokens: int | None = None
    per_position: tuple[float, ...] | None = None  # UNCONDITIONAL rates (vLLM's definition)
    acceptance_length: float | None = None  # 1 + accepted / drafts (bonus included)
    acceptance_rate: float | None = None  # accepted / drafted, a fraction (vLLM writes percent)
    scalar_only: bool = False  # only a mean length or rate was reported


@dataclass(frozen=True)
class BenchRun:
    source: str  # file path
    sha256: str  # of the whole file
    index: int  # run number within the file (JSONL and appended files), from 0
    format: str  # "vllm-bench", "sglang-bench", "normalised-csv"
    engine: str  # an engine registry name (serving.registry), or "other"
    engine_version: str | None
    model: str | None
    label: str | None
    traffic: Traffic
    lengths: Lengths
    duration_s: float
    completed: int
    metrics: dict[str, float]  # seconds, keyed like summary.json (module docstring)
    itl_per_token: bool  # True: each gap split over its tokens; False: one gap per chunk
    speculation: SpecCounters | None  # None: speculation off
    server: dict = field(default_factory=dict)  # what the file says of the server
    notes: tuple[str, ...] = ()  # caveats a reader found (a lifetime average, a fixed bug)
    # The share of prompt tokens found in the prefix cache (``serving.prefix_share``), if known.
    prefix_hit_share: float | None = None

    @property
    def where(self) -> str:
        """The run in an error line: the file and the run's number in it."""
        return f"{self.source} (run {self.index + 1})"


def metric_key(name: str, statistic: str) -> str:
    """``ttft_s`` + ``median`` -> ``ttft_s.p50``; ``p99.9`` stays ``p99.9``."""
    return f"{name}.{'p50' if statistic == 'median' else statistic}"


def check_pace(run: BenchRun, rate_key: str, duration_key: str) -> None:
    """Refuse a run whose duration is too short for its requests at its stated rate.

    An open-loop run (finite rate, no concurrency cap) sends its n requests over n - 1 gaps of
    mean 1/rate and coefficient of variation 1/sqrt(burstiness); the last one is sent no earlier
    than (n - 1 - PACE_SIGMAS * sqrt((n - 1) / burstiness)) / rate, and the run lasts until it
    finishes. vLLM 0.33 even rescales its schedule to span n / rate exactly. A shorter
    duration means the rate, the count or the duration is wrong (a file edited by hand, or runs
    mixed up). Only ``completed`` requests are counted (failed ones were sent too, so this errs
    on the safe side); too few requests for the bound (n < 27 at burstiness 1) pass unchecked. A
    duration much longer than n / rate is no contradiction: an overloaded server drains slowly.
    """
    traffic = run.traffic
    if not math.isfinite(traffic.request_rate) or traffic.max_concurrency is not None:
        return
    gaps = run.completed - 1
    if gaps <= 0:
        return
    shortest = (gaps - PACE_SIGMAS * math.sqrt(gaps / traffic.burstiness)) / traffic.request_rate
    if run.duration_s < shortest:
        raise SpecsimError(
            f"{run.completed} requests at {traffic.request_rate:g} requests/s take at least "
            f"{shortest:.4g} s to send, but the run lasted {run.duration_s:.4g} s",
            file=run.where,
            key=f"{rate_key}/{duration_key}",
            fix="give the file as the benchmark wrote it (rate, completed and duration of one run)",
        )
