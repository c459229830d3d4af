"""Window policies as the engines run them (``simulation/engine_policies.py``).

- TensorRT-LLM's acceptance off-switch, traced by hand against SpeculationGate's rule: one
  sample per iteration that drafted (accepted drafts / drafted tokens, rows that drafted
  nothing left out), a rolling mean of the last ``window`` from the window-th sample on, and
  off for good below the threshold;
- TensorRT-LLM's max_concurrency as the k-by-batch table {max_concurrency: k}, on the fast path;
- SGLang's adaptive steps, traced by hand against AdaptiveStepSlot (EMA, warm-up, update
  interval, hysteresis, the zero-step probe) and its tier routing;
- a workload whose acceptance shifts part-way: the off-switch trips after the shift and not
  before, and the adaptive steps move down after it;
- the scenario's keys: bounds and combinations refused with one-line reasons.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pydantic
import pytest
import yaml

from specsim.policy_settings import AcceptanceGate as GateSettings
from specsim.policy_settings import AdaptiveSteps, AdaptiveTier
from specsim.scenario import Scenario, Speculation
from specsim.simulation import run_simulation
from specsim.simulation.engine_policies import AcceptanceGate, AdaptiveStepsWindow
from specsim.simulation.policy import BatchTableWindow, FixedWindow, build_policy

# ---- TensorRT-LLM's acceptance off-switch ------------------------------------------------------


def gate(threshold: float, window: int, k: int = 4) -> AcceptanceGate:
    return AcceptanceGate(FixedWindow(k), GateSettings(threshold=threshold, window=window))


def step(policy, drafts, accepted, now=0.0) -> None:
    policy.observe(np.asarray(drafts, float), np.asarray(accepted, float), now)


def test_the_gate_samples_each_drafting_iteration_and_trips_on_the_window_mean():
    policy = gate(threshold=0.5, window=3)
    step(policy, [4, 4, 0], [2, 1, 0], 1.0)  # 3 / 8 = 0.375 (the row drafting 0 left out)
    step(policy, [0, 0], [0, 0], 2.0)  # nobody drafted: no sample
    step(policy, [4, 2], [4, 2], 3.0)  # 6 / 6 = 1.0
    assert policy.recorded == 2 and policy.tripped_at is None  # fewer than window samples
    assert policy.choose(8, 0.0) == 4
    step(policy, [4], [0], 4.0)  # 0.0: mean (0.375 + 1 + 0) / 3 = 0.458 < 0.5
    assert policy.tripped_at == 3 and policy.off_at_s == 4.0
    assert policy.choose(1, 0.0) == 0  # off for good, at every batch size
    step(policy, [4], [4], 5.0)  # later iterations are not recorded
    assert policy.recorded == 3 and policy.choose(1, 0.0) == 0


def test_the_gate_mean_rolls_over_the_last_window_samples():
    policy = gate(threshold=0.5, window=2)
    for rate in (0.9, 0.9, 0.2):  # means 0.9, then (0.9 + 0.2) / 2 = 0.55: stays on
        step(policy, [10], [10 * rate])
    assert policy.tripped_at is None
    step(policy, [10], [2])  # (0.2 + 0.2) / 2 = 0.2 < 0.5
    assert policy.tripped_at == 4


def test_the_gate_stays_on_at_the_threshold_and_above():
    # TensorRT-LLM's own unit test: window 3, threshold 0.5, three samples of 0.8.
    policy = gate(threshold=0.5, window=3)
    for _ in range(3):
        step(policy, [5], [4])
    assert policy.tripped_at is None
    equal = gate(threshold=0.5, window=1)
    step(equal, [4], [2])  # exactly 0.5 is not below it
    assert equal.tripped_at is None


def test_the_gate_wraps_a_by_batch_table():
    spec = Speculation.model_validate(
        {
            "drafter": "d",
            "policy": "by_batch",
            "k_by_batch": [{"max_batch": 2, "k": 3}, {"max_batch": 4, "k": 1}],
            "acceptance_gate": {"threshold": 0.9, "window": 1},
        }
    )
    policy = build_policy(spec, max_batch=8)
    assert isinstance(policy, AcceptanceGate) and policy.k_max == 3
    assert [policy.choose(rows, 0.0) for rows in (1, 3, 5)] == [3, 1, 0]
    step(policy, [3], [1])
    assert [policy.choose(rows, 0.0) for rows in (1, 3, 5)] == [0, 0, 0]


# ---- TensorRT-LLM's max_concurrency --------------------------------------------------------


def test_max_concurrency_is_the_table_of_one_row_max_concurrency_to_k():
    spec = Speculation.model_validate({"drafter": "d", "k": 4, "max_concurrency": 3})
    policy = build_policy(spec, max_batch=8)
    assert type(policy) is BatchTableWindow  # the fast path's own by-batch table
    assert [policy.choose(rows, 0.0) for rows in range(1, 6)] == [4, 4, 4, 0, 0]


# ---- SGLang's adaptive steps ---------------------------------------------------------------


def steps_policy(initial: int, tiers: list[dict], **constants) -> AdaptiveStepsWindow:
    config = AdaptiveSteps(tiers=[AdaptiveTier(**t) for t in tiers], **constants)
    return AdaptiveStepsWindow(initial, config)


def test_adaptive_steps_follow_the_ema_by_sglangs_rule():
    policy = steps_policy(
        3,
        [{"min_batch": 1, "candidate_steps": [1, 3, 5, 7]}],
        ema_alpha=0.5,
        warmup_batches=2,
        update_interval=2,
        down_hysteresis=-0.25,
    )
    slot = policy.slots[0]
    assert (slot.steps, slot.ema) == (3, 2.0)  # the initial steps, EMA at steps - 1
    expected = [
        # (accepted per request, EMA after, steps after)
        ([3, 3], 2.5, 3),  # warm-up batch 1
        ([3, 3], 2.75, 3),  # warm-up batch 2
        ([3, 3], 2.875, 3),  # (3 - 2) % 2: no decision
        ([3, 3], 2.9375, 5),  # decide: no drop (> 1 - 0.5 - 0.25); rise (> 3 - 0.5), not > 4.5
        ([0, 1], 1.71875, 5),
        ([0, 0], 0.859375, 3),  # decide: <= 3 - 0.5 - 0.25 drops to 3, > 0.25 stops there
    ]
    for accepted, ema, steps in expected:
        k = policy.choose(2, 0.0)
        step(policy, [k, k], accepted)
        assert (slot.ema, slot.steps) == (ema, steps)


def test_a_tier_at_zero_steps_probes_the_next_candidate():
    policy = steps_policy(
        3,  # not a candidate: the slot starts at its middle one, 1
        [{"min_batch": 1, "candidate_steps": [0, 1]}],
        warmup_batches=0,
        update_interval=1,
        down_hysteresis=0.0,
    )
    slot = policy.slots[0]
    assert (slot.steps, slot.ema) == (1, 0.0)
    step(policy, [policy.choose(4, 0.0)] * 4, [0, 0, 0, 0])  # EMA 0 <= 0.5: drop to 0
    assert slot.steps == 0
    step(policy, [0] * 4, [0] * 4)  # at 0 the EMA holds; the decision probes 1
    assert (slot.steps, slot.ema) == (1, 0.0)


def test_batches_route_to_the_tier_they_fall_in():
    policy = AdaptiveStepsWindow(1, AdaptiveSteps())  # SGLang's default tiers 1, 8, 32, 64
    assert [policy.slot(rows) for rows in (1, 7, 8, 31, 32, 64, 500)] == [
        policy.slots[i] for i in (0, 0, 1, 1, 2, 3, 3)
    ]
    # Each tier starts at the server's steps when among its candidates, else its middle one.
    assert [s.steps for s in policy.slots] == [1, 1, 1, 0]
    assert policy.k_max == 7


def test_the_default_config_is_sglangs():
    # sglang 0.5.23 adaptive_spec_params.py DEFAULT_ADAPTIVE_CONFIG (ceiling_coeff 0 left out).
    config = AdaptiveSteps().engine_config()
    assert {k: v for k, v in config.items() if k.isdigit()} == {
        "1": {"candidate_steps": [1, 3, 5, 7], "up_hysteresis": 0.0, "down_hysteresis": -0.25},
        "8": {"candidate_steps": [0, 1, 3], "up_hysteresis": 0.0, "down_hysteresis": 0.0},
        "32": {"candidate_steps": [0, 1], "up_hysteresis": 0.0, "down_hysteresis": 0.0},
        "64": {"candidate_steps": [0], "up_hysteresis": 0.0, "down_hysteresis": 0.0},
    }
    assert (config["ema_alpha"], config["update_interval"], config["warmup_batches"]) == (
        0.2,
        5,
        10,
    )


# ---- a workload whose acceptance shifts ----------------------------------------------------

PROFILE = {
    "version": 1,
    "name": "shift-test",
    "provenance": {"source": "published", "device": "test", "date": "2026-01-01", "notes": "test"},
    "hardware": {"name": "test-gpu", "memory_bytes": 80.0e9, "price_per_hour_usd": 2.0},
    "target": {
        "kind": "target",
        "kv_bytes_per_token": 131072,
        "weight_bytes": 16.0e9,
        "flops_per_token": 16.0e9,
        "attention_flops_per_context_token": 524288,
        "latency": {"fit": {"fixed_s": 0.008, "per_batched_token_s": 4.0e-5, "knee_tokens": 256}},
    },
    "drafters": {
        "heads": {
            "kind": "heads",
            "kv_bytes_per_token": 0,
            "weight_bytes": 0,
            "flops_per_token": 1.0e8,
            "latency": {"fit": {"fixed_s": 0.002}},
        }
    },
    "acceptance": [
        {"drafter": "heads", "verifier": "rejection", "temperature": 1.0, "per_position": [0.8]}
    ],
}
SHIFT_S = 5.0


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("shift")
    (out / "profile.yaml").write_text(yaml.safe_dump(PROFILE))
    return out


def shifted(folder: Path, speculation: dict) -> Scenario:
    data = {
        "seed": 1,
        "profile": "profile.yaml",
        "workload": {
            "kind": "closed_loop",
            "concurrency": 4,
            "duration_s": 12.0,
            "prompt": {"dist": "fixed", "value": 100},
            "output": {"dist": "fixed", "value": 60},
        },
        "engine": {"max_batch": 64, "kv_capacity_tokens": 1_000_000},
        "speculation": {"drafter": "heads", "acceptance": "iid", **speculation},
    }
    return Scenario.model_validate(data).with_source(folder / "scenario.yaml")


def report(folder: Path, speculation: dict) -> dict:
    (entry,) = run_simulation(shifted(folder, speculation)).summary["window_policy"]
    return entry


def test_the_off_switch_trips_after_the_acceptance_shifts_and_not_before(folder):
    # iid 0.8, k = 4: each iteration's rate is about (0.8 + 0.64 + 0.51 + 0.41) / 4 = 0.59;
    # from SHIFT_S requests accept at 0.8 x 0.25 = 0.2: about 0.06 once they fill the batch.
    gate_keys = {"k": 4, "acceptance_gate": {"threshold": 0.4, "window": 20}}
    shift = {"after_s": SHIFT_S, "factor": 0.25}
    steady = report(folder, gate_keys)["acceptance_gate"]
    assert steady["tripped_at_sample"] is None and steady["samples"] > 200
    tripped = report(folder, {**gate_keys, "acceptance_shift": shift})["acceptance_gate"]
    # Requests sent from SHIFT_S on take a prefill and a few steps to fill the window: it
    # trips after the shift, and within a second of it.
    assert SHIFT_S < tripped["speculation_off_at_s"] < SHIFT_S + 1.0
    assert tripped["tripped_at_sample"] == tripped["samples"]  # nothing recorded after


def test_adaptive_steps_step_down_after_the_acceptance_shifts(folder):
    # Batches of 4 are tier 1 ([1, 3, 5, 7]). At iid 0.8 and 3 steps a request accepts
    # 0.8 + 0.64 + 0.512 = 1.95 drafts a step: above the drop to 1 (1 - 0.5 - 0.25) and below
    # the rise to 5 (3 - 0.5), so the steps hold at 3. From SHIFT_S the shifted requests
    # accept 0.16 + 0.026 + 0.004 = 0.19: the EMA falls under 0.25 and the steps drop to 1.
    keys = {"k": 3, "policy": "adaptive_steps"}
    assert report(folder, keys)["adaptive_steps"]["changes"] == 0
    shift = {"acceptance_shift": {"after_s": SHIFT_S, "factor": 0.2}}
    steps = report(folder, {**keys, **shift})["adaptive_steps"]
    ((when, tier, to),) = steps["first_changes"]
    assert SHIFT_S < when < SHIFT_S + 1.0 and (tier, to) == (1, 1)
    assert steps["steps"]["1"] == 1


def test_a_cut_off_runs_on_the_fast_path_as_on_the_reference(folder):
    scenario = shifted(folder, {"k": 3, "max_concurrency": 2})
    fast = run_simulation(scenario, fast_path=True).summary
    reference = run_simulation(scenario, fast_path=False).summary
    assert fast == reference
    assert "window_policy" not in fast  # a table keeps no state


# ---- the scenario's keys -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        (
            {"policy": "by_batch", "k_by_batch": [{"max_batch": 4, "k": 2}], "max_concurrency": 2},
            "end the k_by_batch table there",
        ),
        ({"policy": "adaptive", "max_concurrency": 2}, "max_concurrency cuts a fixed k off"),
        (
            {"policy": "adaptive", "acceptance_gate": {"threshold": 0.3, "window": 5}},
            "acceptance_gate is TensorRT-LLM's",
        ),
        ({"acceptance_gate": {"threshold": 0.0, "window": 5}}, "greater than 0"),
        ({"acceptance_gate": {"threshold": 0.3, "window": 0}}, "greater than or equal to 1"),
        ({"adaptive_steps": {}}, "only with policy: adaptive_steps"),
        ({"policy": "adaptive_steps", "k": 4}, "not one of the candidate steps"),
        (
            {
                "policy": "adaptive_steps",
                "k": 1,
                "adaptive_steps": {
                    "tiers": [
                        {"min_batch": 8, "candidate_steps": [1]},
                        {"min_batch": 4, "candidate_steps": [1]},
                    ]
                },
            },
            "increasing min_batch",
        ),
        (
            {"policy": "adaptive_steps", "k": 1, "adaptive_steps": {"tiers": []}},
            "at least 1 item",
        ),
        ({"acceptance_shift": {"factor": 0.5}}, "exactly one of after_requests and after_s"),
        (
            {"acceptance_shift": {"after_s": 1.0, "after_requests": 3, "factor": 0.5}},
            "exactly one",
        ),
        (
            {"acceptance": "sequences", "acceptance_shift": {"after_s": 1.0, "factor": 0.5}},
            "not replayed sequences",
        ),
    ],
)
def test_bad_switches_are_refused_with_the_reason(keys, message):
    with pytest.raises(pydantic.ValidationError, match=message):
        Speculation.model_validate({"drafter": "d", **keys})


def test_new_keys_default_to_off():
    spec = Speculation.model_validate({"drafter": "d", "k": 4})
    assert (spec.max_concurrency, spec.acceptance_gate, spec.acceptance_shift) == (None,) * 3
    assert type(build_policy(spec, max_batch=8)) is FixedWindow


def test_a_shift_by_a_factor_of_one_changes_nothing(folder):
    """The shifted requests take other levels with the same rates: the draws and so every
    figure are those of the run without a shift."""
    plain = run_simulation(shifted(folder, {"k": 3})).summary
    same = run_simulation(
        shifted(folder, {"k": 3, "acceptance_shift": {"after_requests": 5, "factor": 1.0}})
    ).summary
    assert same == plain


def test_requests_shift_by_their_index_or_their_send_time():
    from specsim.policy_settings import AcceptanceShift
    from specsim.simulation.acceptance import RateAcceptance

    rates = np.array([0.8, 0.5])
    by_index = RateAcceptance(rates, 1.0, None, AcceptanceShift(after_requests=3, factor=0.5))
    assert by_index.levels == 2 and by_index.base_levels == 1
    assert [by_index.request_level(0, rid, 0.0) for rid in (2, 3)] == [0, 1]
    np.testing.assert_allclose(by_index.survival, [[0.8, 0.4], [0.4, 0.1]])
    by_time = RateAcceptance(rates, 1.0, None, AcceptanceShift(after_s=2.0, factor=2.0))
    assert [by_time.request_level(0, 9, t) for t in (1.9, 2.0)] == [0, 1]
    np.testing.assert_allclose(by_time.survival[1], [1.0, 1.0])  # rates capped at 1
    # What a policy plans with stays the profile's: the levels before the shift.
    assert by_time.expected_emitted(2) == pytest.approx(1 + 0.8 + 0.4)


def test_planners_drop_the_switches_a_swept_policy_refuses():
    from specsim.planning.common import switch_overrides

    spec = Speculation.model_validate(
        {
            "drafter": "d",
            "k": 3,
            "max_concurrency": 8,
            "acceptance_gate": {"threshold": 0.3, "window": 10},
            "acceptance_shift": {"after_s": 1.0, "factor": 0.5},
        }
    )
    assert switch_overrides(spec, "fixed") == []
    assert switch_overrides(spec, "by_batch") == ["speculation.max_concurrency=null"]
    assert switch_overrides(spec, "adaptive") == [
        "speculation.max_concurrency=null",
        "speculation.acceptance_gate=null",
    ]
    assert switch_overrides(spec, "fixed", tree=True) == ["speculation.acceptance_shift=null"]
    plain = Speculation.model_validate({"drafter": "d", "k": 3})
    assert switch_overrides(plain, "adaptive", tree=True) == []  # sweeps as before
