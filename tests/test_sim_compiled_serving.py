"""The compiled serving loop (``specsim/simulation/compiled_serving*.py``): a lone replica's
admission, prefill, preemption and decoding in one kernel, for open-loop arrivals and for
closed-loop clients.

Identity with the per-iteration reference (every record, the engine's statistics at full
precision, the summary and requests.csv, with the kernels on and off) where the loop runs:
every drafter class on a profile whose every cost term is non-zero, fixed k, k by batch size
and the adaptive (goodput) policy, preemption, prompts cut into chunks, prompts whose first
token is their last, a horizon, acceptance levels drawn past the first chunk of 4,096, a step
log that folds inside the loop, bursts, an overloaded queue that outgrows what a call packs,
prefill apart (not chunked: prompts whole in iterations of their own), iteration jitter,
padded attention (each also on every cost term, and all three on the validate scenarios less
their profile's valid range), the benchmark's saturated replica on a shipped profile (the
shipped scenarios are in ``test_sim_identity.py``), and prefix-cache hits by request (a
fraction of each prompt, a trace's column), preempted requests readmitted with them, and a
profile's measured range (the run refused, or warned once, where the reference refuses or
warns). Then where it runs (nearly every iteration) and where it does not, and that a request
that never fits is refused as before.
"""

from __future__ import annotations

import copy
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml
from test_sim_compiled_step import every_term  # noqa: F401 (a fixture)
from test_sim_identity import BASE, DATA, assert_identical, make, no_loops, varying_profile  # noqa: F401

from specsim.costs import StepCosts
from specsim.errors import SpecsimError
from specsim.profile import OutOfRangeWarning, load_profile
from specsim.scenario import Scenario, load_scenario
from specsim.simulation import compiled_serving, run_simulation
from specsim.simulation.admission import fitting, never_fits, verify_lookahead
from specsim.simulation.compiled_layout import (
    COUNTS,
    FIELDS,
    NEXT_RID,
    PREFILLED,
    RANGE_BATCH_LO,
    RANGE_NEW_HI,
    STATE,
)
from specsim.simulation.replica import Replica
from specsim.simulation.serving_table import ServingTable
from specsim.tree import TreeShape

REPO = Path(__file__).resolve().parent.parent
CLOSED = {"kind": "closed_loop", "concurrency": 12, "requests": 300, "rate": None}


def closed(workload=None, **sections) -> Scenario:
    return make({"workload": {**CLOSED, **(workload or {})}, **sections})


def kernel_iterations(scenario, monkeypatch, loops: bool = True) -> tuple[int, int, dict]:
    """Iterations the closed-loop kernel ran, the run's engine iterations, and its summary."""
    original = compiled_serving.ServingLoop.run
    ran = [0]

    def counted(self, replica, now):
        end = original(self, replica, now)
        if end is not None:
            ran[0] += int(self.ct[compiled_serving.ITERATIONS])
        return end

    with monkeypatch.context() as patch:
        patch.setattr(compiled_serving.ServingLoop, "run", counted)
        if not loops:
            no_loops(patch)
        summary = run_simulation(scenario).summary
    return ran[0], summary["engine_iterations"], summary


CASES = {
    "fixed": {},
    "heterogeneous levels": {"speculation": {"drafter": "c20", "k": 4}},
    "k = 0": {"speculation": {"drafter": None, "k": 0}},
    "ngram": {"speculation": {"drafter": "ngram", "k": 4}},
    "heads": {"speculation": {"drafter": "heads", "k": 2}},
    "by batch": {
        "speculation": {
            "drafter": "c20",
            "k": 4,
            "policy": "by_batch",
            "k_by_batch": [{"max_batch": 4, "k": 4}, {"max_batch": 10, "k": 2}],
        }
    },
    "adaptive": {"speculation": {"drafter": "c20", "k": 5, "policy": "adaptive"}},
    "adaptive ngram, preemption": {
        "speculation": {"drafter": "ngram", "k": 3, "policy": "adaptive"},
        "engine": {"max_batch": 12, "kv_capacity_tokens": 1500},
    },
    "more clients than slots": {"engine": {"max_batch": 8}},
    "preemption": {"engine": {"max_batch": 12, "kv_capacity_tokens": 1500}},
    "small token budget": {"engine": {"max_batch": 12, "max_batched_tokens": 96}},
    "first token is the last": {"workload": {"output": {"dist": "uniform", "low": 1, "high": 3}}},
    "horizon": {"workload": {"requests": None, "duration_s": 12.0}},
    "prefill apart": {"engine": {"max_batch": 12, "chunked_prefill": False}},
    "prefill apart, small token budget, preemption": {
        "engine": {
            "max_batch": 12,
            "chunked_prefill": False,
            "max_batched_tokens": 300,
            "kv_capacity_tokens": 1500,
        }
    },
    "prefill apart, adaptive, first token is the last": {
        "engine": {"max_batch": 12, "chunked_prefill": False},
        "speculation": {"drafter": "c20", "k": 5, "policy": "adaptive"},
        "workload": {"output": {"dist": "uniform", "low": 1, "high": 6}},
    },
}


OPEN = {
    "open loop, low load": {},
    "open loop, saturated": {"workload": {"rate": 60.0}, "engine": {"max_batch": 16}},
    "open loop, preemption": {
        "workload": {"rate": 20.0},
        "engine": {"max_batch": 16, "kv_capacity_tokens": 1500},
    },
    "open loop, bursts": {"workload": {"kind": "bursty", "rate": 8.0, "cv": 3.0}},
    "open loop, adaptive, saturated": {
        "workload": {"rate": 60.0},
        "engine": {"max_batch": 16},
        "speculation": {"drafter": "c05", "k": 4, "policy": "adaptive"},
    },
    "open loop, adaptive, small token budget": {
        "workload": {"rate": 20.0},
        "engine": {"max_batch": 16, "max_batched_tokens": 96},
        "speculation": {"drafter": "c20", "k": 4, "policy": "adaptive"},
    },
    "open loop, horizon": {"workload": {"requests": None, "duration_s": 30.0, "rate": 8.0}},
    # 4,500 requests: the arrivals come in two chunks, and a call that has taken the first
    # chunk's last one must stop for the next (it may be due before the next iteration).
    # The decoding rows take the whole token budget while prompts wait: no chunk rides.
    "open loop, rows fill the token budget": {
        "workload": {"rate": 12.0, "output": {"dist": "uniform", "low": 1, "high": 40}},
        "engine": {"max_batch": 10, "max_batched_tokens": 40},
    },
    "open loop, a second chunk of arrivals": {
        "workload": {
            "rate": 40.0,
            "requests": 4500,
            "prompt": {"dist": "uniform", "low": 8, "high": 60},
            "output": {"dist": "uniform", "low": 1, "high": 10},
        }
    },
    "open loop, prefill apart, preemption": {
        "workload": {"rate": 20.0},
        "engine": {"max_batch": 16, "kv_capacity_tokens": 1500, "chunked_prefill": False},
    },
    "open loop, k by batch": {
        "workload": {"rate": 20.0},
        "speculation": {
            "drafter": "c20",
            "k": 4,
            "policy": "by_batch",
            "k_by_batch": [{"max_batch": 4, "k": 4}, {"max_batch": 10, "k": 2}],
        },
    },
}


@pytest.mark.parametrize("name", list(OPEN))
def test_the_loop_matches_the_reference_on_an_open_loop(name, tmp_path, monkeypatch):
    scenario = make(OPEN[name])
    inside, total, _ = kernel_iterations(scenario, monkeypatch)
    assert inside >= 0.8 * total
    assert_identical(scenario, tmp_path, monkeypatch)


def test_an_overloaded_queue_leaves_the_loop_and_comes_back(tmp_path, monkeypatch):
    """Arrivals far beyond what 4 slots serve: past ``MOST_IN_FLIGHT`` requests in flight the
    replica leaves the loop (each call packs them all), and takes it again as the queue drains,
    with the reference's results throughout."""
    scenario = make(
        {
            "workload": {
                "rate": 2000.0,
                "requests": 5000,
                "output": {"dist": "uniform", "low": 1, "high": 16},
            },
            "engine": {"max_batch": 4},
        }
    )
    inside, total, summary = kernel_iterations(scenario, monkeypatch)
    assert 0.1 * total < inside < 0.9 * total
    assert summary["requests"] == 5000
    assert_identical(scenario, tmp_path, monkeypatch)


@pytest.mark.parametrize("name", list(CASES))
def test_the_loop_matches_the_reference(name, tmp_path, monkeypatch):
    changes = dict(CASES[name])
    scenario = closed(changes.pop("workload", None), **changes)
    inside, total, _ = kernel_iterations(scenario, monkeypatch)
    assert inside >= 0.5 * total
    assert_identical(scenario, tmp_path, monkeypatch)


@pytest.mark.parametrize(
    "drafter, k, policy",
    [(None, 0, "fixed"), ("model", 4, "fixed"), ("lookup", 3, "fixed"), ("medusa fit", 3, "fixed"),
     ("eagle", 4, "fixed"), ("eagle fit", 2, "fixed"), ("model", 4, "by_batch"),
     ("model", 5, "adaptive"), ("lookup fit", 4, "adaptive"), ("eagle fit", 3, "adaptive")],
)  # fmt: skip
def test_the_loop_matches_the_reference_on_every_cost_term(
    drafter,
    k,
    policy,
    every_term,  # noqa: F811 (the fixture, imported above)
    tmp_path,
    monkeypatch,
):
    speculation = {"drafter": drafter, "k": k, "policy": policy}
    if policy == "by_batch":
        speculation["k_by_batch"] = [{"max_batch": 3, "k": 4}, {"max_batch": 8, "k": 2}]
    scenario = make({"workload": CLOSED, "speculation": speculation}, every_term)
    engine = scenario.engine.model_copy(update={"jitter": False})
    scenario = scenario.model_copy(update={"engine": engine})
    assert kernel_iterations(scenario, monkeypatch)[0] > 0
    assert_identical(scenario, tmp_path, monkeypatch)


# On the varying profile (``test_sim_identity.varying_profile``): decode and prefill-only
# iterations take multipliers of different spreads from the replica's jitter stream, and a
# pass's cost grows with its tokens and context (as padded attention charges them).
JITTER = {
    "jitter": {"workload": CLOSED},
    "jitter, prefill apart": {
        "workload": CLOSED,
        "engine": {"max_batch": 12, "chunked_prefill": False},
    },
    "jitter, adaptive, preemption": {
        "workload": CLOSED,
        "engine": {"max_batch": 12, "kv_capacity_tokens": 1500},
        "speculation": {"drafter": "c20", "k": 5, "policy": "adaptive"},
    },
    "jitter, open loop, prefill apart, saturated": {
        "workload": {"rate": 60.0},
        "engine": {"max_batch": 16, "chunked_prefill": False},
    },
    "jitter, open loop, small token budget": {
        "workload": {"rate": 20.0},
        "engine": {"max_batch": 16, "max_batched_tokens": 96},
    },
    "padded": {"workload": CLOSED, "engine": {"max_batch": 12, "padded_attention": True}},
    "padded, prefill apart, preemption": {
        "workload": CLOSED,
        "engine": {
            "max_batch": 12,
            "padded_attention": True,
            "chunked_prefill": False,
            "kv_capacity_tokens": 1500,
        },
    },
    "padded, open loop, adaptive, small token budget": {
        "workload": {"rate": 20.0},
        "engine": {"max_batch": 16, "max_batched_tokens": 96, "padded_attention": True},
        "speculation": {"drafter": "c20", "k": 4, "policy": "adaptive"},
    },
    "padded, open loop, prefill apart, saturated": {
        "workload": {"rate": 60.0},
        "engine": {"max_batch": 16, "chunked_prefill": False, "padded_attention": True},
    },
}


@pytest.mark.parametrize("name", list(JITTER))
def test_the_loop_matches_the_reference_with_jitter(
    name,
    varying_profile,  # noqa: F811 (the fixture, imported above)
    tmp_path,
    monkeypatch,
):
    scenario = make(JITTER[name], varying_profile)
    assert scenario.engine.jitter
    inside, total, _ = kernel_iterations(scenario, monkeypatch)
    assert inside >= 0.5 * total
    assert_identical(scenario, tmp_path, monkeypatch)


@pytest.mark.parametrize(
    "drafter, k, policy", [("model", 4, "fixed"), ("eagle fit", 3, "adaptive"), (None, 0, "fixed")]
)
@pytest.mark.parametrize("engine", [{"chunked_prefill": False}, {"padded_attention": True}])
def test_prefill_apart_and_padding_on_every_cost_term(
    drafter,
    k,
    policy,
    engine,
    every_term,  # noqa: F811 (the fixture, imported above)
    tmp_path,
    monkeypatch,
):
    """The prefill overhead terms and a drafter that builds its own cache over the prompts
    (``model``) priced on prompts whole, and padded passes, as the reference prices them."""
    speculation = {"drafter": drafter, "k": k, "policy": policy}
    scenario = make({"workload": CLOSED, "speculation": speculation, "engine": engine}, every_term)
    assert kernel_iterations(scenario, monkeypatch)[0] > 0
    assert_identical(scenario, tmp_path, monkeypatch)


@pytest.fixture(scope="module")
def unranged(tmp_path_factory) -> Path:
    """The validate scenarios' folder layout with the built-in profile less its valid ranges
    (the kernel leaves a profile that checks its range to Python)."""
    folder = tmp_path_factory.mktemp("unranged")
    (folder / "profiles").mkdir()
    (folder / "scenarios").mkdir()
    for path in (REPO / "profiles").glob("builtin-cpu.*.txt"):
        (folder / "profiles" / path.name).write_text(path.read_text())
    profile = yaml.safe_load((REPO / "profiles" / "builtin-cpu.yaml").read_text())
    for model in [profile["target"], *profile["drafters"].values()]:
        model.get("latency", {}).pop("valid_range", None)
    (folder / "profiles" / "builtin-cpu.yaml").write_text(yaml.safe_dump(profile))
    for path in (REPO / "scenarios").glob("validate-*.yaml"):
        (folder / "scenarios" / path.name).write_text(path.read_text())
    return folder / "scenarios"


@pytest.mark.parametrize("name", ["validate-b8-tiny-k4", "validate-b8-small-k2", "validate-b8-k0"])
def test_the_validate_scenarios_less_the_range_run_on_the_kernel(
    name, unranged, tmp_path, monkeypatch
):
    """Prefill apart, padded attention and jitter together: the kernel runs nearly all."""
    scenario = load_scenario(unranged / f"{name}.yaml")
    engine = scenario.engine
    assert engine.jitter and engine.padded_attention and not engine.chunked_prefill
    inside, total, _ = kernel_iterations(scenario, monkeypatch)
    assert inside >= 0.9 * total
    assert_identical(scenario, tmp_path, monkeypatch)


def test_levels_drawn_past_the_first_chunk_and_a_folding_step_log(tmp_path, monkeypatch):
    """4,500 short requests: admission needs a second chunk of 4,096 acceptance levels (drawn
    by Python where the reference draws it, from the same stream position), and the step log's
    buffers fold several times inside the loop."""
    scenario = closed(
        {
            "concurrency": 6,
            "requests": 4500,
            "prompt": {"dist": "uniform", "low": 8, "high": 40},
            "output": {"dist": "uniform", "low": 1, "high": 12},
        },
        speculation={"drafter": "c20", "k": 4},
        engine={"max_batch": 4},
    )
    inside, total, _ = kernel_iterations(scenario, monkeypatch)
    assert inside >= 0.9 * total and total > 3 * 1024
    assert_identical(scenario, tmp_path, monkeypatch)


def bench_scenario(kind: str) -> Scenario:
    """``bench_simulator.py``'s scenarios on a shipped 8B profile, shortened: its saturated
    replica (80 clients, 64 slots), with k = 4 or the adaptive policy, and a busy open loop
    (40 requests/s into 64 slots) with the adaptive policy. On this profile prompt chunks move
    the goodput policy's choice (on the tests' small profile they seldom do)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import bench_simulator
    finally:
        sys.path.pop(0)
    if kind == "busy open loop, adaptive":
        data = bench_simulator.low_load_data("adaptive")
        data["workload"] = {**data["workload"], "rate": 40.0, "requests": 600}
        data["engine"] = {"max_batch": 64}
    else:
        data = bench_simulator.scenario_data(600)
        if kind == "saturated, adaptive":
            data["speculation"] = {"drafter": "llama3.2-1b", "k": 5, "policy": "adaptive"}
    return Scenario.model_validate(data)


@pytest.mark.parametrize("kind", ["saturated", "saturated, adaptive", "busy open loop, adaptive"])
def test_the_benchmarks_scenarios(kind, tmp_path, monkeypatch):
    """The kernel runs nearly all of each, with the reference's results."""
    scenario = bench_scenario(kind)
    inside, total, _ = kernel_iterations(scenario, monkeypatch)
    assert inside >= 0.95 * total
    assert_identical(scenario, tmp_path, monkeypatch)


HALF = {"source": "fraction", "fraction": 0.5, "hit_rate": 0.5}
PREFIXES = {
    "closed loop": {"workload": {**CLOSED, "prefix": HALF}},
    "closed loop, preemption": {
        "workload": {**CLOSED, "prefix": HALF},
        "engine": {"max_batch": 12, "kv_capacity_tokens": 1500},
    },
    "closed loop, adaptive, small token budget": {
        "workload": {**CLOSED, "prefix": HALF},
        "engine": {"max_batch": 12, "max_batched_tokens": 96},
        "speculation": {"drafter": "c20", "k": 4, "policy": "adaptive"},
    },
    # Every hit is the whole prompt less its last token: one-token prompts in prefill.
    "open loop, whole prompts, preemption": {
        "workload": {"rate": 20.0, "prefix": {"source": "fraction", "fraction": 1.0}},
        "engine": {"max_batch": 16, "kv_capacity_tokens": 1500},
    },
    # 4,500 requests: their hits come from two chunks of the prefix stream's uniforms.
    "open loop, a second chunk of draws": {
        "workload": {
            "rate": 40.0,
            "requests": 4500,
            "prompt": {"dist": "uniform", "low": 8, "high": 60},
            "output": {"dist": "uniform", "low": 1, "high": 10},
            "prefix": {"source": "fraction", "fraction": 0.7, "hit_rate": 0.6},
        }
    },
}


def assert_hits_identical(scenario, tmp_path, monkeypatch, share: float = 0.5) -> None:
    """The kernel runs ``share`` of the iterations or more, with the reference's results (the
    prefix cache's totals among them, some hit)."""
    inside, total, summary = kernel_iterations(scenario, monkeypatch)
    assert inside >= share * total
    assert summary["prefix_cache"]["cached_tokens"] > 0
    assert assert_identical(scenario, tmp_path, monkeypatch)["summary"] == summary


@pytest.mark.parametrize("name", list(PREFIXES))
def test_prefix_hits_in_the_loop_match_the_reference(name, tmp_path, monkeypatch):
    assert_hits_identical(make(PREFIXES[name]), tmp_path, monkeypatch)


def trace_scenario(tmp_path, source: str) -> Scenario:
    """300 requests of a trace with a column of cached tokens (some beyond the prompt) and one
    of sessions, the prefix taken from ``source``."""
    rng = np.random.default_rng(8)
    times = np.cumsum(rng.exponential(0.05, 300))
    prompts, outputs = rng.integers(20, 400, 300), rng.integers(1, 80, 300)
    cached = rng.integers(0, 450, 300) * (rng.random(300) < 0.6)
    sessions = rng.integers(0, 40, 300)
    path = tmp_path / "trace.csv"
    columns = zip(times, prompts, outputs, cached, sessions, strict=True)
    lines = [f"{t:.4f},{p},{o},{c},{s}" for t, p, o, c, s in columns]
    header = "arrived_at,num_prefill_tokens,num_decode_tokens,cached_tokens,session_id"
    path.write_text("\n".join([header, *lines]) + "\n")
    workload = {"kind": "trace", "trace": str(path), "prefix": {"source": source}}
    data = {**copy.deepcopy(BASE), "workload": workload}
    data["engine"] = {"max_batch": 16, "kv_capacity_tokens": 2000}
    return Scenario.model_validate(data).with_source(DATA / "scenario.yaml")


def test_a_traces_column_of_hits_in_the_loop_matches_the_reference(tmp_path, monkeypatch):
    assert_hits_identical(trace_scenario(tmp_path, "column"), tmp_path, monkeypatch)


def test_hits_drawn_for_the_wrong_requests_fail(tmp_path, monkeypatch):
    """The identity above catches hits drawn one request number off (a planted fault)."""
    scenario = make(PREFIXES["closed loop"])
    original = ServingTable._hits

    def shifted(self, prompts):
        self.ct[NEXT_RID] += 1
        hits = original(self, prompts)
        self.ct[NEXT_RID] -= 1
        return hits

    monkeypatch.setattr(ServingTable, "_hits", shifted)
    with pytest.raises(AssertionError):
        assert_identical(scenario, tmp_path, monkeypatch)


def test_the_loop_stays_out_of_session_memory(tmp_path, monkeypatch):
    """A session's hit depends on what the replica served before: Python keeps its memory."""
    inside, total, summary = kernel_iterations(trace_scenario(tmp_path, "session"), monkeypatch)
    assert inside == 0 and total > 0 and summary["prefix_cache"]["cached_tokens"] > 0


def test_the_loop_is_off_without_the_kernels(monkeypatch):
    inside, total, summary = kernel_iterations(closed(), monkeypatch, loops=False)
    assert inside == 0 and total > 0
    assert kernel_iterations(closed(), monkeypatch)[2] == summary


@pytest.mark.parametrize("kind", ["open loop", "closed loop"])
def test_a_request_that_never_fits_is_refused_as_before(kind, monkeypatch):
    """The loop takes only lengths that fit; the first that does not is issued by Python, and
    refused with the reference's error (on the open loop, after the loop has run a while)."""
    engine = {"max_batch": 12, "kv_capacity_tokens": 1000}
    if kind == "open loop":
        workload = {
            "rate": 8.0,
            "requests": 400,
            "prompt": {"dist": "uniform", "low": 20, "high": 980},
        }
        scenario = make({"workload": workload, "engine": engine})
    else:
        scenario = closed({"prompt": {"dist": "uniform", "low": 20, "high": 1200}}, engine=engine)
    ran = [0]
    original = compiled_serving.ServingLoop.run

    def counted(self, replica, now):
        end = original(self, replica, now)
        ran[0] += int(self.ct[compiled_serving.ITERATIONS])
        return end

    errors = []
    for fast, loops in ((False, True), (True, True), (True, False)):
        with monkeypatch.context() as patch, pytest.raises(SpecsimError) as caught:
            patch.setattr(compiled_serving.ServingLoop, "run", counted)
            if not loops:
                no_loops(patch)
            run_simulation(scenario, fast_path=fast)
        errors.append(str(caught.value))
    assert errors[0] == errors[1] == errors[2]
    assert "KV-cache tokens" in errors[0]
    if kind == "open loop":  # (a closed loop's first requests are refused as they start)
        assert ran[0] > 0


def test_fitting_counts_the_requests_before_the_first_that_never_fits():
    """``admission.fitting`` (the loop's) against ``never_fits`` (the replica's refusal), one
    request at a time, on 2,000 random lengths around the cache's size."""
    rng = np.random.default_rng(4)
    prompts = rng.integers(1, 900, 2000).astype(float)
    outputs = rng.integers(1, 200, 2000).astype(float)
    for capacity in (1000, 1050, 1200):
        first = next(
            (i for i, (p, o) in enumerate(zip(prompts, outputs, strict=True))
             if never_fits(int(p), int(o), 5, capacity, None)),
            len(prompts),
        )  # fmt: skip
        assert fitting(prompts, outputs, 5, capacity) == first
    assert fitting(prompts[:10], outputs[:10], 5, 10**6) == 10


def ranged(folder: Path, outside: str, target: dict, drafter: dict | None = None) -> Path:
    """The test profile in ``folder`` with a measured range on the target and, where given, on
    drafter c05 (a draft model, with a cache of its own: its range is checked too); each range
    is ``target``'s or ``drafter``'s changes to one that every run here stays within."""
    profile = yaml.safe_load((DATA / "sim_profile.yaml").read_text())
    wide = {"batch": [1, 64], "context": [0, 100_000], "new_tokens": [1, 8192]}
    latencies = [(profile["target"]["latency"], target)]
    if drafter is not None:
        latencies.append((profile["drafters"]["c05"]["latency"], drafter))
    for latency, changes in latencies:
        latency.update(valid_range={**wide, **changes}, outside_range=outside)
    folder.mkdir(exist_ok=True)
    (folder / "sim_profile.yaml").write_text(yaml.safe_dump(profile))
    (folder / "sim_sequences.txt").write_text((DATA / "sim_sequences.txt").read_text())
    return folder


def test_the_loop_runs_within_a_measured_range(tmp_path, monkeypatch):
    """A range no iteration leaves: the kernel runs the run, checking each iteration."""
    scenario = make(PREFIXES["closed loop, preemption"], ranged(tmp_path / "p", "error", {}, {}))
    inside, total, _ = kernel_iterations(scenario, monkeypatch)
    assert inside >= 0.9 * total
    assert_identical(scenario, tmp_path, monkeypatch)


# Ranges that some iteration leaves part-way through a closed loop (``ran``: after the kernel
# ran some): a target's or a drafter's context, a batch below the range's (the last request
# alone), a prompt chunk above its new tokens.
OUTSIDE = {
    "target's context": ({"context": [0, 330]}, None, True),
    "drafter's context": ({}, {"context": [0, 330]}, True),
    "batch": ({"batch": [2, 64]}, None, True),
    "new tokens": ({"new_tokens": [1, 200]}, None, False),
}


@pytest.mark.parametrize("name", list(OUTSIDE))
def test_an_iteration_outside_the_range_is_refused_as_before(name, tmp_path, monkeypatch):
    target, drafter, ran = OUTSIDE[name]
    scenario = make({"workload": CLOSED}, ranged(tmp_path / "p", "error", target, drafter))
    counted, inside = compiled_serving.ServingLoop.run, [0]

    def count(self, replica, now):
        end = counted(self, replica, now)
        inside[0] += int(self.ct[compiled_serving.ITERATIONS])
        return end

    errors = []
    for fast, loops in ((False, True), (True, True), (True, False)):
        with monkeypatch.context() as patch, pytest.raises(SpecsimError) as caught:
            patch.setattr(compiled_serving.ServingLoop, "run", count)
            if not loops:
                no_loops(patch)
            run_simulation(scenario, fast_path=fast)
        errors.append(str(caught.value))
    assert errors[0] == errors[1] == errors[2]
    assert "outside the measured range" in errors[0]
    assert inside[0] > 0 or not ran


@pytest.mark.filterwarnings("ignore::specsim.profile.OutOfRangeWarning")
def test_an_iteration_outside_the_range_warns_once_as_before(tmp_path, monkeypatch):
    """Extrapolating: the kernel hands the first iteration outside to Python, which warns (once
    per model), and takes the rest, the warning given; the reference's results throughout."""
    profile = ranged(tmp_path / "p", "extrapolate", {"context": [0, 330]}, {"context": [0, 300]})
    scenario = make({"workload": CLOSED}, profile)
    said = []
    for fast in (False, True):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            run_simulation(scenario, fast_path=fast)
        said.append([str(w.message) for w in caught if w.category is OutOfRangeWarning])
    assert len(said[0]) == 2 and said[0] == said[1]
    inside, total, _ = kernel_iterations(scenario, monkeypatch)
    assert inside >= 0.5 * total
    assert_identical(scenario, tmp_path, monkeypatch)


@pytest.mark.parametrize("tree", [None, "2,1"])
@pytest.mark.parametrize("fewest", [1, 2])
def test_the_kernels_range_rule_is_the_replicas(fewest, tree, tmp_path):
    """``in_range`` on ``StepCosts.range_limits`` against ``Replica._check_ranges`` (which
    raises where the kernel must stop) on 3,000 random iterations: decoding rows among empty
    slots, prompt chunks after cached tokens, against every side of a target's and a drafter's
    range (``fewest``: the target's fewest new tokens), for chain steps and for a tree's (k its
    depth, 2; its rows verify up to 5 positions, beyond the range's 4)."""
    target = {"batch": [2, 9], "context": [0, 300], "new_tokens": [fewest, 4]}
    profile = ranged(tmp_path, "error", target, {"context": [0, 280]})
    shape = None if tree is None else TreeShape.parse(tree)
    costs = StepCosts(load_profile(profile / "sim_profile.yaml"), "c05", shape)
    terms = np.array(costs.terms)
    st = np.zeros(STATE)
    st[RANGE_BATCH_LO : RANGE_NEW_HI + 1] = costs.range_limits()
    ct = np.zeros(COUNTS, dtype=np.int64)
    in_range = compiled_serving._serving_kernel().in_range
    widest_row = compiled_serving._serving_kernel().widest_row
    rng = np.random.default_rng(6)
    passed = 0
    for _ in range(3000):
        rows, k, p_rows = int(rng.integers(0, 8)), int(rng.integers(0, 5)), int(rng.integers(0, 4))
        k = k if shape is None else shape.depth
        rows *= rng.random() < 0.6  # prompt chunks alone, often
        p_rows += rows == 0  # an iteration runs something
        used = rows + int(rng.integers(0, 3))
        context = np.zeros(16)
        context[rng.choice(used, rows, replace=False)] = rng.integers(1, 300, rows)
        req = np.zeros((p_rows, FIELDS))
        req[:, PREFILLED] = rng.integers(0, 300, p_rows)
        chunk = rng.integers(1, 7, p_rows).astype(float)
        lookahead = verify_lookahead(k, costs.tree_rows)
        replica = SimpleNamespace(
            context=context, tree_rows=costs.tree_rows, lookahead=lookahead, costs=costs
        )
        cached = req[:, PREFILLED]
        chunks = [(SimpleNamespace(prefilled=p), c) for p, c in zip(cached, chunk, strict=True)]
        try:
            Replica._check_ranges(replica, rows, k, chunks)
            silent = True
        except SpecsimError:
            silent = False
        prefilling = np.arange(p_rows, dtype=np.int64)
        widest = widest_row(terms, k)
        assert (
            in_range(req, prefilling, rows, widest, p_rows, chunk, context, used, st, ct) == silent
        )
        passed += silent
    assert 100 < passed < 2900
