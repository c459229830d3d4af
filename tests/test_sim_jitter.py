"""Iteration-time jitter: the sampler reproduces the profile's distribution, and the simulator
applies it to time only, deterministically, and only when the profile and scenario ask."""

from __future__ import annotations

import csv
import io
import itertools

import numpy as np
import pytest
import yaml
from scipy import stats
from test_engine_common import hand_profile

from specsim.profile.schema import IterationJitter
from specsim.simulation.jitter import Jitter

# Multipliers at probabilities 0, 0.25, 0.5, 0.75, 1: a skewed, piecewise-linear quantile
# function, so its CDF is known exactly.
QUANTILES = [0.8, 0.95, 1.0, 1.1, 2.0]


def cdf(x: np.ndarray) -> np.ndarray:
    return np.interp(x, QUANTILES, np.linspace(0.0, 1.0, len(QUANTILES)))


def draws(n: int, seed: int, sampler_class=Jitter) -> np.ndarray:
    spec = IterationJitter(quantiles=QUANTILES, samples=100)
    sampler = sampler_class(spec, np.random.default_rng(seed))
    return np.asarray([sampler.factor() for _ in range(n)])


def test_the_draws_follow_the_profiles_quantile_function():
    # n = 20,000 draws, seed 7. A KS test at alpha = 0.001 (critical distance 1.95 / sqrt(n) =
    # 0.014) detects any CDF error of about 0.02 or more with power near 1.
    n = 20_000
    result = stats.kstest(draws(n, 7), cdf)
    assert result.pvalue > 1e-3, result
    assert result.statistic < 1.95 / np.sqrt(n)
    # The mean of the piecewise-linear quantile function: the trapezoid over its 4 steps.
    mean = np.mean([(a + b) / 2 for a, b in itertools.pairwise(QUANTILES)])
    assert np.mean(draws(n, 8)) == pytest.approx(mean, abs=0.01)


class NearestQuantile(Jitter):
    """Planted bug: the listed quantiles drawn without interpolating between them."""

    def factor(self, prefill: bool = False) -> float:
        return float(self.kinds[0][self.rng.integers(0, len(self.kinds[0]))])


def test_the_ks_check_fails_on_a_planted_sampler_bug():
    assert stats.kstest(draws(20_000, 7, NearestQuantile), cdf).pvalue < 1e-3


def test_draws_are_deterministic_per_seed():
    assert np.array_equal(draws(5000, 3), draws(5000, 3))
    assert not np.array_equal(draws(5000, 3), draws(5000, 4))


def test_decreasing_quantiles_are_rejected():
    with pytest.raises(ValueError, match="must not decrease"):
        IterationJitter(quantiles=[1.0, 0.9], samples=10)


def run(tmp_path, jitter=None, engine_jitter=True, seed=1, prefill_jitter=None):
    from specsim.scenario import load_scenario
    from specsim.simulation.run import run_simulation

    path = hand_profile(tmp_path / "profile.yaml")
    data = yaml.safe_load(path.read_text())
    for key, quantiles in (("jitter", jitter), ("prefill_jitter", prefill_jitter)):
        if quantiles is not None:
            data[key] = {"quantiles": quantiles, "samples": 100}
    path.write_text(yaml.safe_dump(data))
    scenario = {
        "name": "jitter",
        "seed": seed,
        "profile": "profile.yaml",
        "workload": {
            "kind": "closed_loop",
            "concurrency": 1,
            "requests": 200,
            "prompt": {"dist": "fixed", "value": 16},
            "output": {"dist": "uniform", "low": 4, "high": 12},
        },
        "engine": {"max_batch": 1, "chunked_prefill": False, "jitter": engine_jitter},
        "speculation": {"drafter": "small", "k": 2},
    }
    (tmp_path / "scenario.yaml").write_text(yaml.safe_dump(scenario))
    out = tmp_path / f"records-{seed}-{engine_jitter}-{jitter}-{prefill_jitter}.csv"
    result = run_simulation(load_scenario(tmp_path / "scenario.yaml"), out)
    return result.summary, out.read_bytes()


def test_jitter_moves_times_only_and_stays_deterministic(tmp_path):
    plain, plain_records = run(tmp_path)
    _, off_records = run(tmp_path, jitter=[0.5, 1.5], engine_jitter=False)
    assert off_records == plain_records  # engine.jitter: false is the profile without one
    jittered, records = run(tmp_path, jitter=[0.5, 1.5])
    again, again_records = run(tmp_path, jitter=[0.5, 1.5])
    assert again_records == records and again == jittered
    # Tokens, steps and acceptance come from their own streams: the same with and without.
    for key in ("mean_acceptance_length", "requests"):
        assert jittered[key] == plain[key]
    # Every prefill (the TTFT at batch 1, closed loop) is its median times a draw in
    # [0.5, 1.5]: the median alone before, spread over that range now.
    median = float(np.median(ttfts(plain_records)))
    # (Records hold microseconds: 1e-6 s either way.)
    assert ttfts(plain_records) == pytest.approx([median] * 200, abs=2e-6)
    spread = np.asarray(ttfts(records)) / median
    slack = 2e-6 / median
    assert 0.5 - slack <= spread.min() < 0.55 and 1.45 < spread.max() <= 1.5 + slack
    # Uniform on [0.5, 1.5] has mean 1: the mean TTFT stays within 4 standard errors (200
    # requests, sd 0.29 x median).
    assert jittered["ttft_s"]["mean"] == pytest.approx(median, abs=4 * 0.29 * median / 200**0.5)


def ttfts(records: bytes) -> list[float]:
    rows = list(csv.DictReader(io.StringIO(records.decode())))
    return [float(r["first_token_s"]) - float(r["arrival_s"]) for r in rows]


def test_prefill_iterations_take_the_prefill_spread_and_decodes_the_other(tmp_path):
    plain, plain_records = run(tmp_path)
    median = float(np.median(ttfts(plain_records)))
    # Decodes spread, prefills not: every TTFT (one prefill iteration) is its median, and the
    # decode-only figures move.
    calm_prefill, records = run(tmp_path, jitter=[0.5, 1.5], prefill_jitter=[1.0, 1.0])
    assert ttfts(records) == pytest.approx([median] * 200, abs=2e-6)
    assert calm_prefill["tpot_s"]["p90"] != plain["tpot_s"]["p90"]
    # Prefills spread, decodes not: the TTFTs cover [0.5, 1.5] x median, the TPOTs are the
    # plain run's (no draw reaches a decode iteration).
    calm_decode, records = run(tmp_path, jitter=[1.0, 1.0], prefill_jitter=[0.5, 1.5])
    spread = np.asarray(ttfts(records)) / median
    assert spread.min() < 0.55 and spread.max() > 1.45
    assert calm_decode["tpot_s"] == plain["tpot_s"]


def test_a_prefill_spread_needs_the_decode_spread(tmp_path):
    from specsim.profile.schema import Profile

    data = yaml.safe_load(hand_profile(tmp_path / "profile.yaml").read_text())
    data["prefill_jitter"] = {"quantiles": [1.0, 1.1], "samples": 30}
    with pytest.raises(ValueError, match="prefill_jitter needs jitter"):
        Profile.model_validate(data)
    data["jitter"] = {"quantiles": [0.9, 1.2], "samples": 30}
    assert Profile.model_validate(data).prefill_jitter.quantiles == [1.0, 1.1]
