"""The compiled step (``compiled_step_kernel``, ``policy.window_terms``): its cost terms and window
choice against ``StepCosts`` and the policy for every drafter class on a profile whose every cost
term is non-zero, and where the compiled serving loop runs a lone replica and where it does not.

The identity of the whole fast path with the reference is in ``test_sim_identity.py`` (every
shipped scenario and window policy) and ``test_sim_compiled_serving.py`` (every cost term).
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
from pathlib import Path

import numpy as np
import pytest
import yaml
from test_sim_identity import make, no_loops

from specsim.costs import PassTotals, StepCosts
from specsim.profile import load_profile
from specsim.simulation import compiled_serving, run_simulation
from specsim.simulation.acceptance import RateAcceptance
from specsim.simulation.compiled import kernel_module
from specsim.simulation.policy import GoodputWindow, window_terms

DATA = Path(__file__).parent / "data"

# Every kind and variant of drafter cost, with every term of its fit non-zero.
FIT = {
    "fixed_s": 0.0021,
    "per_sequence_s": 3.1e-5,
    "per_batched_token_s": 2.3e-6,
    "knee_tokens": 40,
    "per_kv_token_s": 7.0e-9,
    "per_attention_pair_s": 1.3e-10,
}
DRAFTERS = {
    "model": {"kind": "draft_model", "flops_per_token": 2.0e9, "latency": {"fit": FIT},
              "attention_flops_per_context_token": 65536.0,
              "overhead": {"per_draft_step_s": 1.0e-4, "per_draft_token_s": 3.0e-6,
                           "per_speculative_step_s": 2.0e-4, "per_speculative_sequence_s": 1e-6,
                           "per_prefill_s": 3.0e-4, "per_prefill_token_s": 1.0e-7}},
    "lookup": {"kind": "ngram", "draft_step_s": 3.0e-4},
    "lookup fit": {"kind": "ngram", "latency": {"fit": FIT}},
    "medusa": {"kind": "heads", "draft_step_s": 0.002, "flops_per_token": 1.0e8},
    "medusa fit": {"kind": "heads", "latency": {"fit": FIT}, "flops_per_token": 1.0e8},
    "eagle": {"kind": "heads", "passes": "autoregressive", "draft_step_s": 0.001,
              "flops_per_token": 3.0e8, "attention_flops_per_context_token": 4096.0},
    "eagle fit": {"kind": "heads", "passes": "autoregressive", "latency": {"fit": FIT},
                  "flops_per_token": 3.0e8, "attention_flops_per_context_token": 4096.0},
    "dflash": {"kind": "block", "method": "dflash", "max_k": 15, "latency": {"fit": FIT},
               "flops_per_token": 1.0e9, "attention_flops_per_context_token": 8192.0},
}  # fmt: skip
# Each drafter's passes (``DraftPasses``): per draft, block, own cache, model, MLP heads.
PASSES = {
    None: None,
    "model": (True, False, True, True, False),
    "lookup": (False, False, False, False, False),
    "medusa": (False, False, False, True, True),
    "eagle": (True, False, False, True, False),
    "dflash": (False, True, True, True, False),
}


@pytest.fixture(scope="module")
def every_term(tmp_path_factory) -> Path:
    """The test profile with every target, overhead and drafter term non-zero."""
    profile = yaml.safe_load((DATA / "sim_profile.yaml").read_text())
    profile["target"]["latency"]["fit"] = {**FIT, "fixed_s": 0.011, "knee_tokens": 64}
    profile["overhead"] = {
        "per_step_s": 3.0e-4,
        "per_sequence_s": 2.0e-6,
        "per_draft_step_s": 5.0e-5,
        "per_draft_token_s": 1.5e-6,
        "per_prefill_s": 4.0e-4,
        "per_prefill_token_s": 2.0e-7,
    }
    profile["drafters"].update(copy.deepcopy(DRAFTERS))
    rates = [0.8, 0.7, 0.6, 0.5, 0.4]
    profile["acceptance"] += [
        {"drafter": name, "verifier": "rejection", "temperature": 1.0, "per_position": rates}
        for name in DRAFTERS
    ]
    folder = tmp_path_factory.mktemp("every-term")
    (folder / "sim_profile.yaml").write_text(yaml.safe_dump(profile))
    (folder / "sim_sequences.txt").write_text((DATA / "sim_sequences.txt").read_text())
    return folder


@pytest.mark.parametrize("drafter", [None, *DRAFTERS])
def test_cost_parts_match_step_costs_bit_for_bit(drafter, every_term):
    """Seconds, drafter FLOPs and FLOPs per wasted position of decode-only iterations: 6 k x
    5 batch sizes x 4 draws of the totals (half of them past the knee), compared with ``==``."""
    costs = StepCosts(load_profile(every_term / "sim_profile.yaml"), drafter)
    passes = costs.drafter.passes
    shape = None if passes is None else dataclasses.astuple(passes)
    assert shape == PASSES[drafter.split()[0] if drafter else None]
    vector = np.array(costs.terms)
    kernel = kernel_module("compiled_step_kernel")
    rng = np.random.default_rng(11)
    out = np.empty(3)
    for k, rows, draw in itertools.product(range(6), (1, 2, 7, 64, 255), range(4)):
        tokens = float(rows * (k + 1) - rng.integers(0, rows * k + 1))
        if draw % 2:
            tokens += 200.0  # past the knee
        kv = float(rng.integers(rows, rows * 4000))
        pairs = float(rng.integers(1, 10**9))
        kernel.cost_parts(vector, k, rows, tokens, kv, pairs, out)
        expected = (
            costs.decode_iteration_s(k, rows, tokens, kv, pairs),
            costs.draft_flops(rows, k, kv),
            costs.wasted_flops_per_position(kv / rows),
        )
        assert out.tolist() == list(expected), (k, rows, tokens, kv, pairs)


@pytest.mark.parametrize("drafter", [None, *DRAFTERS])
def test_prompt_chunk_iterations_cost_what_iteration_s_says(drafter, every_term):
    """Seconds of an iteration with prompt chunks (and 0 to 255 decoding rows), as the kernel
    prices the first iteration of a call: 6 k x 4 batch sizes x 3 draws, compared with ``==``."""
    costs = StepCosts(load_profile(every_term / "sim_profile.yaml"), drafter)
    vector = np.array(costs.terms)
    kernel = kernel_module("compiled_step_kernel")
    rng = np.random.default_rng(12)
    for k, rows, _ in itertools.product(range(6), (0, 1, 9, 255), range(3)):
        tokens = float(rows * (k + 1) - rng.integers(0, rows * k + 1))
        kv = float(rng.integers(rows, rows * 4000 + 1))
        pairs = float(rng.integers(0, 10**9)) if rows else 0.0
        p_rows = int(rng.integers(1, 4))
        p_tokens = float(rng.integers(p_rows, 8000))
        p_kv, p_pairs = float(rng.integers(0, 3000)), float(rng.integers(1, 10**7))
        decode = PassTotals(rows, tokens if rows else 0.0, kv if rows else 0.0, pairs)
        expected = costs.iteration_s(k, decode, PassTotals(p_rows, p_tokens, p_kv, p_pairs))
        got = kernel.mixed_seconds(
            vector, k, rows, decode.tokens, decode.kv, pairs, p_rows, p_tokens, p_kv, p_pairs
        )
        assert got == expected, (k, rows)


@pytest.mark.parametrize("drafter", ["model", "lookup", "eagle fit"])
def test_the_goodput_choice_matches_the_policy(drafter, every_term):
    """``GoodputWindow.choose_batch`` (decode-only) against the kernel's choice on 300 random
    batches of up to 40 slots, a third of the rows within k_max of their end."""
    profile = load_profile(every_term / "sim_profile.yaml")
    costs = StepCosts(profile, drafter)
    policy = GoodputWindow(5)
    acceptance = RateAcceptance(np.array([0.8, 0.7, 0.6, 0.5, 0.4]), proposal_rate=0.7)
    policy.attach(costs, acceptance)
    by_rows, goodput = window_terms(policy)
    vector = np.array(costs.terms)
    kernel = kernel_module("compiled_step_kernel")
    rng = np.random.default_rng(5)
    chosen = set()
    for _ in range(300):
        used = int(rng.integers(1, 41))
        remaining = rng.integers(1, 300, used).astype(np.float64)
        remaining[rng.random(used) < 0.33] = rng.integers(1, 6)
        remaining[rng.random(used) < 0.2] = 0.0  # empty slots
        remaining[-1] = max(remaining[-1], 1.0)
        context = np.where(remaining > 0, rng.integers(10, 9000, used), 0).astype(np.float64)
        rows, kv = int(np.count_nonzero(remaining)), float(context.sum())
        expected = policy.choose_batch(rows, kv, remaining, context, None, 8192)
        got = kernel.choose_window(by_rows, goodput, vector, rows, kv, remaining, context)
        assert got == expected, (rows, kv)
        chosen.add(expected)
    assert len(chosen) >= 2  # the batches move the choice


def loop_iterations(scenario, monkeypatch, loops: bool = True) -> tuple[int, int, dict]:
    """Iterations the compiled serving loop ran for a lone replica, the run's engine
    iterations, and its summary."""
    serving = compiled_serving.ServingLoop.run
    ran = [0]

    def counted_serving(self, replica, now):
        end = serving(self, replica, now)
        if end is not None:
            ran[0] += int(self.ct[compiled_serving.ITERATIONS])
        return end

    with monkeypatch.context() as patch:
        patch.setattr(compiled_serving.ServingLoop, "run", counted_serving)
        if not loops:
            no_loops(patch)
        summary = run_simulation(scenario).summary
    return ran[0], summary["engine_iterations"], summary


@pytest.mark.parametrize("policy", ["fixed", "by_batch", "adaptive"])
def test_the_loop_carries_a_lone_replicas_iterations_at_low_load(policy, monkeypatch):
    """With the kernels on, a replica alone on an open loop runs nearly every iteration in the
    loop (the rest carry prompt chunks), whatever its window policy; off, none; the summaries
    agree."""
    speculation = {"drafter": "c20", "k": 4, "policy": policy}
    if policy == "by_batch":
        speculation["k_by_batch"] = [{"max_batch": 1, "k": 4}, {"max_batch": 3, "k": 2}]
    scenario = make({"workload": {"rate": 1.0}, "speculation": speculation})
    inside, total, summary = loop_iterations(scenario, monkeypatch)
    assert inside >= 0.8 * total
    inside_off, _, summary_off = loop_iterations(scenario, monkeypatch, loops=False)
    assert inside_off == 0 and summary_off == summary
    if policy != "fixed":  # the window changed during the run: a mean between windows
        assert summary["mean_window"] != round(summary["mean_window"])
