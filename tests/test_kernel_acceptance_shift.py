"""A workload's acceptance shift (``speculation.acceptance_shift``) on the serving kernel: a
request from the shift's index or arrival time on takes its drawn acceptance level
``base_levels`` further on, the same quantile of the shifted rates
(``RateAcceptance.request_level``), as the kernel's admission applies it
(``compiled_admission_kernel._shifted``, packed by ``serving_kv.pack_shift``).

Identity with the per-iteration reference (every record at full precision, each replica's
engine statistics, the summary and requests.csv: ``test_sim_identity.assert_identical``) with
the kernel running at least 80 % of the engine iterations: a lone replica on an open and a
closed loop, a fleet of four behind least outstanding, two pools of which one shifts, and a
split fleet's pools; the shift
early, mid-run and after the last request, by index and by time. Planted faults (the shift
applied one request late; the shifted levels' offset off by one) fail them.
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
from specsim.simulation import run_simulation, serving_kv
from specsim.simulation.compiled_layout import SHIFT_LEVELS, SHIFT_RID

CLOSED = {"kind": "closed_loop", "concurrency": 12, "requests": 300, "rate": None}
OPEN = {"rate": 12.0, "requests": 300}  # about 25 s
FLEET = {"replicas": 4, "router": "least_outstanding"}


def shifted(trigger: dict, factor: float = 0.4, drafter: str = "c05") -> dict:
    shift = {**trigger, "factor": factor}
    return {"drafter": drafter, "k": 3, "acceptance_shift": shift}


CASES = {
    "open loop, early by index": {"workload": OPEN, "speculation": shifted({"after_requests": 5})},
    "open loop, mid-run by time": {"workload": OPEN, "speculation": shifted({"after_s": 12.0})},
    "open loop, homogeneous, mid-run by index, up": {
        "workload": OPEN,
        "speculation": shifted({"after_requests": 150}, 1.3, "heads"),
    },
    "closed loop, mid-run by index": {
        "workload": CLOSED,
        "speculation": shifted({"after_requests": 150}),
    },
    "closed loop, early by time": {"workload": CLOSED, "speculation": shifted({"after_s": 0.5})},
    "four replicas, mid-run by index": {
        "fleet": FLEET,
        "workload": {"rate": 40.0, "requests": 400},
        "speculation": shifted({"after_requests": 200}),
    },
    "four replicas, early by time": {
        "fleet": FLEET,
        "workload": {"rate": 40.0, "requests": 400},
        "speculation": shifted({"after_s": 1.0}),
    },
}
# After the last request: nothing shifts, and the run is the unshifted one.
AFTER_LAST = {
    "open loop": {"workload": OPEN, "speculation": shifted({"after_requests": 300})},
    "four replicas": {
        "fleet": FLEET,
        "workload": {"rate": 40.0, "requests": 400},
        "speculation": shifted({"after_s": 1e6}),
    },
}


def unshifted(changes: dict) -> dict:
    speculation = {**changes["speculation"]}
    del speculation["acceptance_shift"]
    return {**changes, "speculation": speculation}


@pytest.mark.parametrize("name", list(CASES))
def test_a_shift_on_the_kernel_is_the_reference(name, profile, tmp_path, monkeypatch):  # noqa: F811
    scenario = make(CASES[name], profile)
    kernel, summary = kernel_share(scenario, monkeypatch)
    assert kernel >= 0.8
    fast = assert_identical(scenario, tmp_path, monkeypatch)
    assert fast["summary"] == summary
    # The shift took hold: the run differs from the unshifted one.
    plain = run_simulation(make(unshifted(CASES[name]), profile)).summary
    assert plain["mean_acceptance_length"] != summary["mean_acceptance_length"]


@pytest.mark.parametrize("name", list(AFTER_LAST))
def test_a_shift_after_the_last_request_changes_nothing(name, profile, tmp_path, monkeypatch):  # noqa: F811
    scenario = make(AFTER_LAST[name], profile)
    kernel, summary = kernel_share(scenario, monkeypatch)
    assert kernel >= 0.8
    assert_identical(scenario, tmp_path, monkeypatch)
    assert run_simulation(make(unshifted(AFTER_LAST[name]), profile)).summary == summary


def test_a_shift_in_one_pool_of_two(profile, tmp_path, monkeypatch):  # noqa: F811
    """Each pool's replicas pack their own acceptance's shift: pool a's, and none in b."""
    pools = [
        {"name": "a", "replicas": 2, "speculation": shifted({"after_requests": 100})},
        {"name": "b", "replicas": 2, "speculation": {"drafter": "ngram", "k": 4}},
    ]
    fleet = {"router": "least_outstanding", "pools": pools}
    scenario = make({"fleet": fleet, "workload": {"rate": 40.0, "requests": 400}}, profile)
    kernel, _ = kernel_share(scenario, monkeypatch)
    assert kernel >= 0.8
    assert_identical(scenario, tmp_path, monkeypatch)


def split(trigger: dict, folder) -> Scenario:
    data = copy.deepcopy(SPLIT_BASE)
    data["speculation"] = {**data["speculation"], "acceptance_shift": {**trigger, "factor": 0.4}}
    data["workload"]["rate"] = 40.0
    return Scenario.model_validate(data).with_source(folder / "scenario.yaml")


@pytest.mark.parametrize("trigger", [{"after_requests": 60}, {"after_s": 1.0}], ids=str)
def test_a_shift_on_a_split_fleets_pools(trigger, profile, tmp_path, monkeypatch):  # noqa: F811
    scenario = split(trigger, profile)
    counts = iterations(scenario, tmp_path, monkeypatch)
    assert share(counts, "prefill") >= 0.8 and share(counts, "decode") >= 0.8
    assert_identical(scenario, tmp_path, monkeypatch)


def planted(fault):
    """``pack_shift`` with ``fault`` applied to what it packs."""
    pack = serving_kv.pack_shift

    def faulty(acceptance, st, ct):
        pack(acceptance, st, ct)
        fault(st, ct)

    return faulty


def one_request_late(st, ct):
    st[SHIFT_RID] += 1


def offset_off_by_one(st, ct):
    ct[SHIFT_LEVELS] -= 1


@pytest.mark.parametrize("fault", [one_request_late, offset_off_by_one])
@pytest.mark.parametrize("name", ["open loop, early by index", "four replicas, mid-run by index"])
def test_planted_shift_faults_fail(fault, name, profile, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setattr(serving_kv, "pack_shift", planted(fault))
    with pytest.raises(AssertionError):
        assert_identical(make(CASES[name], profile), tmp_path, monkeypatch)


def test_a_shift_run_interpreted_gives_the_compiled_bytes(tmp_path):
    """The admission kernel's shift run by Python (numba's JIT off) gives the compiled run's
    outputs byte for byte: a lone replica shifting by index, and one by time."""
    paths = []
    for name, trigger in (("index", {"after_requests": 40}), ("time", {"after_s": 4.0})):
        data = copy.deepcopy(SIM_BASE) | {"profile": str(DATA / "sim_profile.yaml")}
        data["speculation"] = shifted(trigger)
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
