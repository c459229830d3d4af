"""The compiled serving loop for replicas behind a router (``specsim/simulation/
fleet_serving.py``): a call runs a replica up to its first finish, is applied when its last
iteration ends, and is cut back (replayed from its starting state) to the iterations that
started before a request routed to the replica meanwhile.

Identity with the per-iteration reference (every record, each replica's engine statistics,
the summary and requests.csv, with the kernels on and off, ``test_sim_identity.assert_identical``)
for round robin and least outstanding, two and eight replicas, open-loop arrivals, closed-loop
clients through the API server's delay with and without think time, a client cap, and a
saturated fleet with a queue and preemption, prefill apart (not chunked), padded attention,
iteration jitter, prefix-cache hits by request, a profile's measured range (warned once, or
the run refused, as the reference does); the kernel runs most iterations of each. Planted
faults (a cut that keeps the iterations after the arrival; a closed loop's steady window that
ignores a call under way) fail them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from test_sim_compiled_serving import ranged
from test_sim_identity import DATA, assert_identical, make, observe, varying_profile  # noqa: F401

from specsim.errors import SpecsimError
from specsim.simulation import fleet_serving, run_simulation
from specsim.simulation.compiled_layout import ITERATIONS, OPEN_UNTIL

CLOSED = {"kind": "closed_loop", "concurrency": 10, "requests": 300, "rate": None}
SATURATED = {"engine": {"max_batch": 16, "kv_capacity_tokens": 1500}}

FLEETS = {
    "two replicas, round robin": {"fleet": {"replicas": 2, "router": "round_robin"}},
    "two replicas, least outstanding, adaptive": {
        "fleet": {"replicas": 2, "router": "least_outstanding"},
        "speculation": {"drafter": "c05", "k": 4, "policy": "adaptive"},
    },
    "eight replicas, least outstanding": {
        "fleet": {"replicas": 8, "router": "least_outstanding"},
        "workload": {"rate": 16.0, "requests": 400},
    },
    "eight replicas, round robin, ngram": {
        "fleet": {"replicas": 8, "router": "round_robin"},
        "workload": {"rate": 16.0, "requests": 400},
        "speculation": {"drafter": "ngram", "k": 3},
    },
    "two replicas, saturated, preemption": {
        **SATURATED,
        "fleet": {"replicas": 2, "router": "least_outstanding"},
        "workload": {"rate": 40.0, "requests": 400},
    },
    "closed loop, two replicas": {
        "fleet": {"replicas": 2, "router": "least_outstanding"},
        "workload": CLOSED,
    },
    "closed loop, eight replicas, think time": {
        "fleet": {"replicas": 8, "router": "round_robin"},
        "workload": {**CLOSED, "concurrency": 24, "think_time_s": 0.3},
    },
    "closed loop, one replica, think time": {"workload": {**CLOSED, "think_time_s": 0.2}},
    "two replicas, overloaded, the table fills": {
        "fleet": {"replicas": 2, "router": "round_robin"},
        "engine": {"max_batch": 4},
        "workload": {"rate": 60.0, "requests": 400},
    },
    "client cap, two replicas": {
        "fleet": {"replicas": 2, "router": "least_outstanding"},
        "workload": {"rate": 12.0, "max_concurrency": 6},
    },
    "two replicas, prefill apart, saturated": {
        "engine": {"max_batch": 16, "kv_capacity_tokens": 1500, "chunked_prefill": False},
        "fleet": {"replicas": 2, "router": "least_outstanding"},
        "workload": {"rate": 40.0, "requests": 400},
    },
    "two replicas, padded, prefill apart": {
        "engine": {"max_batch": 16, "chunked_prefill": False, "padded_attention": True},
        "fleet": {"replicas": 2, "router": "round_robin"},
        "workload": {"rate": 20.0, "requests": 400},
    },
    "closed loop, two replicas, prefill apart": {
        "engine": {"max_batch": 32, "chunked_prefill": False},
        "fleet": {"replicas": 2, "router": "round_robin"},
        "workload": CLOSED,
    },
}


@pytest.fixture(scope="module")
def delayed_profile(tmp_path_factory) -> Path:
    """The test profile with passes that cost more with tokens and context (so that replicas'
    iterations do not end on the same float times) and an API server's delay per request."""
    profile = yaml.safe_load((DATA / "sim_profile.yaml").read_text())
    profile["target"]["latency"]["fit"].update(
        per_batched_token_s=3.0e-5, knee_tokens=48, per_kv_token_s=4.0e-8, per_attention_pair_s=1e-9
    )
    profile["overhead"] = {"per_step_s": 3.0e-4, "per_sequence_s": 2.0e-6, "per_request_s": 0.02}
    folder = tmp_path_factory.mktemp("profile")
    (folder / "sim_profile.yaml").write_text(yaml.safe_dump(profile))
    (folder / "sim_sequences.txt").write_text((DATA / "sim_sequences.txt").read_text())
    return folder


def kernel_share(scenario, tmp_path, monkeypatch) -> float:
    """The share of the run's engine iterations that fleet replicas ran in the kernel."""
    original = fleet_serving.FleetServing._settle
    ran = [0]

    def counted(self, replica):
        ran[0] += int(self.ct[ITERATIONS])
        original(self, replica)

    with monkeypatch.context() as patch:
        patch.setattr(fleet_serving.FleetServing, "_settle", counted)
        run = observe(scenario, tmp_path / "share.csv", True, monkeypatch)
    return ran[0] / run["summary"]["engine_iterations"]


@pytest.mark.parametrize("name", list(FLEETS))
def test_fleet_replicas_run_on_the_kernel_as_the_reference(
    name, delayed_profile, tmp_path, monkeypatch
):
    scenario = make(FLEETS[name], delayed_profile)
    assert kernel_share(scenario, tmp_path, monkeypatch) >= 0.8
    assert_identical(scenario, tmp_path, monkeypatch)


HALF = {"source": "fraction", "fraction": 0.5, "hit_rate": 0.5}
PREFIXES = {
    "two replicas, preemption": {
        **SATURATED,
        "fleet": {"replicas": 2, "router": "least_outstanding"},
        "workload": {"rate": 40.0, "requests": 400, "prefix": HALF},
    },
    "closed loop, four replicas, think time": {
        "fleet": {"replicas": 4, "router": "round_robin"},
        "workload": {**CLOSED, "concurrency": 16, "think_time_s": 0.3, "prefix": HALF},
    },
}


@pytest.mark.parametrize("name", list(PREFIXES))
def test_fleet_replicas_take_prefix_hits_in_the_kernel(
    name, delayed_profile, tmp_path, monkeypatch
):
    """Each request's hit (a fraction of its prompt, by request number) wherever it is routed,
    with the reference's prefix-cache totals."""
    scenario = make(PREFIXES[name], delayed_profile)
    assert kernel_share(scenario, tmp_path, monkeypatch) >= 0.8
    fast = assert_identical(scenario, tmp_path, monkeypatch)
    assert fast["summary"]["prefix_cache"]["cached_tokens"] > 0


@pytest.mark.parametrize("name", ["two replicas, round robin", "eight replicas, least outstanding"])
def test_on_the_plain_test_profile_too(name, tmp_path, monkeypatch):
    scenario = make(FLEETS[name])
    assert kernel_share(scenario, tmp_path, monkeypatch) >= 0.8
    assert_identical(scenario, tmp_path, monkeypatch)


@pytest.mark.parametrize(
    "name",
    [
        "two replicas, least outstanding, adaptive",
        "two replicas, prefill apart, saturated",
        "closed loop, two replicas, prefill apart",
        "two replicas, padded, prefill apart",
        "eight replicas, least outstanding",
    ],
)
def test_with_jitter(name, varying_profile, tmp_path, monkeypatch):  # noqa: F811 (a fixture)
    """Each call's iterations take the replica's next multipliers; a cut call keeps those of
    the iterations it applies."""
    scenario = make(FLEETS[name], varying_profile)
    assert kernel_share(scenario, tmp_path, monkeypatch) >= 0.8
    assert_identical(scenario, tmp_path, monkeypatch)


def differs(scenario, tmp_path, monkeypatch) -> bool:
    fast = observe(scenario, tmp_path / "fast.csv", True, monkeypatch)
    reference = observe(scenario, tmp_path / "reference.csv", False, monkeypatch)
    return fast["csv"] != reference["csv"] or fast["summary"] != reference["summary"]


def test_a_cut_that_keeps_the_iterations_after_the_arrival_fails(
    delayed_profile, tmp_path, monkeypatch
):
    scenario = make(FLEETS["eight replicas, least outstanding"], delayed_profile)
    assert not differs(scenario, tmp_path, monkeypatch)
    monkeypatch.setattr(fleet_serving.FleetServing, "_started_before", lambda self, now: self.ran)
    assert differs(scenario, tmp_path, monkeypatch)


def test_a_steady_window_that_ignores_a_call_under_way_fails(
    delayed_profile, tmp_path, monkeypatch
):
    scenario = make(FLEETS["closed loop, eight replicas, think time"], delayed_profile)
    assert not differs(scenario, tmp_path, monkeypatch)
    monkeypatch.setattr(
        fleet_serving.FleetServing, "emitted_at", lambda self, now: self.replica.emitted_tokens
    )
    assert differs(scenario, tmp_path, monkeypatch)


# Fleets whose replicas' queues wait: on a full batch, and on a cache too small for the next.
QUEUED = {
    "a full batch": {
        "fleet": {"replicas": 4, "router": "round_robin"},
        "engine": {"max_batch": 4},
        "workload": {"rate": 40.0, "requests": 400},
    },
    "a full cache": {
        "fleet": {"replicas": 3, "router": "round_robin"},
        "engine": {"max_batch": 16, "kv_capacity_tokens": 1200},
        "workload": {"rate": 40.0, "requests": 400},
    },
}


def uncut(scenario, tmp_path, monkeypatch) -> tuple[int, int]:
    """How many requests were routed to a replica while an iteration of its call that starts
    after them was still to come, and how many of those queued behind it without a cut."""
    original = fleet_serving.FleetServing._cut_by
    counts = [0, 0]

    def counted(self, now):
        cut = original(self, now)
        if now < self._iteration_start(self.ran - 1):
            counts[0] += 1
            counts[1] += not cut
        return cut

    with monkeypatch.context() as patch:
        patch.setattr(fleet_serving.FleetServing, "_cut_by", counted)
        observe(scenario, tmp_path / "uncut.csv", True, monkeypatch)
    return counts[0], counts[1]


@pytest.mark.parametrize("name", list(QUEUED))
def test_a_request_behind_a_blocked_queue_waits_without_a_cut(
    name, delayed_profile, tmp_path, monkeypatch
):
    scenario = make(QUEUED[name], delayed_profile)
    later, waited = uncut(scenario, tmp_path, monkeypatch)
    assert waited >= 0.2 * later > 0
    assert kernel_share(scenario, tmp_path, monkeypatch) >= 0.8
    assert_identical(scenario, tmp_path, monkeypatch)


def test_a_wait_that_skips_the_first_iteration_to_see_the_request_fails(
    delayed_profile, tmp_path, monkeypatch
):
    scenario = make(QUEUED["a full cache"], delayed_profile)
    assert not differs(scenario, tmp_path, monkeypatch)

    def one_late(self, now):  # the first iteration to see the request taken as blocked
        if now >= self._iteration_start(self.ran - 1):
            return False
        return self._started_before(now) + 1 < self.ct[OPEN_UNTIL]

    monkeypatch.setattr(fleet_serving.FleetServing, "_cut_by", one_late)
    assert differs(scenario, tmp_path, monkeypatch)


@pytest.mark.filterwarnings("ignore::specsim.profile.OutOfRangeWarning")
@pytest.mark.parametrize("outside", ["extrapolate", "error"])
def test_fleet_replicas_keep_to_the_measured_range(outside, tmp_path, monkeypatch):
    """A target's context range that iterations leave part-way: each replica's kernel hands
    such an iteration to Python, which warns (then the kernels go on) or refuses the run, as
    the reference does."""
    profile = ranged(tmp_path / "p", outside, {"context": [0, 380]})
    scenario = make(FLEETS["two replicas, round robin"], profile)
    if outside == "extrapolate":
        assert kernel_share(scenario, tmp_path, monkeypatch) >= 0.5
        assert_identical(scenario, tmp_path, monkeypatch)
        return
    original, ran = fleet_serving.FleetServing._settle, [0]

    def counted(self, replica):
        ran[0] += int(self.ct[ITERATIONS])
        original(self, replica)

    errors = []
    for fast in (False, True):
        with monkeypatch.context() as patch, pytest.raises(SpecsimError) as caught:
            patch.setattr(fleet_serving.FleetServing, "_settle", counted)
            run_simulation(scenario, fast_path=fast)
        errors.append(str(caught.value))
    assert errors[0] == errors[1] and "outside the measured range" in errors[0]
    assert ran[0] > 0
