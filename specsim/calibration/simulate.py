"""A benchmark run simulated on a candidate profile, measured as the benchmark client measures.

The simulated requests' figures follow vLLM's ``calculate_metrics`` (``specsim.serving.latency``):
TTFT and E2E from when a request was sent, TPOT per request with 2 or more tokens, each
statistic by ``np.percentile``; ITL per streamed chunk (one per emitting iteration, the mean
exact: ``specsim.serving.vllm.bench_writer.chunk_gaps``) or, for a client that splits chunks
per token (``itl_per_token``), pooled over the tokens. The records hold no per-token times, so
ITL *percentiles* are not simulated and not fitted (``NOT_SIMULATED``). Throughputs divide by
the simulated run's length, first send to last token, as the clients divide by theirs, plus
the run's wait before its first send where the file tells it (``Replay.duration``).

Every evaluation of a run replays the same trace with the same seed (common random numbers),
so two candidate profiles differ only by their costs, never by their draws. A speculative run
is simulated with the acceptance it counted itself, not the pooled entry the profile keeps, so
that the runs' own acceptance, which differs from run to run, is not read as a cost.

A figure's weight in the fit (``figure_weight``) is 1 for a mean or a throughput and, for the
p-th percentile, a mean's sampling error over the percentile's: sqrt(p (1 - p)) / phi(z_p) for
normally distributed values (1.25 at the median, 1.71 at p90, 3.73 at p99), so that a p99 over
a few hundred requests, set by its last few, does not weigh like a mean. Each run's weights are
then scaled to a sum of squares of 1: its figures share one schedule and one set of draws and
move together, so each run weighs as one observation, however many figures its file has.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np
from scipy.stats import norm

from specsim.calibration.terms import Term, apply
from specsim.calibration.workload import Replay
from specsim.profile import Acceptance, LoadedProfile, OutOfRangeWarning, Profile
from specsim.serving.latency import time_per_output_token
from specsim.serving.runs import METRIC_NAMES
from specsim.serving.vllm.bench_writer import chunk_gaps
from specsim.simulation.records import read_records
from specsim.simulation.run import run_simulation

NOT_SIMULATED = "ITL percentiles: the simulator's records hold no per-token times"
NO_SPREAD = (
    "lengths fixed at the means (the file holds no per-request lengths): TTFT and E2E "
    "percentiles follow the lengths' spread"
)
FLOOR = 1e-12  # seconds or per-second: a simulated figure of 0 compared on a log scale


def metric_parts(key: str) -> tuple[str, str]:
    """``ttft_s.p99.9`` -> (``ttft_s``, ``p99.9``); a throughput key -> (key, "")."""
    name, _, statistic = key.partition(".")
    return name, statistic


def unfitted_reason(key: str, measured: float, spread_known: bool) -> str | None:
    """Why a measured figure is left out of the fit, or None when it is fitted."""
    name, statistic = metric_parts(key)
    if name == "itl_s" and statistic != "mean":
        return NOT_SIMULATED
    if not spread_known and name in ("ttft_s", "e2e_s") and statistic != "mean":
        return NO_SPREAD
    if measured <= 0:
        return "measured 0 (compared on a log scale)"
    return None


def figure_weight(key: str) -> float:
    """A figure's weight before the run's scaling (module docstring)."""
    _, statistic = metric_parts(key)
    if not statistic.startswith("p"):
        return 1.0
    p = min(max(float(statistic[1:]) / 100, 1e-4), 1 - 1e-4)
    return float(norm.pdf(norm.ppf(p)) / np.sqrt(p * (1 - p)))


def _statistic(values: np.ndarray, statistic: str) -> float:
    if values.size == 0:
        values = np.zeros(1)  # as vLLM: np.mean(x or 0)
    if statistic == "mean":
        return float(np.mean(values))
    return float(np.percentile(values, float(statistic[1:])))


def run_metrics(records: dict[str, np.ndarray], duration: float, keys, per_token: bool) -> dict:
    """The figures ``keys`` of one simulated run, from its per-request records."""
    arrival = records["arrival_s"]
    ttft = records["first_token_s"] - arrival
    e2e = records["finish_s"] - arrival
    values = {
        "ttft_s": ttft,
        "e2e_s": e2e,
        "tpot_s": time_per_output_token(e2e, ttft, records["output_tokens"]),
    }
    out = {}
    for key in keys:
        name, statistic = metric_parts(key)
        if name == "throughput_tokens_per_s":
            out[key] = float(records["output_tokens"].sum()) / duration
        elif name == "request_throughput":
            out[key] = arrival.size / duration
        elif name == "itl_s":
            if per_token:
                gaps = records["finish_s"] - records["first_token_s"]
                after_first = np.maximum(records["output_tokens"] - 1, 0)
                out[key] = float(gaps.sum() / max(after_first.sum(), 1))
            else:
                flat = [gap for row in chunk_gaps(records) for gap in row]
                out[key] = _statistic(np.asarray(flat, dtype=np.float64), "mean")
        elif name in METRIC_NAMES:
            out[key] = _statistic(values[name], statistic)
    return out


def with_entry(profile: Profile, entry: Acceptance) -> Profile:
    """``profile`` with ``entry`` in place of its entry for the same drafter and verifier at
    the same temperature (within 0.05, as the lookup matches)."""
    kept = [
        a
        for a in profile.acceptance
        if not (
            a.drafter == entry.drafter
            and a.verifier == entry.verifier
            and abs(a.temperature - entry.temperature) <= 0.05
        )
    ]
    return profile.model_copy(update={"acceptance": [*kept, entry]})


class Evaluator:
    """Simulates runs on the prior with terms set to theta; remembers every evaluation."""

    def __init__(
        self,
        prior: Profile,
        prior_path: str,
        replays: list[Replay],
        terms: list[Term],
        folder: Path,
    ):
        self.prior = prior
        self.prior_path = prior_path
        self.replays = replays
        self.terms = terms
        self.folder = folder
        self.keys = [
            [k for k, v in r.run.metrics.items() if unfitted_reason(k, v, r.spread_known) is None]
            for r in replays
        ]
        weights = [np.array([figure_weight(key) for key in keys]) for keys in self.keys]
        self.weights = [w / np.sqrt(np.sum(w**2)) if w.size else w for w in weights]
        self.scenarios = [r.scenario(prior_path) for r in replays]
        self._cache: dict[tuple[int, bytes], dict[str, float]] = {}
        self.simulations = 0
        self.out_of_range = False

    def metrics(self, theta: np.ndarray, run: int) -> dict[str, float]:
        theta = np.asarray(theta, dtype=np.float64)
        key = (run, theta.tobytes())
        if key not in self._cache:
            self._cache[key] = self._simulate(theta, run)
        return self._cache[key]

    def _simulate(self, theta: np.ndarray, run: int) -> dict[str, float]:
        candidate = apply(self.prior, self.terms, theta)
        speculation = self.replays[run].speculation
        if speculation is not None and speculation.acceptance is not None:
            candidate = with_entry(candidate, speculation.acceptance)
        profile = LoadedProfile(candidate, self.prior_path)
        path = self.folder / f"records-{run:03d}.csv"
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", OutOfRangeWarning)
            result = run_simulation(self.scenarios[run], records_path=path, profile=profile)
        self.out_of_range |= any(issubclass(w.category, OutOfRangeWarning) for w in caught)
        self.simulations += 1
        replay = self.replays[run]
        return run_metrics(
            read_records(path),
            replay.duration(result.summary["duration_s"]),
            self.keys[run],
            replay.run.itl_per_token,
        )

    def weighted_errors(self, theta: np.ndarray, run: int) -> np.ndarray:
        """``log_errors`` times each figure's weight (module docstring)."""
        return self.log_errors(theta, run) * self.weights[run]

    def log_errors(self, theta: np.ndarray, run: int) -> np.ndarray:
        """log(simulated / measured) for each fitted figure of ``run``."""
        simulated = self.metrics(theta, run)
        measured = self.replays[run].run.metrics
        return np.array(
            [math.log(max(simulated[key], FLOOR) / measured[key]) for key in self.keys[run]]
        )
