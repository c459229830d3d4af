"""The goodput-adaptive window policy (``speculation.policy: adaptive``).

- its per-iteration choice is the argmax of the engine's own cost model, evaluated on the batch
  as the engine will run it (ragged windows, prompt chunks in the same pass);
- the tokens per step it expects per row are the running batch's (harmonic) mean, which is what
  the engine's acceptance draws produce, not the per-request mean;
- on a profile where speculation stops paying past some load, it is never materially worse than
  the best static k at any load.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from specsim.costs import PassTotals
from specsim.profile import load_profile
from specsim.scenario import Scenario
from specsim.simulation import policy as policy_module
from specsim.simulation import run_simulation
from specsim.simulation.policy import FixedWindow, GoodputWindow, build_policy
from specsim.simulation.replica import Replica
from specsim.simulation.request import Request
from specsim.simulation.run import pool_setups

REPO = Path(__file__).resolve().parent.parent
H100 = REPO / "profiles" / "llama3.1-8b_llama3.2-1b_h100-roofline.yaml"

# A target whose verification turns compute-bound past 256 tokens in a pass, and prediction
# heads with a per-step cost and no memory or prefill of their own: the drafter costs nothing to
# deploy, so static k = 0 and the adaptive policy run the same engine and differ only in k.
HEADS_PROFILE = {
    "version": 1,
    "name": "policy-test-heads",
    "provenance": {"source": "published", "device": "test", "date": "2026-01-01", "notes": "test"},
    "hardware": {"name": "test-gpu", "memory_bytes": 80.0e9, "price_per_hour_usd": 2.0},
    "target": {
        "kind": "target",
        "kv_bytes_per_token": 131072,
        "weight_bytes": 16.0e9,
        "flops_per_token": 16.0e9,
        "attention_flops_per_context_token": 524288,
        "latency": {
            "fit": {
                "fixed_s": 0.008,
                "per_batched_token_s": 4.0e-5,
                "knee_tokens": 256,
                "per_kv_token_s": 4.0e-8,
                "per_attention_pair_s": 1.0e-9,
            }
        },
    },
    "drafters": {
        "heads": {
            "kind": "heads",
            "kv_bytes_per_token": 0,
            "weight_bytes": 0,
            "flops_per_token": 1.0e8,
            "latency": {
                "fit": {"fixed_s": 0.002, "per_batched_token_s": 1.0e-5, "knee_tokens": 64}
            },
        }
    },
    "overhead": {"per_step_s": 0.0003, "per_sequence_s": 1.0e-5},
    "acceptance": [
        {
            "drafter": "heads",
            "verifier": "rejection",
            "temperature": 1.0,
            "per_position": [0.8, 0.75, 0.7, 0.68, 0.66, 0.65],
            "request_concentration": 1.0,
        }
    ],
}


@pytest.fixture(scope="module")
def heads_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("heads")
    (folder / "profile.yaml").write_text(yaml.safe_dump(HEADS_PROFILE))
    return folder


def heads_scenario(folder: Path, concurrency: int, k: int, policy: str, seed: int = 3):
    data = {
        "seed": seed,
        "profile": "profile.yaml",
        "workload": {
            "kind": "closed_loop",
            "concurrency": concurrency,
            "requests": max(40, 8 * concurrency),
            "prompt": {"dist": "uniform", "low": 100, "high": 600},
            "output": {"dist": "uniform", "low": 50, "high": 400},
        },
        "engine": {"max_batch": 256, "kv_capacity_tokens": 2_000_000},
        "speculation": {"drafter": "heads", "k": k, "policy": policy},
    }
    return Scenario.model_validate(data).with_source(folder / "scenario.yaml")


# ---- the per-iteration choice ---------------------------------------------------------------


class _Sink:
    def add(self, record) -> None:
        pass


def h100_scenario(speculation: dict) -> Scenario:
    """One request on the H100 roofline profile (8B target, 1B draft model)."""
    data = {
        "profile": str(H100),
        "workload": {
            "kind": "poisson",
            "rate": 1.0,
            "requests": 1,
            "prompt": {"dist": "fixed", "value": 100},
            "output": {"dist": "fixed", "value": 100},
        },
        "engine": {"max_batch": 256, "max_batched_tokens": 8192},
        "speculation": speculation,
    }
    return Scenario.model_validate(data).with_source(REPO / "scenarios" / "x.yaml")


def h100_replica(k_max: int = 4) -> Replica:
    """An adaptive replica on the H100 roofline profile (8B target, 1B draft model)."""
    scenario = h100_scenario({"drafter": "llama3.2-1b", "k": k_max, "policy": "adaptive"})
    setup = pool_setups(scenario, load_profile(H100))[0]
    policy = build_policy(setup.speculation, scenario.engine.max_batch)
    return Replica(
        0,
        0,
        scenario.engine,
        setup.costs,
        setup.acceptance,
        policy,
        setup.kv_capacity,
        np.random.default_rng(0),
        _Sink(),
        lambda request, now: None,
    )


def fill(replica: Replica, rows: int, prompts: list[int], seed: int = 0) -> None:
    """``rows`` decoding sequences (a few of them near their end), then waiting prompts."""
    rng = np.random.default_rng(seed)
    for rid in range(rows):
        replica.enqueue(Request(rid, 0.0, int(rng.integers(200, 3000)), 400))
    admission = replica.admission
    while admission.queue:  # admission stops at a token budget's worth of pending prompts
        admission.admit(0.0, replica.decoding, replica.decode_kv)
        replica._finish_prefills([(r, r.prefill_target) for r in admission.prefilling], 0.0)
    assert replica.decoding == rows
    active = np.flatnonzero(replica.remaining > 0)
    near_end = active[: min(4, rows - 1)]
    replica.remaining[near_end] = np.arange(1.0, near_end.size + 1)  # ragged windows
    for i, prompt in enumerate(prompts):
        replica.enqueue(Request(rows + i, 0.0, prompt, 100))
    admission.admit(0.0, replica.decoding, replica.decode_kv)


def engine_seconds(replica: Replica, k: int, decode: bool = True, prefill: bool = True) -> float:
    """What the engine charges for its next iteration at window k (its own planning code)."""
    admission = replica.admission
    saved = (replica.policy, replica._batch_policy, replica.decoding, admission.prefilling)
    kv = replica.decode_kv
    replica.policy, replica._batch_policy = FixedWindow(k), False
    if not decode:
        replica.decoding, replica.decode_kv = 0, 0.0
    if not prefill:
        admission.prefilling = []
    try:
        return replica._plan_mixed().seconds
    finally:
        replica.policy, replica._batch_policy, replica.decoding, admission.prefilling = saved
        replica.decode_kv = kv


def expected_tokens(replica: Replica, k: int) -> float:
    left = replica.remaining[replica.remaining > 0]
    drafts = np.minimum(left - 1, k).astype(int)
    return sum(replica.acceptance.row_expected_emitted(int(d)) for d in drafts)


def reference_scores(replica: Replica) -> list[float]:
    """The documented rule, from the engine's charges: mu x tokens - seconds the rows add."""
    k_max = replica.k_max
    tokens = [expected_tokens(replica, k) for k in range(k_max + 1)]
    alone = [engine_seconds(replica, k, prefill=False) for k in range(k_max + 1)]
    mu = min(a / t for a, t in zip(alone, tokens, strict=True))
    if not replica.admission.prefilling:
        return [mu * t - a for t, a in zip(tokens, alone, strict=True)]
    base = engine_seconds(replica, 0, decode=False)
    return [mu * tokens[k] - (engine_seconds(replica, k) - base) for k in range(k_max + 1)]


def policy_scores(replica: Replica) -> list[float]:
    admission = replica.admission
    prefill = admission.chunk_totals if admission.prefilling else None
    return replica.policy.scores(
        replica.decoding,
        replica.decode_kv,
        replica.remaining,
        replica.context,
        prefill,
        replica.token_budget,
    )


def argmax(scores: list[float]) -> int:
    return max(range(len(scores)), key=lambda k: (scores[k], -k))


@pytest.mark.parametrize(
    ("rows", "prompts"),
    [(1, []), (24, []), (160, []), (24, [1800]), (96, [700, 2500])],
)
def test_choice_is_the_argmax_of_the_engines_own_cost_model(rows, prompts):
    replica = h100_replica()
    fill(replica, rows, prompts)
    expected = reference_scores(replica)
    # The policy's estimate of every window equals what the engine's planning code charges.
    assert policy_scores(replica) == pytest.approx(expected, rel=1e-9, abs=1e-12)
    assert replica._choose_window(replica.decoding, replica.decode_kv) == argmax(expected)


def test_prompt_chunks_in_the_pass_change_the_choice():
    """With a 1800-token chunk riding along, 24 rows' verification tokens land past the knee and
    the pass's fixed cost is the chunk's anyway: the policy speculates less than it would on the
    same rows decoding alone (a policy that ignores the chunk fails this)."""
    replica = h100_replica()
    fill(replica, 24, [1800])
    with_chunk = replica._choose_window(replica.decoding, replica.decode_kv)
    admission = replica.admission
    prefilling, admission.prefilling = admission.prefilling, []
    alone = replica._choose_window(replica.decoding, replica.decode_kv)
    admission.prefilling = prefilling
    assert with_chunk < alone


# ---- expected tokens per row ----------------------------------------------------------------


def consistent(measured: float, predicted: float, se: float) -> bool:
    return abs(measured - predicted) <= 4.0 * se


REQUESTS = 1200


def test_running_batch_accepts_at_the_harmonic_mean_not_the_request_mean(heads_dir):
    """Mean acceptance length = tokens / steps over every row-step, which weights each request by
    its steps: a request of level l takes L / E_l steps, so the mean is the harmonic mean of E_l.

    Sample: 1200 requests of 1000 output tokens (fixed k = 3, so end-of-request windows hardly
    matter), seed 5. Its error is dominated by which levels the requests drew: se = HM x
    CV(1 / E_l) / sqrt(1200), about 1.5% of HM here; the per-request mean lies 0.49 tokens
    (about 12 se) above HM, so a 4 se check tells the two apart (the second assertion is the
    planted bug: the pre-fix policy expected the per-request mean)."""
    data = {
        "seed": 5,
        "profile": "profile.yaml",
        "workload": {
            "kind": "closed_loop",
            "concurrency": 64,
            "requests": REQUESTS,
            "prompt": {"dist": "fixed", "value": 200},
            "output": {"dist": "fixed", "value": 1000},
        },
        "engine": {"max_batch": 64, "kv_capacity_tokens": 2_000_000},
        "speculation": {"drafter": "heads", "k": 3},
    }
    scenario = Scenario.model_validate(data).with_source(heads_dir / "scenario.yaml")
    measured = run_simulation(scenario).summary["mean_acceptance_length"]
    setup = pool_setups(scenario, load_profile(heads_dir / "profile.yaml"))[0]
    acceptance = setup.acceptance
    per_level = 1.0 + acceptance.survival[:, :3].sum(axis=1)
    inverse = 1.0 / per_level
    se = acceptance.row_expected_emitted(3) * inverse.std() / inverse.mean() / np.sqrt(REQUESTS)
    assert consistent(measured, acceptance.row_expected_emitted(3), se)
    assert not consistent(measured, acceptance.expected_emitted(3), se)


def test_row_mean_equals_request_mean_without_heterogeneity(heads_dir):
    scenario = heads_scenario(heads_dir, 1, 4, "fixed")
    scenario.speculation.heterogeneity = False
    acceptance = pool_setups(scenario, load_profile(heads_dir / "profile.yaml"))[0].acceptance
    for k in range(5):
        assert acceptance.row_expected_emitted(k) == pytest.approx(acceptance.expected_emitted(k))
    scenario.speculation.heterogeneity = True
    varied = pool_setups(scenario, load_profile(heads_dir / "profile.yaml"))[0].acceptance
    assert varied.row_expected_emitted(4) < varied.expected_emitted(4)


# ---- against static windows across load -----------------------------------------------------

LOADS = (1, 16, 64, 200)
K_MAX = 4
TOLERANCE = 0.03


class _ForgetsVerificationCost(GoodputWindow):
    """Planted bug: a step-time estimate that charges one position per row, whatever k."""

    def scores(self, rows, kv_tokens, remaining, context, prefill, token_budget):
        tokens = [rows * self._row_tokens[k] for k in range(self.k_max + 1)]
        return [
            t / self.costs.iteration_s(k, PassTotals(rows, rows, kv_tokens, kv_tokens))
            for k, t in enumerate(tokens)
        ]


def throughput(folder: Path, concurrency: int, k: int, policy: str) -> float:
    scenario = heads_scenario(folder, concurrency, k, policy)
    return run_simulation(scenario).summary["throughput_tokens_per_s"]


def worst_shortfall(folder: Path) -> tuple[float, dict]:
    """Largest relative shortfall of adaptive against the best static k over the loads."""
    worst = 0.0
    table = {}
    for load in LOADS:
        static = {k: throughput(folder, load, k, "fixed") for k in range(K_MAX + 1)}
        adaptive = throughput(folder, load, K_MAX, "adaptive")
        best_k = max(static, key=static.get)
        table[load] = (best_k, adaptive / static[best_k])
        worst = max(worst, 1.0 - adaptive / static[best_k])
    return worst, table


@pytest.mark.slow
def test_adaptive_is_never_materially_worse_than_the_best_static_k(heads_dir, monkeypatch):
    """Closed loop (throughput = tokens/s, no open-loop backlog artefact) at concurrency
    1, 16, 64 and 200, k in 0..4; one seed per point (seed 3, 8 x concurrency requests).

    Tolerance 3%: over 8 seeds the ratio adaptive / best static had a seed-to-seed standard
    deviation of at most 0.7% at any load (means 1.001, 1.000, 1.065, 1.018), so 3% is over 4
    standard deviations. The planted bug (an estimate that leaves the verification tokens out,
    so it always drafts k_max) falls about 11% short at concurrency 200 and fails."""
    worst, table = worst_shortfall(heads_dir)
    # The profile does what the test needs: speculation pays at low load and not at high load.
    assert table[1][0] == K_MAX and table[200][0] == 0, table
    assert worst <= TOLERANCE, table

    monkeypatch.setitem(policy_module.WINDOW_POLICY_CLASSES, "adaptive", _ForgetsVerificationCost)
    planted, planted_table = worst_shortfall(heads_dir)
    assert planted > TOLERANCE, planted_table


# ---- a deployed draft model at k = 0 --------------------------------------------------------


def test_a_deployed_draft_model_keeps_its_cache_in_step_at_k0():
    """An adaptive or by-batch engine that turns speculation off for a step still runs the draft
    model once over the step's token (its KV cache must follow the target's); heads and n-gram
    lookup have nothing to keep in step."""
    replica = h100_replica()
    costs = replica.costs
    one_pass = costs.draft_latency.seconds_from_totals(8, 8, 8000.0, 8008.0)
    assert costs.draft_s(8, 0, 8000.0) == pytest.approx(one_pass)
    assert 0 < costs.draft_s(8, 0, 8000.0) < costs.draft_s(8, 1, 8000.0) + 1e-12
    assert costs.draft_flops(8, 0, 8000.0) > 0
    ngram = h100_scenario({"drafter": "ngram", "k": 4, "policy": "adaptive"})
    setup = pool_setups(ngram, load_profile(H100))[0]
    assert setup.costs.draft_s(8, 0, 8000.0) == 0.0
    assert setup.costs.draft_flops(8, 0, 8000.0) == 0.0
