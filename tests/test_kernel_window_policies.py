"""Window policies that observe each decode iteration, on the serving kernel
(``compiled_policy_kernel.py``): TensorRT-LLM's acceptance off-switch (``AcceptanceGate``)
around a fixed or k-by-batch policy, its ring of samples and off flag carried in the kernel's
state and handed back to the policy object (``serving_policy.py``).

Identity with the per-iteration reference (every record at full precision, each replica's
engine statistics, the summary and requests.csv: ``test_sim_identity.assert_identical``) with
the kernel running at least 80 % of the engine iterations: a lone replica, a fleet of four
behind least outstanding, and a split fleet's decode pool; the switch tripping early, late and
not at all within the run. Planted faults (the mean over window - 1 samples; the sample taken
over every row, drafting or not) fail them.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys

import pytest
import yaml
from test_disagg_kernel import BASE as SPLIT_BASE
from test_disagg_kernel import iterations, profile, share  # noqa: F401 (a fixture)
from test_kernel_kv_blocks import kernel_share
from test_sim_compiled import REPO, RUN_ALL
from test_sim_identity import BASE as SIM_BASE
from test_sim_identity import DATA, assert_identical, make

from specsim.scenario import Scenario
from specsim.simulation import serving_table
from specsim.simulation.engine_policies import AcceptanceGate, AdaptiveStepsWindow
from specsim.simulation.replica import Replica

CLOSED = {"kind": "closed_loop", "concurrency": 12, "requests": 300, "rate": None}
OPEN = {"rate": 12.0, "requests": 300}
BY_BATCH = {
    "policy": "by_batch",
    "k_by_batch": [{"max_batch": 6, "k": 4}, {"max_batch": 32, "k": 2}],
}
# Windows longer than the iterations Python runs before a lone replica's first kernel call
# (``compiled_serving.RETRY_AFTER``), so that the kernel fills the ring.
EARLY = {"threshold": 0.5, "window": 30}  # trips within the first 2 s of 25
LATE = {"threshold": 0.48, "window": 30}  # a fixed k trips after about 10 s
NEVER = {"threshold": 0.3, "window": 30}


def gate(settings: dict, **speculation) -> dict:
    return {"drafter": "c05", "k": 3, **speculation, "acceptance_gate": settings}


CASES = {
    "fixed, trips early": {"workload": OPEN, "speculation": gate(EARLY)},
    "fixed, trips late": {"workload": OPEN, "speculation": gate(LATE)},
    "fixed, never trips": {"workload": OPEN, "speculation": gate(NEVER)},
    "by batch, trips early": {"workload": OPEN, "speculation": gate(EARLY, **BY_BATCH)},
    "by batch, never trips": {"workload": OPEN, "speculation": gate(NEVER, **BY_BATCH)},
    "closed loop, fixed, never trips": {"workload": CLOSED, "speculation": gate(NEVER)},
    "four replicas, fixed, trips early": {
        "fleet": {"replicas": 4, "router": "least_outstanding"},
        "workload": {"rate": 40.0, "requests": 400},
        "speculation": gate(EARLY),
    },
    "four replicas, by batch, never trips": {
        "fleet": {"replicas": 4, "router": "least_outstanding"},
        "workload": {"rate": 40.0, "requests": 400},
        "speculation": gate(NEVER, **BY_BATCH),
    },
}


def policy_state(policy) -> tuple:
    """What the policy object holds at the end of a run, at full precision."""
    if isinstance(policy, AcceptanceGate):
        return (
            list(policy._samples),
            policy._sum,
            policy.recorded,
            policy.tripped_at,
            policy.off_at_s,
        )
    if isinstance(policy, AdaptiveStepsWindow):
        slots = [(slot.steps, slot.ema, slot.batches) for slot in policy.slots]
        current = None if policy._current is None else policy.slots.index(policy._current)
        return slots, current, policy.changed, policy.changes
    return ()


def assert_same_policies(scenario, tmp_path, monkeypatch) -> dict:
    """``assert_identical``, and each replica's policy object left in the same state (full
    precision, where the summary rounds)."""
    states, close = [], Replica.close

    def keep_policy(self):
        close(self)
        states.append(policy_state(self.policy))

    monkeypatch.setattr(Replica, "close", keep_policy)
    fast = assert_identical(scenario, tmp_path, monkeypatch)
    half = len(states) // 2
    assert states[half:] == states[:half] and any(states)
    return fast


def gate_reports(summary: dict) -> list[dict]:
    return [report["acceptance_gate"] for report in summary["window_policy"]]


@pytest.mark.parametrize("name", list(CASES))
def test_the_off_switch_on_the_kernel_is_the_reference(name, profile, tmp_path, monkeypatch):  # noqa: F811
    scenario = make(CASES[name], profile)
    kernel, summary = kernel_share(scenario, monkeypatch)
    assert kernel >= 0.8
    fast = assert_same_policies(scenario, tmp_path, monkeypatch)
    assert fast["summary"] == summary
    reports = gate_reports(summary)
    if "never" in name:
        assert all(r["tripped_at_sample"] is None and r["samples"] > 20 for r in reports)
    else:  # it trips part-way: speculation ran before, and the run went on after
        tripped = [r for r in reports if r["tripped_at_sample"] is not None]
        assert tripped
        assert all(0 < r["speculation_off_at_s"] < summary["duration_s"] for r in tripped)


def split(speculation: dict, folder) -> Scenario:
    data = copy.deepcopy(SPLIT_BASE)
    data["speculation"] = {**data["speculation"], **speculation}
    data["workload"]["rate"] = 40.0
    return Scenario.model_validate(data).with_source(folder / "scenario.yaml")


SPLIT_TRIPS = {"threshold": 0.51, "window": 30}  # trips after about 2 s of 6


@pytest.mark.parametrize("settings", [SPLIT_TRIPS, NEVER], ids=["trips", "never trips"])
def test_the_off_switch_on_a_split_fleets_decode_pool(settings, profile, tmp_path, monkeypatch):  # noqa: F811
    scenario = split({"acceptance_gate": settings}, profile)
    counts = iterations(scenario, tmp_path, monkeypatch)
    assert share(counts, "prefill") >= 0.8 and share(counts, "decode") >= 0.8
    fast = assert_same_policies(scenario, tmp_path, monkeypatch)
    tripped = [r["tripped_at_sample"] for r in gate_reports(fast["summary"])]
    assert any(tripped) == (settings is SPLIT_TRIPS)


# ---- SGLang's adaptive steps ---------------------------------------------------------------
# Three tiers: the middle one drops to 0 steps (its EMA then frozen) and probes back up, over
# and over (more changes than a summary lists); the others move between their candidates.
TIERS = {
    "ema_alpha": 0.3,
    "warmup_batches": 5,
    "update_interval": 3,
    "tiers": [
        {"min_batch": 1, "candidate_steps": [1, 2, 3, 4]},
        {"min_batch": 4, "candidate_steps": [0, 1, 3], "down_hysteresis": 0.6},
        {"min_batch": 8, "candidate_steps": [1, 3, 5], "up_hysteresis": 0.1},
    ],
}
STEPS = {"drafter": "c05", "k": 3, "policy": "adaptive_steps", "adaptive_steps": TIERS}
SGLANG = {"drafter": "c05", "k": 3, "policy": "adaptive_steps"}  # SGLang's default tiers
STEPS_CASES = {
    "open loop, three tiers": {"workload": OPEN, "speculation": STEPS},
    "closed loop, three tiers": {"workload": CLOSED, "speculation": STEPS},
    # Warm-up and decisions past the iterations Python runs before the first kernel call.
    "open loop, three tiers, long warm-up": {
        "workload": OPEN,
        "speculation": {
            **STEPS,
            "adaptive_steps": {**TIERS, "warmup_batches": 40, "update_interval": 7},
        },
    },
    "open loop, SGLang's tiers": {
        "workload": {"rate": 30.0, "requests": 400},
        "speculation": SGLANG,
    },
    "four replicas, three tiers": {
        "fleet": {"replicas": 4, "router": "least_outstanding"},
        "workload": {"rate": 40.0, "requests": 400},
        "speculation": STEPS,
    },
}


def steps_reports(summary: dict) -> list[dict]:
    return [report["adaptive_steps"] for report in summary["window_policy"]]


@pytest.mark.parametrize("name", list(STEPS_CASES))
def test_adaptive_steps_on_the_kernel_are_the_reference(name, profile, tmp_path, monkeypatch):  # noqa: F811
    scenario = make(STEPS_CASES[name], profile)
    kernel, summary = kernel_share(scenario, monkeypatch)
    assert kernel >= 0.8
    fast = assert_same_policies(scenario, tmp_path, monkeypatch)
    assert fast["summary"] == summary
    reports = steps_reports(summary)
    if "three tiers" in name:
        assert all(r["changes"] > 0 for r in reports)
    if name in ("open loop, three tiers", "four replicas, three tiers"):  # 0 steps and back
        assert any(r["changes"] > 50 for r in reports)
        assert any(change[1:] == [4, 0] for r in reports for change in r["first_changes"])


def test_adaptive_steps_on_a_split_fleets_decode_pool(profile, tmp_path, monkeypatch):  # noqa: F811
    scenario = split({"policy": "adaptive_steps", "adaptive_steps": TIERS}, profile)
    counts = iterations(scenario, tmp_path, monkeypatch)
    assert share(counts, "prefill") >= 0.8 and share(counts, "decode") >= 0.8
    fast = assert_same_policies(scenario, tmp_path, monkeypatch)
    assert all(r["changes"] > 0 for r in steps_reports(fast["summary"]))


@pytest.mark.parametrize("case", ["gate", "steps"])
def test_a_policy_not_handed_back_fails(case, profile, tmp_path, monkeypatch):  # noqa: F811
    """The kernel's policy state not written back to the policy object (a planted fault: the
    next call, or Python's next iteration, starts from the state before) differs from the
    reference."""
    changes = (
        CASES["four replicas, fixed, trips early"]
        if case == "gate"
        else {"workload": OPEN, "speculation": STEPS}
    )
    monkeypatch.setattr(serving_table, "unpack_policy", lambda policy, st, ct: None)
    with pytest.raises(AssertionError):
        assert_identical(make(changes, profile), tmp_path, monkeypatch)


def test_the_policies_run_interpreted_give_the_compiled_bytes(tmp_path):
    """The policy kernel's source run by Python (numba's JIT off) gives the compiled run's
    outputs byte for byte: the off-switch tripping and the adaptive steps, a lone replica."""
    paths = []
    for name, speculation in (("gate", gate(EARLY)), ("steps", STEPS)):
        data = copy.deepcopy(SIM_BASE) | {"profile": str(DATA / "sim_profile.yaml")}
        data["workload"] = {**data["workload"], **OPEN}
        data["speculation"] = speculation
        paths.append(tmp_path / f"{name}.yaml")
        paths[-1].write_text(yaml.safe_dump(data))
    for mode in ("compiled", "interpreted"):
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        env.pop("NUMBA_DISABLE_JIT", None)
        if mode == "interpreted":
            env["NUMBA_DISABLE_JIT"] = "1"
        command = [sys.executable, "-c", RUN_ALL, mode, str(tmp_path / mode), *map(str, paths)]
        run = subprocess.run(command, env=env, capture_output=True, text=True, cwd=tmp_path)
        assert run.returncode == 0, run.stderr[-2000:]
    for path in paths:
        for output in ("requests.csv", "summary.json"):
            compiled_bytes = (tmp_path / "compiled" / path.name / output).read_bytes()
            assert (tmp_path / "interpreted" / path.name / output).read_bytes() == compiled_bytes
