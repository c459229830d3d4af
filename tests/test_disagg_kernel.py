"""A split fleet's replicas on the compiled serving kernel (``fleet_serving.py``): a prefill
replica hands each prompt that is through off to the decode pool from inside the kernel's
calls (``compiled_layout.HANDS_OFF``), and a decode replica's requests join its batch with
their KV cache, owe their draft model's prompt pass and stream their first token at the end of
their first decode iteration (``JOINS``, ``PROMPT_PASS``), as ``disagg.PrefillReplica`` and
``DecodeReplica`` do per iteration.

Identity with the per-iteration reference (every record, each replica's engine statistics,
the summary and requests.csv: ``test_sim_identity.assert_identical``) for 1P1D and 2P3D under
round robin and least outstanding, a draft model (its prompt pass owed on the decode side) and
heads (hidden states moved), a saturated decode pool with a queue and preemption (also under
a small token budget), one-token outputs (which finish on the prefill side), prefix hits on
the prefill pool, and prefill chunked or not; the kernel runs most of both pools' iterations
in each. Planted faults (a call's hand-offs applied in another order, hand-offs taken for
finishes, calls that run on past a hand-off) fail them.
"""

from __future__ import annotations

import copy
import inspect
from collections import Counter
from pathlib import Path

import pytest
import yaml
from test_sim_disagg import BASE as SIM_BASE
from test_sim_identity import DATA, assert_identical, observe

from specsim.scenario import Scenario
from specsim.simulation import compiled_serving, fleet_serving
from specsim.simulation.compiled_layout import COUNTS, ITERATIONS, STOP_AT_FINISH
from specsim.simulation.disagg import PrefillReplica
from specsim.simulation.replica import Replica

# test_sim_disagg's split fleet, with shorter outputs (more finishes and joins per call).
BASE = copy.deepcopy(SIM_BASE)
BASE["workload"]["output"]["high"] = 60
TWO_THREE = {"prefill": {"replicas": 2}, "decode": {"replicas": 3}}

CASES = {
    "1P1D, draft model": {},
    "1P1D, heads": {"speculation": {"drafter": "heads", "k": 2}},
    "2P3D, round robin": {"split": TWO_THREE, "workload": {"rate": 40.0}},
    "2P3D, least outstanding, heads": {
        "fleet": {"router": "least_outstanding"},
        "split": {**TWO_THREE, "decode_router": "least_outstanding"},
        "workload": {"rate": 40.0},
        "speculation": {"drafter": "heads", "k": 3},
    },
    "1P1D, saturated decode pool, preemption": {
        "engine": {"max_batch": 32, "kv_capacity_tokens": 2500},
        "workload": {"rate": 60.0, "output": {"dist": "uniform", "low": 1, "high": 120}},
    },
    "1P1D, prefix hits, saturated decode pool": {
        "engine": {"max_batch": 32, "kv_capacity_tokens": 2500},
        "workload": {
            "rate": 60.0,
            "output": {"dist": "uniform", "low": 1, "high": 120},
            "prefix": {"source": "fraction", "fraction": 0.5, "hit_rate": 0.5},
        },
    },
    "1P1D, saturated decode pool, small budget": {
        "engine": {"max_batch": 32, "kv_capacity_tokens": 2500, "max_batched_tokens": 96},
        "workload": {"rate": 60.0, "output": {"dist": "uniform", "low": 1, "high": 120}},
    },
    "1P3D, busy prefill, small budget": {
        "split": {"decode": {"replicas": 3}},
        "engine": {"max_batch": 32, "max_batched_tokens": 512},
        "workload": {"rate": 80.0},
    },
    "1P1D, one-token outputs": {"workload": {"output": {"dist": "uniform", "low": 1, "high": 3}}},
    "2P3D, prefill apart": {
        "split": TWO_THREE,
        "engine": {"max_batch": 32, "chunked_prefill": False},
        "workload": {"rate": 40.0},
    },
    "1P1D, prefill apart, small budget": {
        "engine": {"max_batch": 32, "chunked_prefill": False, "max_batched_tokens": 256},
    },
}


@pytest.fixture(scope="module")
def profile(tmp_path_factory) -> Path:
    """The test profile with the target's hidden size (heads move its hidden states) and
    passes that cost more with tokens and context (so that replicas' iterations do not end on
    the same float times)."""
    profile = yaml.safe_load((DATA / "sim_profile.yaml").read_text())
    profile["target"]["hidden_size"] = 1024
    profile["target"]["latency"]["fit"].update(
        per_batched_token_s=3.0e-5, knee_tokens=48, per_kv_token_s=4.0e-8, per_attention_pair_s=1e-9
    )
    folder = tmp_path_factory.mktemp("profile")
    (folder / "sim_profile.yaml").write_text(yaml.safe_dump(profile))
    (folder / "sim_sequences.txt").write_text((DATA / "sim_sequences.txt").read_text())
    return folder


def make(changes: dict, folder: Path) -> Scenario:
    data = copy.deepcopy(BASE)
    for section, values in changes.items():
        if section == "split":
            data["fleet"]["disaggregation"].update(values)
        else:
            data[section] = {**data.get(section, {}), **values}
    return Scenario.model_validate(data).with_source(folder / "scenario.yaml")


def iterations(scenario, tmp_path, monkeypatch) -> Counter:
    """The run's engine iterations by pool, in the kernel and in Python."""
    counts = Counter()
    settle, mixed, apart = (
        fleet_serving.FleetServing._settle,
        Replica._plan_mixed,
        Replica._plan_prefill_only,
    )

    def pool(replica) -> str:
        return "prefill" if isinstance(replica, PrefillReplica) else "decode"

    def counted_settle(self, replica):
        counts[pool(replica), "kernel"] += int(self.ct[ITERATIONS])
        settle(self, replica)

    def counted(plan):
        def step(self):
            counts[pool(self), "python"] += 1
            return plan(self)

        return step

    with monkeypatch.context() as patch:
        patch.setattr(fleet_serving.FleetServing, "_settle", counted_settle)
        patch.setattr(Replica, "_plan_mixed", counted(mixed))
        patch.setattr(Replica, "_plan_prefill_only", counted(apart))
        observe(scenario, tmp_path / "count.csv", True, monkeypatch)
    return counts


def share(counts: Counter, pool: str) -> float:
    kernel = counts[pool, "kernel"]
    return kernel / (kernel + counts[pool, "python"])


@pytest.mark.parametrize("name", list(CASES))
def test_a_split_fleet_on_the_kernel_is_the_reference(name, profile, tmp_path, monkeypatch):
    scenario = make(CASES[name], profile)
    counts = iterations(scenario, tmp_path, monkeypatch)
    assert share(counts, "prefill") >= 0.8 and share(counts, "decode") >= 0.8
    fast = assert_identical(scenario, tmp_path, monkeypatch)
    split = fast["summary"]["disaggregation"]
    assert split["transfers"] > 0
    if "saturated" in name:
        assert fast["summary"]["pools"]["decode"]["preemptions"] > 0
    if "prefix" in name:  # hits on the prefill pool; the decode pool looks nothing up
        assert fast["summary"]["pools"]["prefill"]["prefix_cache"]["cached_tokens"] > 0
        assert fast["summary"]["pools"]["decode"]["prefix_cache"]["queried_tokens"] == 0
    if "one-token" in name:  # some finish on the prefill side, from inside the kernel's calls
        assert 0 < split["transfers"] < fast["summary"]["requests"]


def differs(scenario, tmp_path, monkeypatch) -> bool:
    fast = observe(scenario, tmp_path / "fast.csv", True, monkeypatch)
    reference = observe(scenario, tmp_path / "reference.csv", False, monkeypatch)
    return fast["csv"] != reference["csv"] or fast["summary"] != reference["summary"]


def test_hand_offs_applied_in_another_order_fail(profile, tmp_path, monkeypatch):
    """The records of a call, finishes and hand-offs, go in the order its iterations made
    them: reversed, the decode router and the link see them in another order."""
    scenario = make(CASES["1P3D, busy prefill, small budget"], profile)
    assert not differs(scenario, tmp_path, monkeypatch)
    write = fleet_serving.FleetServing._write_records

    def reversed_records(self, replica):
        count = int(self.ct[fleet_serving.RECORDS])
        self.records[:count] = self.records[:count][::-1].copy()
        write(self, replica)

    monkeypatch.setattr(fleet_serving.FleetServing, "_write_records", reversed_records)
    assert differs(scenario, tmp_path, monkeypatch)


def test_hand_offs_taken_for_finishes_fail(profile, tmp_path, monkeypatch):
    """A record must say that it is a hand-off: read as a finish, the request never decodes."""
    scenario = make(CASES["1P1D, draft model"], profile)
    assert not differs(scenario, tmp_path, monkeypatch)
    monkeypatch.setattr(fleet_serving, "HANDED_OFF", -2.0)
    assert differs(scenario, tmp_path, monkeypatch)


def test_calls_that_run_on_past_a_hand_off_fail(profile, tmp_path, monkeypatch):
    """A hand-off changes the decode pool's counts and the link: the call must stop after the
    iteration that makes one, as at a finish (``STOP_AT_FINISH``)."""
    scenario = make(CASES["1P3D, busy prefill, small budget"], profile)
    assert not differs(scenario, tmp_path, monkeypatch)
    kernel = compiled_serving._serving_kernel()
    at = list(inspect.signature(kernel.serving_loop.py_func).parameters).index("ct")

    class RunsOn:
        def serving_loop(self, *args):
            ct = args[at]
            assert ct.shape == (COUNTS,)
            ct[STOP_AT_FINISH] = 0
            kernel.serving_loop(*args)

    monkeypatch.setattr(compiled_serving, "_module", [RunsOn()])
    assert differs(scenario, tmp_path, monkeypatch)
