"""The engine's low-load fast paths change speed, never results.

- The replica runs its per-row arithmetic on the occupied prefix of its batch arrays (slots below
  ``Replica.high``). Runs with the prefix forced to the whole array (what the engine did before)
  must give byte-identical records and summaries, across every acceptance model, preemption and
  both prefill modes; a planted bug in the prefix bookkeeping must break that equality.
- ``high`` is exactly one past the highest occupied slot after every iteration.
- A step at k = 0 (speculation switched off for one iteration) draws no acceptance uniforms.
- The parsed-profile cache returns the file's current content after the file changes on disk.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest
from test_sim_identity import no_loops

from specsim.scenario import Scenario
from specsim.simulation import run as run_module
from specsim.simulation import run_simulation
from specsim.simulation.acceptance import RateAcceptance
from specsim.simulation.replica import Replica

DATA = Path(__file__).parent / "data"

BASE = {
    "seed": 11,
    "profile": "sim_profile.yaml",
    "workload": {
        "kind": "poisson",
        "rate": 6.0,
        "requests": 160,
        "prompt": {"dist": "uniform", "low": 20, "high": 300},
        "output": {"dist": "uniform", "low": 2, "high": 90},
    },
    "engine": {"max_batch": 48},
    "speculation": {"drafter": "c05", "k": 3},
}

# Each variant exercises a different draw or bookkeeping path.
VARIANTS = {
    "rates": {},
    "heterogeneous": {"speculation": {"drafter": "c20", "k": 3}},
    "ngram proposals": {"speculation": {"drafter": "ngram", "k": 4}},
    "replayed sequences": {
        "speculation": {
            "drafter": "c20",
            "k": 4,
            "temperature": 0.0,
            "acceptance": "sequences",
        }
    },
    "k = 0": {"speculation": {"drafter": None, "k": 0}},
    "preemption": {"engine": {"max_batch": 48, "kv_capacity_tokens": 2500}},
    "no chunked prefill": {"engine": {"max_batch": 48, "chunked_prefill": False}},
    "adaptive": {"speculation": {"drafter": "c05", "k": 3, "policy": "adaptive"}},
    "bursty load": {"workload": {"rate": 40.0}},
    "by batch": {
        "speculation": {
            "drafter": "c20",
            "k": 3,
            "policy": "by_batch",
            "k_by_batch": [{"max_batch": 3, "k": 3}],
        },
        "workload": {"rate": 40.0},
    },
}


def make(changes: dict) -> Scenario:
    data = copy.deepcopy(BASE)
    for section, values in changes.items():
        data[section] = {**data[section], **values}
    return Scenario.model_validate(data).with_source(DATA / "scenario.yaml")


def outputs(scenario: Scenario, path: Path) -> tuple[bytes, dict]:
    summary = run_simulation(scenario, records_path=path).summary
    return path.read_bytes(), summary


def whole_array_prefix(monkeypatch) -> None:
    """Make every step work on the whole batch arrays, as the engine did before the prefix."""
    prefix = Replica._prefix
    monkeypatch.setattr(Replica, "_prefix", lambda self, high: prefix(self, self.capacity))


@pytest.mark.parametrize("name", list(VARIANTS))
def test_occupied_prefix_gives_the_whole_array_results(name, tmp_path, monkeypatch):
    scenario = make(VARIANTS[name])
    fast = outputs(scenario, tmp_path / "fast.csv")
    whole_array_prefix(monkeypatch)
    whole = outputs(scenario, tmp_path / "whole.csv")
    assert fast[1]["requests"] == 160
    assert fast[0] == whole[0]
    assert fast[1] == whole[1]


def test_a_prefix_that_forgets_occupied_slots_is_caught(tmp_path, monkeypatch):
    """Planted bug: after a row leaves, the prefix shrinks to the number of rows (wrong when the
    occupied slots are not contiguous). The comparison above must see the difference."""
    scenario = make(VARIANTS["bursty load"])
    fast = outputs(scenario, tmp_path / "fast.csv")
    free_slot = Replica._free_slot

    def shrink_to_row_count(self, slot):
        free_slot(self, slot)
        self.high = min(self.high, self.decoding)

    monkeypatch.setattr(Replica, "_free_slot", shrink_to_row_count)
    # Rows left outside the prefix never finish, so the run would not end: stop it after
    # ten times the iterations the correct run needs.
    apply = Replica._apply_mixed
    budget = [10 * fast[1]["engine_iterations"]]

    def bounded_apply(self, plan, now, start):
        budget[0] -= 1
        if budget[0] < 0:
            raise RuntimeError("the planted bug stalled the engine")
        apply(self, plan, now, start)

    monkeypatch.setattr(Replica, "_apply_mixed", bounded_apply)
    try:
        planted = outputs(scenario, tmp_path / "planted.csv")
    except RuntimeError:
        return  # rows were lost: caught
    assert planted[0] != fast[0]


def test_high_is_one_past_the_highest_occupied_slot(tmp_path, monkeypatch):
    apply = Replica._apply_mixed
    checked = []

    def apply_and_check(self, plan, now, start):
        apply(self, plan, now, start)
        occupied = [slot for slot, request in enumerate(self.slot_request) if request]
        assert self.high == (max(occupied) + 1 if occupied else 0)
        assert self.decoding == len(occupied)
        checked.append(len(occupied))

    monkeypatch.setattr(Replica, "_apply_mixed", apply_and_check)
    no_loops(monkeypatch)  # iterations that Python plans and applies
    run_simulation(make(VARIANTS["bursty load"]))
    # The run must have had real churn: empty and crowded batches both occurred.
    assert min(checked) <= 1
    assert max(checked) >= 8


def test_profile_cache_sees_a_changed_file(tmp_path):
    profile = (DATA / "sim_profile.yaml").read_text()
    (tmp_path / "sim_profile.yaml").write_text(profile)
    (tmp_path / "sim_sequences.txt").write_text((DATA / "sim_sequences.txt").read_text())
    scenario = Scenario.model_validate(copy.deepcopy(BASE)).with_source(tmp_path / "s.yaml")
    first = run_simulation(scenario).summary
    again = run_simulation(scenario).summary
    assert again == first
    parsed = run_module._PROFILE_CACHE
    assert any(key[0] == str((tmp_path / "sim_profile.yaml").resolve()) for key in parsed)
    # A slower target: the same file path, new content (and a new modification time).
    slower = profile.replace("latency: {fit: {fixed_s: 0.01}}", "latency: {fit: {fixed_s: 0.02}}")
    assert slower != profile
    path = tmp_path / "sim_profile.yaml"
    path.write_text(slower)
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    changed = run_simulation(scenario).summary
    assert changed["e2e_s"]["mean"] > first["e2e_s"]["mean"]


def test_a_cached_profile_is_a_fresh_loaded_profile_each_run(tmp_path):
    """Latency models carry per-run state (the once-only range warning): never shared."""
    path = DATA / "sim_profile.yaml"
    a = run_module.cached_profile(path)
    b = run_module.cached_profile(path)
    assert a is not b
    assert a.latency_model("target") is not b.latency_model("target")
    assert a.profile is b.profile


def test_a_step_without_drafts_draws_nothing(monkeypatch):
    """by_batch turns speculation off above 3 rows: those steps must not touch the stream."""
    draw = RateAcceptance.draw_slots
    windows = []

    def recording_draw(self, rng, k, shift, capacity):
        windows.append(k)
        return draw(self, rng, k, shift, capacity)

    plan = Replica._plan_mixed
    planned = []

    def recording_plan(self, *window):
        step = plan(self, *window)
        if step.decode is not None:
            planned.append(step.decode.k)
        return step

    monkeypatch.setattr(RateAcceptance, "draw_slots", recording_draw)
    monkeypatch.setattr(Replica, "_plan_mixed", recording_plan)
    run_simulation(make(VARIANTS["by batch"]))
    assert 0 in planned and 3 in planned  # both kinds of step happened
    assert 0 not in windows
    assert len(windows) == planned.count(3)
