"""The traffic an estimate serves: the scenario's own requests, drawn as the simulator draws them.

The estimate takes the first requests of the scenario's source from the same seeded streams the
simulator spawns (arrivals, lengths), so a sweep's estimates and simulations see the same
lengths, and the offered rate: the workload's ``rate`` for an open loop, the replayed rows over
the replay window for a trace, the clients' pace for a closed loop (solved for in ``load``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specsim.scenario import Scenario
from specsim.workload import build_source

SAMPLE = 1024  # requests the estimate looks at (the first of the run)
BURST_WINDOW_S = 10.0  # the window a burst's rate is measured over


@dataclass(frozen=True)
class Traffic:
    """What one run offers: ``prompt`` and ``output`` tokens of its first requests, and
    ``requests`` in all; an open loop's ``rate`` (requests per second, None for a closed loop)
    and the closed loop's ``clients`` and ``think_s``."""

    prompt: np.ndarray
    output: np.ndarray
    requests: int
    rate: float | None
    clients: int | None = None
    think_s: float = 0.0
    burst: float = 1.0  # the busiest window's rate over the mean (requests or prompt tokens)
    last_arrival_s: float | None = None  # an open loop's last arrival (None: a closed loop)

    @property
    def closed_loop(self) -> bool:
        return self.rate is None


_CACHE: dict[tuple, Traffic] = {}
_CACHE_SIZE = 64


def traffic(scenario: Scenario) -> Traffic:
    """The scenario's traffic (cached: a sweep asks for the same workload many times; a trace
    or lengths file is named by its path, and read again in a fresh process)."""
    folder = None if scenario.source is None else str(scenario.source.resolve().parent)
    key = (scenario.workload.model_dump_json(), scenario.seed, folder)
    found = _CACHE.get(key)
    if found is None:
        if len(_CACHE) >= _CACHE_SIZE:
            _CACHE.pop(next(iter(_CACHE)))
        found = _CACHE[key] = _draw(scenario)
    return found


def _draw(scenario: Scenario) -> Traffic:
    seed = scenario.seed
    streams = np.random.SeedSequence(seed).spawn(5)
    arrivals_rng, lengths_rng = (np.random.default_rng(s) for s in streams[:2])
    built = build_source(scenario, arrivals_rng, lengths_rng)
    workload = scenario.workload
    if built.closed_loop:
        prompt, output = built.lengths.draw(lengths_rng, SAMPLE)
        requests = workload.requests if workload.requests is not None else SAMPLE
        return Traffic(
            prompt.astype(np.float64),
            output.astype(np.float64),
            int(requests),
            None,
            clients=int(workload.concurrency),
            think_s=float(workload.think_time_s),
        )
    prompts, outputs, all_times, all_prompts, count = [], [], [], [], 0
    for times, prompt, output in built.chunks():
        if count < SAMPLE:
            prompts.append(prompt[: SAMPLE - count])
            outputs.append(output[: SAMPLE - count])
        count += int(times.shape[0])
        all_times.append(np.asarray(times, dtype=np.float64))
        all_prompts.append(np.asarray(prompt, dtype=np.float64))
    if count == 0:
        raise ValueError("the workload issues no requests")
    times = np.concatenate(all_times)
    first, last = float(times[0]), float(times[-1])
    if workload.kind == "trace":
        window = workload.duration_s if workload.duration_s is not None else last - first
        rate = count / window if window > 0 else float(count)
    else:
        rate = float(workload.rate)
    return Traffic(
        np.concatenate(prompts).astype(np.float64),
        np.concatenate(outputs).astype(np.float64),
        count,
        rate,
        burst=burstiness(times, np.concatenate(all_prompts)),
        last_arrival_s=last,
    )


def burstiness(times: np.ndarray, prompt: np.ndarray, window: float = BURST_WINDOW_S) -> float:
    """The busiest ``window`` seconds' arrival rate over the run's mean, in requests or in
    prompt tokens, whichever is higher (1 for a run shorter than two windows)."""
    span = float(times[-1] - times[0]) if times.shape[0] else 0.0
    if span < 2.0 * window:
        return 1.0
    ends = np.searchsorted(times, times + window, side="left")
    tokens = np.concatenate([[0.0], np.cumsum(prompt)])
    starts = np.arange(times.shape[0])
    peak_requests = float((ends - starts).max()) / window
    peak_tokens = float((tokens[ends] - tokens[starts]).max()) / window
    mean_requests = times.shape[0] / span
    mean_tokens = float(tokens[-1]) / span
    return max(1.0, peak_requests / mean_requests, peak_tokens / max(mean_tokens, 1e-12))
