"""The workload of a benchmark run, rebuilt as a scenario the simulator replays.

Every run becomes a request trace (Vidur layout) written into the calibration's working folder,
replayed with ``workload.max_concurrency`` when the client capped requests in flight:

- Send times: an infinite rate sends every request at time 0; with a cap that is a closed loop
  of that many clients with no think time (each request sent when a slot frees), whatever send
  times the file saved, since those follow the real server's speed, not the client's plan. A
  finite rate replays the run's own send times (``--save-detailed`` ``start_times``) when the
  file saved them; otherwise they are drawn, one schedule per run from a seed fixed by the
  file's hash and the run's place in it: gamma gaps of shape
  ``burstiness`` (1 = Poisson; coefficient of variation 1 / sqrt(burstiness)) and mean 1 /
  rate, rescaled so the schedule spans n / rate, as vLLM 0.33 rescales its own.
- A finite rate with a cap sends each request at its time or, if the cap is reached, when one
  finishes. A saved send time already includes the client's wait, so under the cap it is
  delayed further only where the simulated server is slower than the real one was.
- Lengths: the exact per-request prompt and output lengths in their order when saved;
  otherwise uniform over the range the file states (SGLang's ``random`` dataset), otherwise
  every request at the file's mean lengths (rounded). Fixed lengths lack the real spread, which
  TTFT and E2E percentiles follow, so those are then left out of the fit (``spread_known``).
- A run's prefix-cache hit share (``BenchRun.prefix_hit_share``) becomes the replay's
  ``workload.prefix``: that share of every prompt cached (source 'fraction').
- Only the completed requests are replayed (the metrics are theirs; failures are not modelled).
- Engine caps no result file states come from ``EngineDefaults``, each with its source
  (``calibration.caps.resolve_caps``): SGLang's ``server_info`` gives ``max_running_requests``,
  which is the running-batch cap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from specsim.scenario import Engine, Scenario
from specsim.serving.runs import BenchRun

TRACE_HEADER = "arrived_at,num_prefill_tokens,num_decode_tokens\n"


@dataclass(frozen=True)
class EngineDefaults:
    """The engine settings of every run whose file does not state them."""

    max_batch: int = Engine().max_batch
    max_batched_tokens: int = Engine().max_batched_tokens
    # Where each came from, in words (``calibration.caps.resolve_caps``).
    sources: tuple[str, str] = ("specsim's default", "specsim's default")
    # The engine ran prefill batches apart from decode batches (``engine.chunked_prefill``
    # false), and why, in words.
    prefill_apart: bool = False
    prefill_source: str = "prompt chunks ride in the decode iterations (chunked prefill)"


@dataclass(frozen=True)
class Speculation:
    """What a run's scenario speculates with (None: speculation off)."""

    drafter: str
    k: int
    verifier: str
    temperature: float
    acceptance: Any = None  # the run's own acceptance entry (an ``Acceptance``), when it has one


@dataclass(frozen=True)
class Replay:
    """One run as the simulator replays it, and how it was rebuilt (for the report)."""

    run: BenchRun
    trace: Path
    seed: int
    engine: dict[str, int]
    speculation: Speculation | None
    arrivals: str  # how the send times were obtained, in words
    lengths: str  # how the lengths were obtained, in words
    spread_known: bool  # the lengths vary as the run's did (exact, or drawn from its range)
    lead_in_s: float = (
        0.0  # the run's wait before its first send, when its saved times are replayed
    )
    engine_sources: dict[str, str] | None = None  # where each cap came from, in words

    def duration(self, simulated_s: float) -> float:
        """The run's length as its client counts it: the simulated one (first send to last
        token) and the wait before the first send that vLLM's duration includes, when the file
        tells it (``Lengths.lead_in_s``)."""
        return simulated_s + self.lead_in_s

    def scenario(self, profile_path: str) -> Scenario:
        workload = {"kind": "trace", "trace": str(self.trace), "format": "vidur"}
        if self.run.traffic.max_concurrency is not None:
            workload["max_concurrency"] = self.run.traffic.max_concurrency
        if self.run.prefix_hit_share:
            workload["prefix"] = {"source": "fraction", "fraction": self.run.prefix_hit_share}
        speculation = {}
        if self.speculation is not None:
            spec = self.speculation
            speculation = {
                "drafter": spec.drafter,
                "k": spec.k,
                "verifier": spec.verifier,
                "temperature": spec.temperature,
            }
        data = {
            "name": "calibration",
            "seed": self.seed,
            "profile": profile_path,
            "workload": workload,
            "engine": self.engine,
            "speculation": speculation,
        }
        return Scenario.model_validate(data)

    def describe(self) -> dict:
        traffic = self.run.traffic
        return {
            "requests": self.run.completed,
            "arrivals": self.arrivals,
            "max_concurrency": traffic.max_concurrency,
            "lengths": self.lengths,
            "engine": self.engine,
            "engine_sources": self.engine_sources,
            "prefix_hit_share": self.run.prefix_hit_share,
            "seed": self.seed,
        }


def run_seed(run: BenchRun, base: int) -> int:
    """A seed fixed by the file's content, the run's place in it and ``base``: the same
    files give the same schedules and the same simulated draws in every evaluation."""
    return (int(run.sha256[:15], 16) + 7919 * run.index + base) % 2**62


def send_times(run: BenchRun, rng: np.random.Generator) -> tuple[np.ndarray, str]:
    """The completed requests' send times (s, the first at 0) and how they were obtained."""
    n = run.completed
    traffic = run.traffic
    if not math.isfinite(traffic.request_rate):
        if traffic.max_concurrency is not None:
            return np.zeros(n), f"a closed loop of {traffic.max_concurrency} clients"
        return np.zeros(n), "all at once (infinite rate)"
    if run.lengths.start_times_s is not None:
        return np.asarray(run.lengths.start_times_s, dtype=np.float64), "the run's send times"
    rate, shape = traffic.request_rate, traffic.burstiness
    if math.isinf(shape):
        gaps = np.full(n, 1.0 / rate)
        how = f"evenly at {rate:g}/s"
    else:
        gaps = rng.gamma(shape, 1.0 / (rate * shape), size=n)
        process = "Poisson" if shape == 1.0 else f"gamma, cv {1 / math.sqrt(shape):.3g}"
        how = f"{process} at {rate:g}/s, rescaled to span n / rate"
    times = np.cumsum(gaps)
    times *= (n / rate) / times[-1]
    return times - times[0], how


def request_lengths(run: BenchRun, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, str]:
    """Prompt and output tokens per completed request, and how they were obtained."""
    n, lengths = run.completed, run.lengths
    drawn, words = [], []
    for name, exact, span, mean in (
        ("prompt", lengths.input_lens, lengths.input_range, lengths.input_mean),
        ("output", lengths.output_lens, lengths.output_range, lengths.output_mean),
    ):
        if exact is not None:
            drawn.append(np.asarray(exact, dtype=np.int64))
            words.append(f"{name}: the run's own, per request")
        elif span is not None:
            drawn.append(rng.integers(span[0], span[1], size=n, endpoint=True, dtype=np.int64))
            words.append(f"{name}: uniform over [{span[0]}, {span[1]}]")
        else:
            value = max(round(mean), 1)
            drawn.append(np.full(n, value, dtype=np.int64))
            words.append(f"{name}: fixed at the mean, {value}")
    return np.maximum(drawn[0], 1), np.maximum(drawn[1], 1), "; ".join(words)


def spread_known(run: BenchRun) -> bool:
    """Whether the replayed lengths vary as the run's did (exact, or over its stated range)."""
    lengths = run.lengths
    return all(
        exact is not None or span is not None
        for exact, span in (
            (lengths.input_lens, lengths.input_range),
            (lengths.output_lens, lengths.output_range),
        )
    )


def engine_settings(run: BenchRun, defaults: EngineDefaults) -> tuple[dict[str, int], dict]:
    """The run's caps (and its prefill schedule where the engine runs prefill apart), and where
    each came from."""
    running = run.server.get("max_running_requests")
    stated = isinstance(running, int) and running > 0
    max_batch = running if stated else defaults.max_batch
    sources = {
        "max_batch": "the run's server_info (max_running_requests)"
        if stated
        else defaults.sources[0],
        "max_batched_tokens": defaults.sources[1],
    }
    engine = {"max_batch": max_batch, "max_batched_tokens": defaults.max_batched_tokens}
    if defaults.prefill_apart:
        engine["chunked_prefill"] = False
        sources["chunked_prefill"] = defaults.prefill_source
    return engine, sources


def replay(
    run: BenchRun,
    trace: Path,
    speculation: Speculation | None,
    defaults: EngineDefaults,
    base_seed: int = 0,
) -> Replay:
    """The run rebuilt, its trace written to ``trace``."""
    seed = run_seed(run, base_seed)
    rng = np.random.default_rng(seed)
    times, arrivals = send_times(run, rng)
    prompts, outputs, lengths = request_lengths(run, rng)
    order = np.argsort(times, kind="stable")  # a saved schedule in send order
    # repr of a Python float keeps every digit, so the replay sends at the same instants.
    rows = zip(times[order].tolist(), prompts[order].tolist(), outputs[order].tolist(), strict=True)
    trace.write_text(TRACE_HEADER + "".join(f"{t!r},{p},{o}\n" for t, p, o in rows), "utf-8")
    engine, sources = engine_settings(run, defaults)
    saved = math.isfinite(run.traffic.request_rate) and run.lengths.start_times_s is not None
    lead_in = (run.lengths.lead_in_s or 0.0) if saved else 0.0
    return Replay(
        run,
        trace,
        seed,
        engine,
        speculation,
        arrivals,
        lengths,
        spread_known(run),
        lead_in,
        sources,
    )
