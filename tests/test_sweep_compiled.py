"""A sweep of many short runs compiles the simulator's kernels when its processes' share of the
requests repays it (``compiled.expecting``), as one long run does; a small sweep does not."""

from __future__ import annotations

from pathlib import Path

import pytest

from specsim.planning.points import SweepPoint
from specsim.planning.sweep import Sweeper, expected_requests
from specsim.scenario import load_scenario
from specsim.simulation import compiled
from specsim.simulation.run import planned_requests

pytestmark = pytest.mark.skipif(not compiled.available(), reason="needs the fast extra (numba)")

REPO = Path(__file__).resolve().parents[1]
POISSON = REPO / "scenarios" / "poisson.yaml"
SHORT = 100.0  # requests: one such run alone never compiles


def compiles_task(scenario: str, overrides: list[str]) -> dict:
    """Whether a run of SHORT requests would take the kernels in this process, now."""
    return {"compiles": compiled.active(SHORT)}


def _points(n: int) -> list[SweepPoint]:
    return [SweepPoint.make(POISSON, [f"seed={i}"]) for i in range(n)]


# poisson.yaml plans 4 requests/s for 300 s (at most its workload.requests).
PER_POINT = planned_requests(load_scenario(POISSON).workload)


def test_expected_requests_is_the_planned_share_per_process():
    assert PER_POINT == 1_200
    # 16 sampled points, scaled to 40 points over 2 processes.
    assert expected_requests(_points(40), 2) == 1_200 * 40 / 2
    assert expected_requests([], 2) == 0.0
    broken = [SweepPoint.make(POISSON, ["workload.requests=-1"])]
    assert expected_requests(broken, 1) == 0.0  # its own run reports the error


@pytest.mark.parametrize("workers", [1, 2])
def test_a_large_sweep_of_short_runs_compiles_and_a_small_one_does_not(
    tmp_path, monkeypatch, workers
):
    monkeypatch.setenv(compiled.ENV, "auto")
    large = int(compiled.MIN_REQUESTS * workers / PER_POINT) + 1
    for n, expected in ((large, True), (3, False)):
        identity = {"command": "test", "n": n, "workers": workers}
        with Sweeper(
            tmp_path / f"{n}", identity, workers=workers, task=compiles_task, progress=False
        ) as sweeper:
            results = sweeper.run(_points(n))
        assert {r.summary["compiles"] for r in results} == {expected}, n
    # Outside a sweep the process is back to judging each run alone.
    assert compiled.active(SHORT) is False


def test_expecting_restores_what_was_there(monkeypatch):
    monkeypatch.setenv(compiled.ENV, "auto")
    with compiled.expecting(compiled.MIN_REQUESTS):
        assert compiled.active(SHORT) is True
        with compiled.expecting(0):
            assert compiled.active(SHORT) is False
        assert compiled.active(SHORT) is True
    assert compiled.active(SHORT) is False
    monkeypatch.setenv(compiled.ENV, "0")
    with compiled.expecting(compiled.MIN_REQUESTS):
        assert compiled.active(SHORT) is False  # off stays off


def test_a_cluster_sweep_passes_its_workers_share_too(tmp_path, monkeypatch):
    import sys

    import cloudpickle
    from dask.distributed import LocalCluster

    monkeypatch.setenv(compiled.ENV, "auto")  # the workers start after this: they inherit it
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    large = int(compiled.MIN_REQUESTS / PER_POINT) + 1
    with LocalCluster(
        n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None
    ) as cluster:
        for n, expected in ((large, True), (3, False)):
            with Sweeper(
                tmp_path / f"{n}",
                {"command": "test", "n": n},
                cluster=cluster.scheduler_address,
                task=compiles_task,
                progress=False,
            ) as sweeper:
                results = sweeper.run(_points(n))
            assert {r.summary["compiles"] for r in results} == {expected}, n
