"""The closed-form estimate reads ``workload.prefix`` and ``engine.block_size``
(``specsim.estimate.prefix``): a prompt's prefill skips its expected cached tokens, and the KV
capacity is counted in blocks with a shared system prompt held once, by the simulator's rules.
Hand-worked on fixed 1,000-token prompts."""

from __future__ import annotations

import numpy as np
import pytest

from specsim.costs import NO_ROWS, PassTotals, StepCosts, formula
from specsim.estimate import estimate_point
from specsim.estimate.passes import Passes
from specsim.estimate.point import build_replica
from specsim.scenario import load_scenario
from specsim.simulation.request import Request
from specsim.simulation.run import cached_profile
from specsim.workload.prefix import DrawnPrefixes, prefix_rng

EXACT = 1e-9  # sums of a few float64 terms: far inside 1e-9 relative
FIXED = ["workload.prompt={dist: fixed, value: 1000}", "engine.kv_capacity_tokens=64000"]
SYSTEM_PROMPT = [
    "workload.prefix.source=system_prompt",
    "workload.prefix.length=512",
    "workload.prefix.hit_rate=0.5",
]


def scenario_and_replica(repo, overrides):
    scenario = load_scenario(repo / "scenarios" / "poisson.yaml", FIXED + overrides)
    profile = cached_profile(scenario.resolve(scenario.profile))
    return scenario, profile, build_replica(scenario, profile)


@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize("drafter", [None, "llama3.2-1b"])
def test_a_cached_prompts_seconds_are_what_the_engine_charges_for_its_uncached_tokens(
    repo, chunked, drafter
):
    """A prompt of p tokens with c cached runs p - c tokens over c cached ones: the totals
    ``Admission.chunks`` gives the engine, (1, p - c, c, (p - c)(c + (p - c + 1) / 2))."""
    scenario = load_scenario(repo / "scenarios" / "poisson.yaml", [])
    engine = scenario.engine.model_copy(update={"chunked_prefill": chunked})
    costs = StepCosts(cached_profile(scenario.resolve(scenario.profile)), drafter)
    costs.terms[formula.PREFILL_TOKEN_S] = 1e-6  # 0 in the profile: a term per computed token
    passes = Passes(costs, engine)
    prompts, cached = np.array([16.0, 300.0, 2000.0]), np.array([0.0, 288.0, 1024.0])
    decode = PassTotals(8, 40.0, 8 * 1500.0, 40.0 * 1500.0)
    got = passes.prompt_s(prompts, decode.tokens if chunked else 0.0, cached)
    for prompt, hit, seconds in zip(prompts.tolist(), cached.tolist(), got.tolist(), strict=True):
        run = prompt - hit
        chunk = PassTotals(1, run, hit, run * (hit + (run + 1.0) / 2.0))
        if chunked:
            want = costs.iteration_s(3, decode, chunk) - costs.iteration_s(3, decode)
        else:
            want = costs.iteration_s(0, NO_ROWS, chunk)
        assert seconds == pytest.approx(want, rel=EXACT)


def test_a_system_prompt_at_half_the_requests_halves_the_saving_of_a_hit(repo):
    # Prompts of 1,000 tokens, a 512-token system prompt (32 blocks of 16) cached for half the
    # requests: the mean prompt alone costs 0.5 s(1000 tokens) + 0.5 s(488 over 512 cached).
    overrides = [*SYSTEM_PROMPT, "engine.chunked_prefill=false", "engine.block_size=16"]
    _, profile, replica = scenario_and_replica(repo, overrides)
    costs = StepCosts(profile, "llama3.2-1b")
    miss = costs.iteration_s(0, NO_ROWS, PassTotals(1, 1000.0, 0.0, 1000.0 * 1001.0 / 2.0))
    hit = costs.iteration_s(0, NO_ROWS, PassTotals(1, 488.0, 512.0, 488.0 * (512.0 + 244.5)))
    assert hit < 0.6 * miss
    assert replica.prompt_s(4, 0.0) == pytest.approx(0.5 * miss + 0.5 * hit, rel=EXACT)
    _, _, plain = scenario_and_replica(repo, ["engine.chunked_prefill=false"])
    assert plain.prompt_s(4, 0.0) == pytest.approx(miss, rel=EXACT)


def test_the_latency_samples_hits_are_the_simulators_draws(repo):
    # A 520-token system prompt: 512 in whole blocks of 16, as the admission caps it.
    length = ["workload.prefix.length=520", "engine.block_size=16"]
    scenario, _, replica = scenario_and_replica(repo, SYSTEM_PROMPT + length)
    drawn = DrawnPrefixes(scenario.workload.prefix, prefix_rng(scenario.seed))
    simulated = [drawn.cached(Request(i, 0.0, 1000, 10)) for i in range(1024)]
    assert set(simulated) == {0, 520}
    assert replica.prefix.sample.tolist() == [512.0 if h else 0.0 for h in simulated]
    assert 400 < np.count_nonzero(replica.prefix.sample) < 624  # 1,024 draws at 0.5: +- 7 sd


def test_the_kv_limit_counts_blocks_and_a_system_prompt_once(repo):
    """64,000 tokens: 4,000 blocks of 16. A draft model at k = 4 holds 5 + 4 slots beyond its
    context c, so cdiv(c + 9, 16) blocks: (c + 9 + 7.5) / 16 on average. A 512-token system
    prompt hit by half the rows: 32 blocks once per replica, 16 fewer per row on average."""
    _, _, tokens = scenario_and_replica(repo, [])
    _, _, blocks = scenario_and_replica(repo, ["engine.block_size=16"])
    _, _, shared = scenario_and_replica(repo, [*SYSTEM_PROMPT, "engine.block_size=16"])
    context = blocks.windows[4].context
    assert context == tokens.windows[4].context == shared.windows[4].context
    assert tokens.batch_limit(4) == pytest.approx(64000.0 / (context + 5.0), rel=EXACT)
    per_row = (context + 9.0 + 7.5) / 16.0
    assert blocks.batch_limit(4) == pytest.approx(4000.0 / per_row, rel=EXACT)
    assert shared.batch_limit(4) == pytest.approx((4000.0 - 32.0) / (per_row - 16.0), rel=EXACT)
    assert blocks.batch_limit(4) < tokens.batch_limit(4) < shared.batch_limit(4)


def test_a_prefix_scenarios_estimate_moves_the_right_way(repo):
    """At 6 req/s, a system prompt at half the requests shortens TTFT and frees the replica."""
    path = str(repo / "scenarios" / "poisson.yaml")
    base = ["workload.rate=6", "engine.block_size=16"]
    plain = estimate_point(path, base)
    system = estimate_point(path, base + SYSTEM_PROMPT)
    assert system.ttft_mean_s < 0.9 * plain.ttft_mean_s
    assert system.utilisation < plain.utilisation
    assert system.e2e_mean_s < plain.e2e_mean_s
