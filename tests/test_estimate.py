"""The closed-form estimate under load (``specsim.estimate``): its parts against exact answers,
and the whole against the simulator where the screen relies on it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from specsim.analytic import expected_tokens_per_step
from specsim.estimate import estimate_point, load_point
from specsim.estimate.acceptance import AcceptanceChains
from specsim.estimate.latency import erlang_wait
from specsim.estimate.traffic import burstiness, traffic
from specsim.scenario import load_scenario
from specsim.simulation.acceptance import RateAcceptance

# Sums of at most a few hundred float64 terms of magnitude <= 1000: far inside 1e-9 relative.
EXACT = 1e-9


@pytest.mark.parametrize("alpha,k", [(0.0, 3), (0.6, 1), (0.7, 4), (0.95, 8)])
def test_a_homogeneous_chain_emits_the_closed_form_tokens_per_step(alpha, k):
    chains = AcceptanceChains(np.full(k, alpha), 1.0, None)
    assert chains.tokens_per_step == pytest.approx(expected_tokens_per_step(alpha, k), rel=EXACT)


def test_heterogeneous_chains_are_the_simulators_own():
    rates = np.array([0.8, 0.7, 0.65, 0.6])
    chains = AcceptanceChains(rates, 0.9, 20.0)
    model = RateAcceptance(rates, 0.9, 20.0)
    assert chains.levels == model.levels > 1
    assert chains.tokens_per_step == pytest.approx(model.row_expected_emitted(4), rel=EXACT)


@pytest.mark.parametrize("k", [0, 1, 3, 7])
def test_with_every_draft_accepted_a_request_needs_its_tokens_over_k_plus_one_steps(k):
    """A row drafts min(k, tokens still needed - 1), so r tokens take ceil(r / (k + 1)) steps."""
    chains = AcceptanceChains(np.ones(k), 1.0, None)
    remaining = np.array([1, 2, 5, 64, 255, 256, 1000])
    steps, _ = chains.steps(remaining)
    expected = np.ceil(remaining / (k + 1))
    if k:  # past the exact table, the free-running rate: r / (k + 1) beyond 256 tokens
        beyond = remaining > 256
        expected[beyond] = np.ceil(256 / (k + 1)) + (remaining[beyond] - 256) / (k + 1)
    np.testing.assert_allclose(steps[:, 0], expected, rtol=EXACT)


def test_steps_and_drafts_match_a_monte_carlo_walk_of_the_same_chain():
    """Seed 7, 20,000 requests of 40 tokens at alpha 0.7, k 4. The mean steps' standard error is
    about 0.01 steps and the mean drafted positions' about 0.04, so tolerances of 0.05 and 0.2
    (5 standard errors) pass a correct table and fail one that drafts past a request's end
    (about 3.6 more positions per request)."""
    alpha, k, tokens, n = 0.7, 4, 40, 20_000
    rng = np.random.default_rng(7)
    counts = np.zeros(n)
    drafted = np.zeros(n)
    left = np.full(n, tokens)
    while (left > 0).any():
        live = left > 0
        drafts = np.minimum(k, left - 1)
        accepted = np.zeros(n, dtype=np.int64)
        alive = live.copy()
        for i in range(k):
            alive &= (i < drafts) & (rng.random(n) < alpha)
            accepted += alive
        left = np.where(live, left - accepted - 1, left)
        counts += live
        drafted += np.where(live, drafts, 0)
    steps, positions = AcceptanceChains(np.full(k, alpha), 1.0, None).steps(np.array([tokens]))
    assert steps[0, 0] == pytest.approx(counts.mean(), abs=0.05)
    assert positions[0, 0] == pytest.approx(drafted.mean(), abs=0.2)


def test_erlang_c_on_two_slots_at_one_erlang():
    """c = 2 slots, offered load a = 1: P(wait) = 1/3 and the mean wait is P / (c mu - lambda)
    = 1/3 of a hold (textbook values)."""
    waiting, wait_s = erlang_wait(rate=1.0, rows=1.0, limit=2)
    assert waiting == pytest.approx(1 / 3, rel=EXACT)
    assert wait_s == pytest.approx(1 / 3, rel=EXACT)
    assert erlang_wait(1.0, 2.0, 2) == (1.0, math.inf)  # no room: the queue grows
    assert erlang_wait(1.0, 2.0, math.inf) == (0.0, 0.0)  # no limit: no wait


def test_burstiness_is_one_for_even_arrivals_and_large_for_a_burst():
    times = np.arange(0.0, 100.0, 0.5)
    assert burstiness(times, np.full(times.shape, 100.0)) == pytest.approx(1.0, rel=0.01)
    prompts = np.full(times.shape, 100.0)
    prompts[:20] = 5000.0  # the first 10 s carry most of the prompt tokens
    assert burstiness(times, prompts) > 5.0


def test_the_scenario_loader_is_the_projects(repo):
    path = str(repo / "scenarios" / "poisson.yaml")
    overrides = ["speculation.k=2", "workload.rate=3"]
    assert load_point(path, overrides) == load_scenario(path, overrides)


def test_traffic_is_the_simulators_requests(repo):
    scenario = load_scenario(repo / "scenarios" / "poisson.yaml", ["workload.rate=2"])
    offered = traffic(scenario)
    assert offered.rate == 2.0
    assert 500 < offered.requests < 700  # 300 s of arrivals at 2 req/s
    assert offered.prompt.min() >= 16 and offered.prompt.max() <= 8192  # the scenario's bounds
    assert offered.last_arrival_s <= 300.0


def test_littles_law_holds_at_the_operating_point(repo):
    path = str(repo / "scenarios" / "poisson.yaml")
    est = estimate_point(path, ["workload.rate=6", "speculation.k=3"])
    assert not est.saturated and 0.0 < est.utilisation < 1.0
    # batch = rate x time each request spends decoding (E2E less its time to first token)
    decoding = est.e2e_mean_s - est.ttft_mean_s
    assert est.batch_size == pytest.approx(6.0 * decoding, rel=0.05)


def test_overload_is_saturated_and_misses_the_slo(repo):
    est = estimate_point(str(repo / "scenarios" / "poisson.yaml"), ["workload.rate=40"])
    assert est.saturated and est.utilisation > 1.0
    assert est.slo_attainment < 0.1
    assert est.goodput_requests_per_s < 0.1 * 40


def test_at_low_load_the_estimate_ranks_k_as_the_simulation_does(repo):
    """The screen's premise on one shipped scenario (2 req/s, 300 s): k = 0, 1, 3 and 8 in the
    same order by estimated and by simulated mean E2E, each within 10 % of its simulation
    (docs/notes/2026-12-01-screen-margin.md measures every shipped scenario)."""
    from specsim.simulation import run_simulation

    path = str(repo / "scenarios" / "poisson.yaml")
    estimated, simulated = {}, {}
    for k in (0, 1, 3, 8):
        overrides = ["workload.rate=2", f"speculation.k={k}"]
        estimated[k] = estimate_point(path, overrides).e2e_mean_s
        simulated[k] = run_simulation(load_scenario(path, overrides)).summary["e2e_s"]["mean"]
        assert estimated[k] == pytest.approx(simulated[k], rel=0.1)
    assert sorted(estimated, key=estimated.get) == sorted(simulated, key=simulated.get)
    assert estimated[3] < 0.9 * estimated[0]  # speculation pays at low load, by the estimate too


@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize("drafter", [None, "llama3.2-1b", "ngram"])
def test_a_prompts_seconds_are_what_the_engine_charges_for_it(repo, chunked, drafter):
    """One chunk's price on arrays against ``StepCosts.iteration_s`` itself: alone (a
    prefill-only iteration) or riding beside a decode batch of 8 rows verifying 40 positions
    (the iteration with the chunk less the iteration without it)."""
    from specsim.costs import NO_ROWS, PassTotals, StepCosts
    from specsim.estimate.passes import Passes
    from specsim.simulation.run import cached_profile

    scenario = load_scenario(repo / "scenarios" / "poisson.yaml", [])
    engine = scenario.engine.model_copy(update={"chunked_prefill": chunked})
    costs = StepCosts(cached_profile(scenario.resolve(scenario.profile)), drafter)
    passes = Passes(costs, engine)
    prompts = np.array([16.0, 300.0, 2000.0])
    decode = PassTotals(8, 40.0, 8 * 1500.0, 40.0 * 1500.0)
    got = passes.prompt_s(prompts, decode.tokens if chunked else 0.0)
    for prompt, seconds in zip(prompts.tolist(), got.tolist(), strict=True):
        chunk = PassTotals(1, prompt, 0.0, prompt * (prompt + 1.0) / 2.0)
        if chunked:
            want = costs.iteration_s(3, decode, chunk) - costs.iteration_s(3, decode)
        else:
            want = costs.iteration_s(0, NO_ROWS, chunk)
        assert seconds == pytest.approx(want, rel=1e-9)
