"""Workloads: trace readers, arrival processes and length distributions."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from specsim.errors import SpecsimError
from specsim.scenario import Workload
from specsim.workload import (
    ClosedLoopSource,
    LengthPairs,
    LengthSampler,
    OpenLoopSource,
    TraceSource,
    read_trace,
)
from specsim.workload.sources import interarrival_gaps
from specsim.workload_settings import LengthDist

DATA = Path(__file__).parent / "data"


def resolve(name: str) -> Path:
    return DATA / name


# ---- trace readers ----------------------------------------------------------------------------
def test_azure_trace_reads_every_row(traces_dir):
    trace = read_trace(traces_dir / "AzureLLMInferenceTrace_conv.csv")
    assert trace.format == "azure"
    assert len(trace) == 19366  # SOURCE.md: 19,366 requests
    assert trace.arrival_s[0] == 0.0 and np.all(np.diff(trace.arrival_s) >= 0)
    assert trace.arrival_s[-1] == pytest.approx(3501.7, abs=0.1)  # 18:15:46.68 -> 19:14:08.40
    assert trace.prompt_tokens[:2].tolist() == [374, 396]
    assert trace.output_tokens[:2].tolist() == [44, 109]
    assert trace.arrival_s[1] == pytest.approx(50.9951690 - 46.6805900, abs=1e-6)


def test_vidur_and_burstgpt_layouts():
    vidur = read_trace(DATA / "vidur_small.csv")
    assert vidur.format == "vidur"
    assert vidur.arrival_s.tolist() == [0.0, 0.5, 1.5]
    assert vidur.prompt_tokens.tolist() == [100, 200, 50]
    assert vidur.output_tokens.tolist() == [20, 10, 5]
    burst = read_trace(DATA / "burstgpt_small.csv")
    assert burst.format == "burstgpt"
    assert burst.arrival_s.tolist() == [0.0, 5.0, 7.0]
    # A failed request logged with 0 response tokens is read as 1 token.
    assert burst.output_tokens.tolist() == [18, 1, 38]


def test_malformed_row_names_file_and_line():
    with pytest.raises(SpecsimError) as info:
        read_trace(DATA / "azure_bad_row.csv")
    text = info.value.one_line()
    assert "azure_bad_row.csv" in text and "line 4" in text and "\n" not in text


def test_trace_errors(tmp_path):
    unknown = tmp_path / "unknown.csv"
    unknown.write_text("a,b,c\n1,2,3\n")
    with pytest.raises(SpecsimError, match="unrecognised trace header"):
        read_trace(unknown)
    short = tmp_path / "short.csv"
    short.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,10,5\n1,10\n")
    with pytest.raises(SpecsimError, match="line 3: expected 3 fields"):
        read_trace(short)
    negative = tmp_path / "negative.csv"
    negative.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,-10,5\n")
    with pytest.raises(SpecsimError, match="line 2"):
        read_trace(negative)
    with pytest.raises(SpecsimError, match="not found"):
        read_trace(tmp_path / "missing.csv")


def test_trace_source_scales_time_and_truncates():
    trace = read_trace(DATA / "vidur_small.csv")
    half = Workload(kind="trace", trace="x", time_scale=0.5)
    times = np.concatenate([c[0] for c in TraceSource(half, trace).chunks()])
    assert times.tolist() == [0.0, 0.25, 0.75]
    first_two = Workload(kind="trace", trace="x", requests=2)
    assert sum(len(c[0]) for c in TraceSource(first_two, trace).chunks()) == 2
    within = Workload(kind="trace", trace="x", duration_s=1.0)
    assert sum(len(c[0]) for c in TraceSource(within, trace).chunks()) == 2


# ---- arrival processes --------------------------------------------------------------------------
def rate_and_cv_agree(gaps: np.ndarray, rate: float, cv: float) -> bool:
    """Mean gap within 4 standard errors of 1/rate, and CV within 4 standard errors of cv.

    Standard errors by the delta method for gamma-distributed gaps (excess kurtosis 6 cv^2):
    relative SE of the CV ~ sqrt((6 cv^2 + 2) / (4 n) + cv^2 / n). With n = 40,000 the check
    resolves a 2 % error in the rate (cv 1) and a 10 % error in the CV at cv = 3.
    """
    n = gaps.shape[0]
    mean_ok = abs(gaps.mean() * rate - 1) <= 4 * cv / math.sqrt(n) + 1e-9
    observed_cv = gaps.std() / gaps.mean()
    rel_se = math.sqrt((6 * cv**2 + 2) / (4 * n) + cv**2 / n)
    return mean_ok and abs(observed_cv - cv) <= 4 * rel_se * cv + 1e-9


@pytest.mark.parametrize(("kind", "cv"), [("poisson", 1.0), ("bursty", 3.0), ("fixed_rate", 0.0)])
def test_interarrival_gaps_have_the_stated_rate_and_variability(kind, cv):
    workload = Workload(kind=kind, rate=5.0, cv=cv or 1.0, requests=10, prompt=FIXED, output=FIXED)
    gaps = interarrival_gaps(workload, np.random.default_rng(7), 40_000)
    assert rate_and_cv_agree(gaps, 5.0, cv)


def test_the_arrival_check_catches_a_planted_bug():
    """Gamma gaps with shape cv instead of 1/cv^2 (a plausible slip) have the right mean but
    the wrong CV; the same check rejects them."""
    rng = np.random.default_rng(7)
    rate, cv = 5.0, 3.0
    wrong_shape = cv
    gaps = rng.gamma(wrong_shape, (1 / rate) / wrong_shape, size=40_000)
    assert not rate_and_cv_agree(gaps, rate, cv)
    slow = rng.exponential(1 / (rate * 0.95), size=40_000)
    assert not rate_and_cv_agree(slow, rate, 1.0)


FIXED = LengthDist(dist="fixed", value=10)


def open_source(**workload) -> OpenLoopSource:
    spec = Workload(kind="poisson", prompt=FIXED, output=FIXED, **workload)
    lengths = LengthPairs(
        LengthSampler(FIXED, "prompt", resolve), LengthSampler(FIXED, "output", resolve)
    )
    return OpenLoopSource(spec, lengths, np.random.default_rng(1), np.random.default_rng(2))


def test_open_loop_stops_by_count_or_duration():
    by_count = np.concatenate([c[0] for c in open_source(rate=10.0, requests=9000).chunks()])
    assert by_count.shape[0] == 9000 and np.all(np.diff(by_count) >= 0)
    by_time = np.concatenate([c[0] for c in open_source(rate=10.0, duration_s=50.0).chunks()])
    assert by_time.max() < 50.0 and abs(by_time.shape[0] - 500) < 4 * math.sqrt(500)
    both = np.concatenate(
        [c[0] for c in open_source(rate=10.0, duration_s=50.0, requests=100).chunks()]
    )
    assert both.shape[0] == 100


def test_closed_loop_source_hands_out_lengths_and_think_times():
    spec = Workload(
        kind="closed_loop",
        concurrency=4,
        requests=5,
        think_time_s=2.0,
        prompt=FIXED,
        output=LengthDist(dist="uniform", low=5, high=9),
    )
    lengths = LengthPairs(
        LengthSampler(spec.prompt, "prompt", resolve), LengthSampler(spec.output, "output", resolve)
    )
    source = ClosedLoopSource(spec, lengths, np.random.default_rng(1), np.random.default_rng(2))
    drawn = [source.next_lengths() for _ in range(5)]
    assert all(p == 10 and 5 <= o <= 9 for p, o in drawn)
    assert not source.may_issue(0.0)  # five issued: the limit

    # 4,000 exponential think times: the mean is within 4 standard errors (6 %) of 2 s; a
    # rate/mean mix-up (mean 0.5 s) would be caught.
    def mean_is_two(samples: np.ndarray) -> bool:
        return abs(samples.mean() - 2.0) < 4 * 2.0 / math.sqrt(samples.shape[0])

    assert mean_is_two(np.array([source.think_time() for _ in range(4000)]))
    assert not mean_is_two(np.random.default_rng(2).exponential(1 / 2.0, 4000))


# ---- lengths ------------------------------------------------------------------------------------
def test_length_distributions():
    rng = np.random.default_rng(3)
    n = 20_000
    fixed = LengthSampler(FIXED, "prompt", resolve).draw(rng, n)
    assert np.all(fixed == 10)
    uniform = LengthSampler(LengthDist(dist="uniform", low=3, high=7), "output", resolve)
    values = uniform.draw(rng, n)
    assert values.min() == 3 and values.max() == 7
    assert np.bincount(values)[3:].min() > n / 5 * 0.9
    lognormal = LengthSampler(
        LengthDist(dist="lognormal", median=200, sigma=0.5, low=10, high=1000), "prompt", resolve
    )
    values = lognormal.draw(rng, n)
    assert values.min() >= 10 and values.max() <= 1000
    # Median within 4 standard errors (sd of the median ~ 1.25 sigma * median / sqrt(n), 1.8 %
    # here); reading `median` as the mean (a median of 200 e^-0.125 = 176) would be caught.
    tolerance = 4 * 1.25 * 0.5 * 200 / math.sqrt(n)
    assert abs(np.median(values) - 200) < tolerance
    assert abs(np.median(values) - 200 * math.exp(-0.125)) > tolerance


def test_empirical_lengths_from_one_trace_are_drawn_jointly(traces_dir):
    trace_path = traces_dir / "AzureLLMInferenceTrace_conv.csv"
    spec = LengthDist(dist="empirical", trace=str(trace_path))
    pairs = LengthPairs(LengthSampler(spec, "prompt", Path), LengthSampler(spec, "output", Path))
    assert pairs.joint
    prompt, output = pairs.draw(np.random.default_rng(0), 5000)
    trace = read_trace(trace_path)
    rows = set(zip(trace.prompt_tokens.tolist(), trace.output_tokens.tolist(), strict=True))
    assert all(pair in rows for pair in zip(prompt.tolist(), output.tolist(), strict=True))
    # Means match the trace's (1155 prompt, 211 output tokens) within sampling error.
    assert abs(prompt.mean() - trace.prompt_tokens.mean()) < 4 * trace.prompt_tokens.std() / 70
