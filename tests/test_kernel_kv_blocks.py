"""KV blocks (``engine.block_size``) and a shared system prompt on the serving kernel
(``compiled_kv_kernel.py``): the cache counted in whole blocks, each sequence holding
cdiv(its tokens + lookahead, block size) (a draft model's k more lookahead), prefix hits
rounded down to whole blocks, and a shared prefix's blocks held once for all the sequences
that hit it (``admission.SharedPrefix``), as ``admission.py`` counts them per iteration.

Identity with the per-iteration reference (every record at full precision, each replica's
engine statistics, the summary and requests.csv: ``test_sim_identity.assert_identical``) with
the kernel running at least 80 % of the engine iterations: block sizes 16 and 1, a lone
replica on an open and a closed loop, under cache pressure with preemption, prefill apart, a
fleet behind a router, a split fleet's pools, tree pools and prefix hits rounded to blocks; a
system prompt hit at rates 0.5 and 1.0, alone and with a block size, lone, in a fleet and on a
split fleet's prefill pool. Planted faults (blocks rounded down instead of up in the kernel,
hits left unrounded by the table, the shared prefix counted per row) fail them.
"""

from __future__ import annotations

import copy

import pytest
from test_disagg_kernel import BASE as SPLIT_BASE
from test_disagg_kernel import iterations, profile, share  # noqa: F401 (a fixture)
from test_sim_identity import assert_identical, make, shortened

from specsim.scenario import Scenario
from specsim.simulation import compiled_serving, fleet_serving, run_simulation
from specsim.simulation.admission import Admission
from specsim.simulation.compiled_layout import ITERATIONS, SHARED
from specsim.simulation.serving_table import ServingTable

CLOSED = {"kind": "closed_loop", "concurrency": 12, "requests": 300, "rate": None}
PRESSURE = {"max_batch": 12, "kv_capacity_tokens": 1500}
HALF = {"source": "fraction", "fraction": 0.5, "hit_rate": 0.5}
# Longer than some prompts: their hits (the prompt less one) are shorter prefixes of it.
SYSTEM = {"source": "system_prompt", "length": 120, "hit_rate": 0.5}
ALWAYS = {**SYSTEM, "hit_rate": 1.0}

CASES = {
    "closed loop, block 16": {"workload": CLOSED, "engine": {"block_size": 16}},
    "closed loop, block 1": {"workload": CLOSED, "engine": {"block_size": 1}},
    "closed loop, block 16, preemption": {
        "workload": CLOSED,
        "engine": {**PRESSURE, "block_size": 16},
    },
    "closed loop, block 1, preemption": {
        "workload": CLOSED,
        "engine": {**PRESSURE, "block_size": 1},
    },
    "open loop, block 16, preemption": {
        "workload": {"rate": 20.0, "requests": 400},
        "engine": {"max_batch": 16, "kv_capacity_tokens": 1500, "block_size": 16},
    },
    "closed loop, block 16, prefill apart, preemption": {
        "workload": CLOSED,
        "engine": {**PRESSURE, "block_size": 16, "chunked_prefill": False},
    },
    "closed loop, block 16, ngram, adaptive": {
        "workload": CLOSED,
        "engine": {**PRESSURE, "block_size": 16},
        "speculation": {"drafter": "ngram", "k": 3, "policy": "adaptive"},
    },
    "closed loop, block 16, prefix hits, preemption": {
        "workload": {**CLOSED, "prefix": HALF},
        "engine": {**PRESSURE, "block_size": 16},
    },
    "two replicas, block 16, saturated, preemption": {
        "fleet": {"replicas": 2, "router": "least_outstanding"},
        "workload": {"rate": 40.0, "requests": 400},
        "engine": {"max_batch": 16, "kv_capacity_tokens": 1500, "block_size": 16},
    },
    "two replicas, block 16, prefix hits, closed loop": {
        "fleet": {"replicas": 2, "router": "round_robin"},
        "workload": {**CLOSED, "prefix": HALF},
        "engine": {**PRESSURE, "block_size": 16},
    },
}

SHARED_CASES = {
    "closed loop, system prompt 0.5, preemption": {
        "workload": {**CLOSED, "prefix": SYSTEM},
        "engine": PRESSURE,
    },
    "closed loop, system prompt 1.0, preemption": {
        "workload": {**CLOSED, "prefix": ALWAYS},
        "engine": PRESSURE,
    },
    "closed loop, system prompt 0.5, block 16, preemption": {
        "workload": {**CLOSED, "prefix": SYSTEM},
        "engine": {**PRESSURE, "block_size": 16},
    },
    "closed loop, system prompt 1.0, block 16, preemption": {
        "workload": {**CLOSED, "prefix": ALWAYS},
        "engine": {**PRESSURE, "block_size": 16},
    },
    "open loop, system prompt 1.0, block 16, prefill apart, preemption": {
        "workload": {"rate": 20.0, "requests": 400, "prefix": ALWAYS},
        "engine": {
            "max_batch": 16,
            "kv_capacity_tokens": 1500,
            "block_size": 16,
            "chunked_prefill": False,
        },
    },
    "two replicas, system prompt 0.5, block 16, saturated, preemption": {
        "fleet": {"replicas": 2, "router": "least_outstanding"},
        "workload": {"rate": 40.0, "requests": 400, "prefix": SYSTEM},
        "engine": {"max_batch": 16, "kv_capacity_tokens": 1500, "block_size": 16},
    },
    "two replicas, system prompt 1.0, closed loop, preemption": {
        "fleet": {"replicas": 2, "router": "round_robin"},
        "workload": {**CLOSED, "prefix": ALWAYS},
        "engine": {"max_batch": 12, "kv_capacity_tokens": 700},
    },
}


def kernel_share(scenario, monkeypatch) -> tuple[float, dict]:
    """The share of the run's engine iterations the kernel ran (a lone replica's calls and a
    fleet replica's), and the run's summary."""
    run, settle = compiled_serving.ServingLoop.run, fleet_serving.FleetServing._settle
    ran = [0]

    def counted_run(self, replica, now):
        end = run(self, replica, now)
        if end is not None:
            ran[0] += int(self.ct[ITERATIONS])
        return end

    def counted_settle(self, replica):
        ran[0] += int(self.ct[ITERATIONS])
        settle(self, replica)

    with monkeypatch.context() as patch:
        patch.setattr(compiled_serving.ServingLoop, "run", counted_run)
        patch.setattr(fleet_serving.FleetServing, "_settle", counted_settle)
        summary = run_simulation(scenario).summary
    return ran[0] / summary["engine_iterations"], summary


def assert_on_the_kernel(scenario, tmp_path, monkeypatch) -> dict:
    """The kernel runs 80 % of the iterations or more, with the reference's results."""
    share_, summary = kernel_share(scenario, monkeypatch)
    assert share_ >= 0.8
    fast = assert_identical(scenario, tmp_path, monkeypatch)
    assert fast["summary"] == summary
    return summary


@pytest.mark.parametrize("name", list(CASES))
def test_kv_blocks_on_the_kernel_are_the_reference(name, profile, tmp_path, monkeypatch):  # noqa: F811
    summary = assert_on_the_kernel(make(CASES[name], profile), tmp_path, monkeypatch)
    if "preemption" in name or "saturated" in name:
        assert summary["preemptions"] > 0
    if "prefix" in name:
        assert summary["prefix_cache"]["cached_tokens"] > 0
        assert summary["prefix_cache"]["cached_tokens"] % 16 == 0


@pytest.mark.parametrize("name", list(SHARED_CASES))
def test_a_shared_prefix_on_the_kernel_is_the_reference(name, profile, tmp_path, monkeypatch):  # noqa: F811
    summary = assert_on_the_kernel(make(SHARED_CASES[name], profile), tmp_path, monkeypatch)
    assert summary["preemptions"] > 0
    assert summary["prefix_cache"]["cached_tokens"] > 0
    if "block" in name:
        assert summary["prefix_cache"]["cached_tokens"] % 16 == 0


def test_a_shared_prefix_counted_per_row_fails(profile, tmp_path, monkeypatch):  # noqa: F811
    """The kernel told the prefix is not shared (each row counts its own copy: a planted
    fault) differs from the reference."""
    scenario = make(SHARED_CASES["closed loop, system prompt 1.0, preemption"], profile)
    rules = ServingTable._rules

    def per_row(self, replica):
        rules(self, replica)
        self.ct[SHARED] = 0

    monkeypatch.setattr(ServingTable, "_rules", per_row)
    with pytest.raises(AssertionError):
        assert_identical(scenario, tmp_path, monkeypatch)


@pytest.mark.filterwarnings("ignore:.*outside the measured range")
def test_tree_pools_count_blocks_on_the_kernel(tmp_path, monkeypatch):
    """The shipped tree scenario's three pools (chain and trees: each row holds a tree's
    nodes as lookahead) saturated, with blocks of 16 and preemption (past the profile's
    range, which warns once in both runs)."""
    scenario = shortened("tree.yaml")
    engine = scenario.engine.model_copy(update={"block_size": 16, "kv_capacity_tokens": 1500})
    workload = scenario.workload.model_copy(update={"rate": 40.0})
    scenario = scenario.model_copy(update={"engine": engine, "workload": workload})
    assert assert_on_the_kernel(scenario, tmp_path, monkeypatch)["preemptions"] > 0


def test_blocks_are_not_tokens():
    """The cases count blocks: a block of 16 preempts less often than tokens would allow at
    the same capacity, and a block of 1 is not the token count (a draft model's k more
    lookahead), so a kernel counting tokens would differ from the reference."""
    summaries = {
        size: run_simulation(
            make({"workload": CLOSED, "engine": {**PRESSURE, "block_size": size}})
        ).summary
        for size in (None, 1, 16)
    }
    preemptions = {size: s["preemptions"] for size, s in summaries.items()}
    assert len(set(preemptions.values())) == 3, preemptions


def test_hits_left_unrounded_fail(profile, tmp_path, monkeypatch):  # noqa: F811
    """Hits the table draws ahead left in tokens, not whole blocks (a planted fault), fail."""
    scenario = make(CASES["closed loop, block 16, prefix hits, preemption"], profile)
    original = Admission.hits

    def unrounded(self, rids, prompts):
        size, self.block_size = self.block_size, None
        try:
            return original(self, rids, prompts)
        finally:
            self.block_size = size

    monkeypatch.setattr(Admission, "hits", unrounded)
    with pytest.raises(AssertionError):
        assert_identical(scenario, tmp_path, monkeypatch)


SPLIT = {
    "1P1D, block 16, saturated decode pool": {
        "engine": {"max_batch": 32, "kv_capacity_tokens": 2500, "block_size": 16},
        "workload": {"rate": 60.0, "output": {"dist": "uniform", "low": 1, "high": 120}},
    },
    "2P3D, block 1, prefix hits": {
        "split": {"prefill": {"replicas": 2}, "decode": {"replicas": 3}},
        "engine": {"block_size": 1},
        "workload": {"rate": 40.0, "prefix": HALF},
    },
    "1P1D, block 16, prefix hits, prefill apart": {
        "engine": {"max_batch": 32, "block_size": 16, "chunked_prefill": False},
        "workload": {"rate": 40.0, "prefix": HALF},
    },
    "2P3D, system prompt 0.5, block 16, prefix hits": {
        "split": {"prefill": {"replicas": 2}, "decode": {"replicas": 3}},
        "engine": {"max_batch": 32, "kv_capacity_tokens": 2500, "block_size": 16},
        "workload": {"rate": 40.0, "prefix": SYSTEM},
    },
    "1P1D, system prompt 1.0, prefix hits, saturated": {
        "engine": {"max_batch": 32, "kv_capacity_tokens": 2500},
        "workload": {
            "rate": 60.0,
            "output": {"dist": "uniform", "low": 1, "high": 120},
            "prefix": ALWAYS,
        },
    },
}


def split(changes: dict, folder) -> Scenario:
    data = copy.deepcopy(SPLIT_BASE)
    for section, values in changes.items():
        if section == "split":
            data["fleet"]["disaggregation"].update(values)
        else:
            data[section] = {**data.get(section, {}), **values}
    return Scenario.model_validate(data).with_source(folder / "scenario.yaml")


@pytest.mark.parametrize("name", list(SPLIT))
def test_a_split_fleets_pools_count_blocks_on_the_kernel(name, profile, tmp_path, monkeypatch):  # noqa: F811
    scenario = split(SPLIT[name], profile)
    counts = iterations(scenario, tmp_path, monkeypatch)
    assert share(counts, "prefill") >= 0.8 and share(counts, "decode") >= 0.8
    fast = assert_identical(scenario, tmp_path, monkeypatch)
    pools = fast["summary"]["pools"]
    if "saturated" in name:
        assert pools["decode"]["preemptions"] > 0
    if "prefix" in name:
        assert pools["prefill"]["prefix_cache"]["cached_tokens"] > 0
