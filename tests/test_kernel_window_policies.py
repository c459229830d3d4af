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

import pytest
from test_disagg_kernel import BASE as SPLIT_BASE
from test_disagg_kernel import iterations, profile, share  # noqa: F401 (a fixture)
from test_kernel_kv_blocks import kernel_share
from test_sim_identity import assert_identical, make

from specsim.scenario import Scenario
from specsim.simulation import serving_table
from specsim.simulation.engine_policies import AcceptanceGate
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


def test_the_switch_not_handed_back_fails(profile, tmp_path, monkeypatch):  # noqa: F811
    """The kernel's samples not written back to the policy (a planted fault: the next call,
    or Python's next iteration, starts from the state before) differ from the reference."""
    monkeypatch.setattr(serving_table, "unpack_policy", lambda policy, st, ct: None)
    with pytest.raises(AssertionError):
        assert_identical(
            make(CASES["four replicas, fixed, trips early"], profile), tmp_path, monkeypatch
        )
