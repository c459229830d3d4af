"""The fast path (compiled spans of iterations where the kernels know the replica's rules,
arrivals drained inside the replica loop) gives byte-identical results to the per-iteration
reference path.

Each case runs twice, the fast path as it runs (the compiled loops where they apply, Python
elsewhere) and the reference (``fast_path=False``), and they must agree on
requests.csv (bytes), summary.json (the dict), every finished request's row at full float
precision, and every replica's engine statistics (busy seconds, KV token-seconds, FLOPs, ITL
histogram, acceptance and batch counts), exactly. The cases cover every shipped scenario (with
shortened workloads) and, on the test profile, every window policy, acceptance model, drafter
kind, jitter on and off, both prefill modes, padded attention, preemption, several replicas under
each router, and closed-loop clients with and without think time.

Most cases run on two profiles: the test profile (memory-bound: every pass costs its fixed time
whatever the batch) and a copy whose passes cost more with tokens and context and whose
iterations vary (``jitter``). Where several replicas serve closed-loop clients on the first, their
iterations fall on exactly the same float times, and the two paths may order such simultaneous
events differently (the reference by when SimPy created them): those cases run on the second.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import yaml

from specsim.scenario import Scenario, load_scenario
from specsim.simulation import run_simulation
from specsim.simulation.records import RecordSink
from specsim.simulation.replica import Replica

REPO = Path(__file__).resolve().parent.parent
DATA = Path(__file__).parent / "data"

BASE = {
    "seed": 5,
    "profile": "sim_profile.yaml",
    "workload": {
        "kind": "poisson",
        "rate": 3.0,
        "requests": 150,
        "prompt": {"dist": "uniform", "low": 20, "high": 300},
        "output": {"dist": "uniform", "low": 1, "high": 120},
    },
    "engine": {"max_batch": 32},
    "speculation": {"drafter": "c05", "k": 3},
}

BY_BATCH = [{"max_batch": 2, "k": 4}, {"max_batch": 6, "k": 2}]

CASES = {
    "fixed": {},
    "fixed heterogeneous": {"speculation": {"drafter": "c20", "k": 4}},
    "iid": {"speculation": {"drafter": "c05", "k": 3, "acceptance": "iid"}},
    "sequences": {
        "speculation": {"drafter": "c20", "k": 4, "temperature": 0.0, "acceptance": "sequences"}
    },
    "ngram": {"speculation": {"drafter": "ngram", "k": 4}},
    "heads": {"speculation": {"drafter": "heads", "k": 2}},
    "k = 0": {"speculation": {"drafter": None, "k": 0}},
    "by batch": {
        "speculation": {"drafter": "c20", "k": 4, "policy": "by_batch", "k_by_batch": BY_BATCH}
    },
    "adaptive": {"speculation": {"drafter": "c05", "k": 4, "policy": "adaptive"}},
    "adaptive ngram": {"speculation": {"drafter": "ngram", "k": 3, "policy": "adaptive"}},
    "adaptive busy": {
        "speculation": {"drafter": "c20", "k": 5, "policy": "adaptive"},
        "workload": {"rate": 25.0},
    },
    "no chunked prefill": {"engine": {"max_batch": 32, "chunked_prefill": False}},
    "padded attention": {"engine": {"max_batch": 32, "padded_attention": True}},
    "small token budget": {"engine": {"max_batch": 32, "max_batched_tokens": 96}},
    "preemption": {
        "engine": {"max_batch": 32, "kv_capacity_tokens": 1800},
        "workload": {"rate": 20.0},
    },
    "preemption, adaptive": {
        "engine": {"max_batch": 32, "kv_capacity_tokens": 1800},
        "workload": {"rate": 20.0},
        "speculation": {"drafter": "c05", "k": 4, "policy": "adaptive"},
    },
    "saturated": {"workload": {"rate": 60.0}},
    "two replicas, least outstanding": {"fleet": {"replicas": 2, "router": "least_outstanding"}},
    "three replicas, random": {
        "fleet": {"replicas": 3, "router": "random"},
        "workload": {"rate": 12.0},
    },
    # Arrivals come far more often than a replica's first finish: stretches run past them
    # and are cut only by those routed to their own replica.
    "eight replicas, least outstanding, low load": {
        "fleet": {"replicas": 8, "router": "least_outstanding"},
        "workload": {"rate": 16.0, "requests": 400},
    },
    "four replicas, cache aware, adaptive": {
        "fleet": {"replicas": 4, "router": "cache_aware"},
        "workload": {"rate": 10.0, "requests": 300},
        "speculation": {"drafter": "c05", "k": 4, "policy": "adaptive"},
    },
    "two replicas, round robin, ngram": {
        "fleet": {"replicas": 2, "router": "round_robin"},
        "speculation": {"drafter": "ngram", "k": 3},
    },
    "two pools": {
        "fleet": {
            "router": "round_robin",
            "pools": [
                {"name": "a", "replicas": 1, "speculation": {"drafter": "c05", "k": 3}},
                {"name": "b", "replicas": 1, "speculation": {"drafter": "ngram", "k": 4}},
            ],
        }
    },
    "closed loop": {
        "workload": {
            "kind": "closed_loop",
            "concurrency": 6,
            "requests": 150,
            "prompt": {"dist": "uniform", "low": 20, "high": 300},
            "output": {"dist": "uniform", "low": 1, "high": 120},
        }
    },
    "closed loop, think time, two replicas": {
        "workload": {
            "kind": "closed_loop",
            "concurrency": 8,
            "requests": 150,
            "think_time_s": 0.2,
            "prompt": {"dist": "uniform", "low": 20, "high": 300},
            "output": {"dist": "uniform", "low": 1, "high": 120},
        },
        "fleet": {"replicas": 2, "router": "least_outstanding"},
    },
    "closed loop, two replicas, adaptive": {
        "workload": {
            "kind": "closed_loop",
            "concurrency": 10,
            "requests": 150,
            "prompt": {"dist": "uniform", "low": 20, "high": 300},
            "output": {"dist": "uniform", "low": 1, "high": 120},
        },
        "fleet": {"replicas": 2, "router": "random"},
        "speculation": {"drafter": "c20", "k": 4, "policy": "adaptive"},
    },
    "bursty": {"workload": {"kind": "bursty", "rate": 6.0, "cv": 3.0}},
}

# Shipped scenarios, shortened so that the pair of runs stays quick.
SHIPPED = sorted(p.name for p in (REPO / "scenarios").glob("*.yaml"))
SHORTER = {"duration_s": 60.0}


# Cases whose replicas would otherwise tie exactly (see the module docstring).
VARYING_ONLY = {"closed loop, two replicas, adaptive", "closed loop, think time, two replicas"}


@pytest.fixture(scope="module")
def varying_profile(tmp_path_factory) -> Path:
    """The test profile with batch-dependent pass costs and a measured-style spread."""
    profile = yaml.safe_load((DATA / "sim_profile.yaml").read_text())
    profile["target"]["latency"]["fit"].update(
        per_batched_token_s=3.0e-5, knee_tokens=48, per_kv_token_s=4.0e-8, per_attention_pair_s=1e-9
    )
    for name in ("c05", "c20"):
        profile["drafters"][name]["latency"]["fit"].update(per_kv_token_s=1.0e-8)
    profile["overhead"] = {"per_step_s": 3.0e-4, "per_sequence_s": 2.0e-6}
    profile["jitter"] = {"quantiles": [0.8, 0.95, 1.0, 1.04, 1.6], "samples": 50}
    profile["prefill_jitter"] = {"quantiles": [0.9, 1.0, 1.1], "samples": 20}
    folder = tmp_path_factory.mktemp("profile")
    (folder / "sim_profile.yaml").write_text(yaml.safe_dump(profile))
    (folder / "sim_sequences.txt").write_text((DATA / "sim_sequences.txt").read_text())
    return folder


def make(changes: dict, folder: Path = DATA) -> Scenario:
    data = copy.deepcopy(BASE)
    for section, values in changes.items():
        data[section] = {**data.get(section, {}), **values}
    return Scenario.model_validate(data).with_source(folder / "scenario.yaml")


def shortened(name: str) -> Scenario:
    scenario = load_scenario(REPO / "scenarios" / name)
    workload = scenario.workload
    if workload.duration_s is not None:
        workload = workload.model_copy(update=SHORTER)
    elif workload.requests is not None and workload.requests > 400:
        workload = workload.model_copy(update={"requests": 400})
    return scenario.model_copy(update={"workload": workload})


def engine_stats(stats) -> dict:
    return {
        "itl": (stats.itl.counts.tobytes(), stats.itl.count, stats.itl.total, stats.itl.max),
        "batch": stats.batch_counts.tobytes(),
        "accepted": stats.accepted_counts.tobytes(),
        "drafted": stats.drafted_counts.tobytes(),
        "iterations": stats.iterations,
        "busy_s": stats.busy_s,
        "kv_token_seconds": stats.kv_token_seconds,
        "kv_max_fraction": stats.kv_max_fraction,
        "window_rows": stats.window_rows,
        "decode_rows": stats.decode_rows,
        "flops": dict(stats.flops),
    }


def no_loops(patch) -> None:
    """Hold the compiled loops off: a replica's iterations then run as Python plans them."""
    from specsim.simulation.compiled_serving import ServingLoop

    patch.setattr(ServingLoop, "build", staticmethod(lambda *args, **kwargs: None))


def observe(scenario: Scenario, path: Path, fast: bool, monkeypatch, loops: bool = True) -> dict:
    """Everything a run produced, at full precision (``loops``: the compiled loops may run)."""
    rows, replicas = [], []
    add, close = RecordSink.add, Replica.close

    def keep_row(self, row):
        rows.append(row)
        add(self, row)

    def keep_replica(self):
        close(self)
        replicas.append(engine_stats(self.stats))

    with monkeypatch.context() as patch:
        patch.setattr(RecordSink, "add", keep_row)
        patch.setattr(Replica, "close", keep_replica)
        if not loops:
            no_loops(patch)
        summary = run_simulation(scenario, records_path=path, fast_path=fast).summary
    return {"csv": path.read_bytes(), "summary": summary, "rows": rows, "replicas": replicas}


def assert_identical(scenario: Scenario, tmp_path: Path, monkeypatch) -> dict:
    """The fast path, as it runs, against the reference."""
    reference = observe(scenario, tmp_path / "reference.csv", False, monkeypatch)
    fast = observe(scenario, tmp_path / "fast.csv", True, monkeypatch)
    assert fast["summary"]["requests"] > 0
    assert fast["rows"] == reference["rows"]
    assert fast["replicas"] == reference["replicas"]
    assert fast["summary"] == reference["summary"]
    assert fast["csv"] == reference["csv"]
    return fast


@pytest.mark.parametrize("name", [name for name in CASES if name not in VARYING_ONLY])
def test_fast_path_matches_the_reference(name, tmp_path, monkeypatch):
    assert_identical(make(CASES[name]), tmp_path, monkeypatch)


@pytest.mark.parametrize("name", list(CASES))
def test_fast_path_matches_the_reference_with_varying_costs_and_jitter(
    name, varying_profile, tmp_path, monkeypatch
):
    assert_identical(make(CASES[name], varying_profile), tmp_path, monkeypatch)


@pytest.mark.parametrize("name", ["fixed", "ngram", "adaptive", "two replicas, least outstanding"])
def test_fast_path_matches_the_reference_with_jitter_off(
    name, varying_profile, tmp_path, monkeypatch
):
    scenario = make(CASES[name], varying_profile)
    engine = scenario.engine.model_copy(update={"jitter": False})
    assert_identical(scenario.model_copy(update={"engine": engine}), tmp_path, monkeypatch)


@pytest.mark.parametrize("name", SHIPPED)
def test_fast_path_matches_the_reference_on_shipped_scenarios(name, tmp_path, monkeypatch):
    assert_identical(shortened(name), tmp_path, monkeypatch)


def test_the_cases_exercise_what_they_name(tmp_path, monkeypatch):
    """The matrix is not vacuous: preemption preempts, the busy runs batch, replicas share."""
    preempted = observe(make(CASES["preemption"]), tmp_path / "p.csv", True, monkeypatch)
    assert preempted["summary"]["preemptions"] > 0
    saturated = observe(make(CASES["saturated"]), tmp_path / "s.csv", True, monkeypatch)
    assert saturated["summary"]["batch_size"]["max"] >= 16
    shared = observe(make(CASES["three replicas, random"]), tmp_path / "r.csv", True, monkeypatch)
    assert len({row[11] for row in shared["rows"]}) == 3
    adaptive = observe(make(CASES["adaptive busy"]), tmp_path / "a.csv", True, monkeypatch)
    counts = np.frombuffer(adaptive["replicas"][0]["drafted"], dtype=np.int64)
    assert np.count_nonzero(counts) >= 3  # the window changed during the run
