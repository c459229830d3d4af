"""The sweep engine: per-point results, resume, failure isolation, folder identity, pool and Dask.

These tests run a synthetic task (a few lines of arithmetic) instead of the simulator, so they
check the engine's bookkeeping quickly; the planner tests run it on the real simulator.
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import sys
from pathlib import Path

import pytest

from specsim.errors import SpecsimError
from specsim.planning.sweep.cluster import ClusterTls
from specsim.planning.sweep.points import SweepPoint
from specsim.planning.sweep.sweeper import Sweeper, run_point


def _values(overrides: list[str]) -> dict[str, str]:
    return dict(o.split("=", 1) for o in overrides)


def square_task(scenario: str, overrides: list[str]) -> dict:
    values = _values(overrides)
    if values.get("fail") == "yes":
        raise ValueError("planted failure")
    if values.get("crash") == "yes":
        os._exit(3)  # the worker process dies without a word
    x = float(values["x"])
    return {"x": x, "square": x * x, "pid": 0}


def interrupting_task(scenario: str, overrides: list[str]) -> dict:
    if float(_values(overrides)["x"]) >= 3:
        raise KeyboardInterrupt
    return square_task(scenario, overrides)


@pytest.fixture()
def scenario(tmp_path: Path) -> Path:
    path = tmp_path / "scenario.yaml"
    path.write_text("seed: 1\nprofile: profile.yaml\n", encoding="utf-8")
    (tmp_path / "profile.yaml").write_text("name: fake\n", encoding="utf-8")
    return path


def _points(scenario: Path, n: int, extra: dict[int, str] | None = None) -> list[SweepPoint]:
    extra = extra or {}
    points = []
    for i in range(n):
        overrides = [f"x={i}"] + ([extra[i]] if i in extra else [])
        points.append(SweepPoint.make(scenario, overrides, index=i))
    return points


IDENTITY = {"command": "test", "scenario": "scenario.yaml"}


def _sweeper(out: Path, task=square_task, **kw) -> Sweeper:
    return Sweeper(out, IDENTITY, task=task, progress=False, **kw)


def test_results_come_back_in_order_and_one_file_per_point(tmp_path, scenario):
    out = tmp_path / "out"
    points = _points(scenario, 5)
    with _sweeper(out, workers=1) as sweeper:
        results = sweeper.run(points)
    assert [r.summary["square"] for r in results] == [0, 1, 4, 9, 16]
    assert [r.tags["index"] for r in results] == list(range(5))
    stored = sorted((out / "points").glob("*.json"))
    assert len(stored) == 5
    record = json.loads((out / "points" / f"{results[3].key}.json").read_text())
    assert record["overrides"] == ["x=3"]
    assert record["summary"]["square"] == 9
    assert math.isfinite(record["cpu_s"]) and record["cpu_s"] >= 0.0  # measured, not asserted
    assert json.loads((out / "sweep.json").read_text())["identity"] == IDENTITY


def test_an_interrupted_sweep_resumes_with_only_the_missing_points(tmp_path, scenario):
    out = tmp_path / "out"
    points = _points(scenario, 6)
    with pytest.raises(KeyboardInterrupt), _sweeper(out, task=interrupting_task, workers=1) as s:
        s.run(points)
    # x = 0, 1, 2 were finished and stored before the interruption.
    assert len(list((out / "points").glob("*.json"))) == 3
    with _sweeper(out, workers=1) as sweeper:
        results = sweeper.run(points)
    assert sweeper.stats.cached == 3 and sweeper.stats.computed == 3
    assert [r.cached for r in results] == [True] * 3 + [False] * 3
    assert [r.summary["square"] for r in results] == [0, 1, 4, 9, 16, 25]
    with _sweeper(out, workers=1) as sweeper:
        sweeper.run(points)
    assert sweeper.stats.computed == 0 and sweeper.stats.cached == 6


def test_a_failing_point_is_reported_with_its_overrides_and_the_rest_finish(tmp_path, scenario):
    out = tmp_path / "out"
    points = _points(scenario, 4, extra={2: "fail=yes"})
    with _sweeper(out, workers=1) as sweeper:
        results = sweeper.run(points)
    assert [r.ok for r in results] == [True, True, False, True]
    assert results[2].error == "ValueError: planted failure"
    assert sweeper.stats.failed == 1 and sweeper.stats.failures[0].point.overrides == (
        "x=2",
        "fail=yes",
    )
    failed = json.loads((out / "points" / f"{results[2].key}.failed.json").read_text())
    assert failed["overrides"] == ["x=2", "fail=yes"] and "planted" in failed["error"]
    # A rerun retries only the failed point.
    with _sweeper(out, workers=1) as sweeper:
        sweeper.run(points)
    assert sweeper.stats.computed == 1 and sweeper.stats.cached == 3


def test_a_specsim_error_keeps_its_one_line_message():
    def bad(scenario, overrides):
        raise SpecsimError("no such drafter", file="p.yaml", key="drafters", fix="pick one")

    record = run_point(bad, "s.yaml", [])
    assert record == {"ok": False, "error": "p.yaml: drafters: no such drafter; fix: pick one"}


def test_a_folder_holding_a_different_sweep_is_refused(tmp_path, scenario):
    out = tmp_path / "out"
    with _sweeper(out, workers=1) as sweeper:
        sweeper.run(_points(scenario, 1))
    other = Sweeper(out, {**IDENTITY, "loads": [1, 2]}, task=square_task, progress=False)
    with pytest.raises(SpecsimError, match=r"different sweep.*loads"):
        other.__enter__()
    stray = tmp_path / "stray"
    (stray / "points").mkdir(parents=True)
    with pytest.raises(SpecsimError, match=r"no sweep\.json"):
        _sweeper(stray).__enter__()


def test_changing_a_referenced_file_changes_the_key(tmp_path, scenario):
    point = SweepPoint.make(scenario, ["x=1"])
    before = point.key()
    assert SweepPoint.make(scenario, ["x=1"]).key() == before
    assert SweepPoint.make(scenario, ["x=2"]).key() != before
    profile = tmp_path / "profile.yaml"
    profile.write_text("name: changed\n", encoding="utf-8")
    os.utime(profile, ns=(1, 1))  # a new mtime even on coarse file systems
    assert point.key() != before


def test_the_process_pool_gives_the_same_files_as_one_process(tmp_path, scenario):
    points = _points(scenario, 6)
    with _sweeper(tmp_path / "serial", workers=1) as sweeper:
        serial = sweeper.run(points)
    with _sweeper(tmp_path / "pool", workers=2) as sweeper:
        pooled = sweeper.run(points)
    assert [r.summary for r in pooled] == [r.summary for r in serial]
    for result in serial:
        name = f"points/{result.key}.json"
        pool, alone = (
            json.loads((tmp_path / run / name).read_text()) for run in ("pool", "serial")
        )
        assert pool.pop("cpu_s") >= 0.0 and alone.pop("cpu_s") >= 0.0  # measured: may differ
        assert pool == alone


def test_a_point_that_kills_its_worker_is_recorded_and_the_rest_finish(tmp_path, scenario):
    points = _points(scenario, 5, extra={1: "crash=yes"})
    with _sweeper(tmp_path / "out", workers=2) as sweeper:
        results = sweeper.run(points)
    assert [r.ok for r in results] == [True, False, True, True, True]
    assert "worker process" in results[1].error
    assert [r.summary["square"] for r in results if r.ok] == [0, 4, 9, 16]


UNGUARDED_SCRIPT = """
import json, sys
sys.path.insert(0, {tests!r})
from pathlib import Path
from test_sweep import _points, _sweeper
out = Path({out!r})
with _sweeper(out / "sweep", workers=2) as sweeper:
    results = sweeper.run(_points(Path({scenario!r}), 4))
print(json.dumps([[r.ok, r.error] for r in results]))
"""


@pytest.mark.parametrize("how", ["file", "stdin"])
def test_a_script_without_a_main_guard_sweeps_on_the_pool(tmp_path, scenario, how):
    # Workers start without the caller's script: re-running it there would start the sweep
    # again in each worker (no __main__ guard) or find no file (python -).
    import subprocess

    code = UNGUARDED_SCRIPT.format(
        tests=str(Path(__file__).parent), out=str(tmp_path), scenario=str(scenario)
    )
    (tmp_path / "script.py").write_text(code, encoding="utf-8")
    argv = [sys.executable, "script.py"] if how == "file" else [sys.executable, "-"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        argv,
        input=code if how == "stdin" else None,
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == [[True, None]] * 4
    assert "bootstrapping" not in done.stderr


class RacingPool:
    """A process pool whose crashing point's worker dies while another point finishes: the
    next submission then finds the pool broken (``submit`` raises), before any wait says so.
    A fresh pool fails the crashing point's future, as a real one does when it runs alone."""

    pools = 0

    def __init__(self):
        RacingPool.pools += 1
        self.first = RacingPool.pools == 1
        self.broken = False

    def submit(self, fn, task, scenario, overrides, *rest):
        from concurrent.futures import Future
        from concurrent.futures.process import BrokenProcessPool

        if self.broken:
            raise BrokenProcessPool("a child process terminated abruptly")
        future = Future()
        if "crash=yes" not in overrides:
            future.set_result(fn(task, scenario, overrides, *rest))
        elif self.first:
            self.broken = True  # its worker is dying: still running as far as waits can tell
        else:
            future.set_exception(BrokenProcessPool("a child process terminated abruptly"))
        return future

    def shutdown(self, wait=True, cancel_futures=False):
        pass


def test_a_pool_found_broken_at_submission_reruns_the_suspects(tmp_path, scenario, monkeypatch):
    # The race CI once hit: a worker dies between two waits, and the next submit raises.
    RacingPool.pools = 0
    points = _points(scenario, 5, extra={1: "crash=yes"})
    with _sweeper(tmp_path / "out", workers=2) as sweeper:

        def racing_pool():
            if sweeper._pool is None:
                sweeper._pool = RacingPool()
            return sweeper._pool

        monkeypatch.setattr(sweeper, "_ensure_pool", racing_pool)
        results = sweeper.run(points)
    assert [r.ok for r in results] == [True, False, True, True, True]
    assert "worker process" in results[1].error
    assert [r.summary["square"] for r in results if r.ok] == [0, 4, 9, 16]
    assert RacingPool.pools >= 2  # the broken pool was dropped for a fresh one


def test_unreachable_cluster_is_a_one_line_error(tmp_path):
    sweeper = Sweeper(tmp_path / "out", IDENTITY, cluster="tcp://127.0.0.1:9", connect_timeout_s=2)
    with pytest.raises(SpecsimError, match=r"cannot reach a Dask scheduler at tcp://127.0.0.1:9"):
        sweeper.__enter__()
    with pytest.raises(SpecsimError, match="no port"):
        Sweeper(tmp_path / "out", IDENTITY, cluster="localhost").__enter__()
    # Nothing was written for a sweep that could not start.
    assert not (tmp_path / "out" / "sweep.json").exists()


@pytest.mark.slow
def test_the_dask_path_runs_on_a_local_cluster_with_two_worker_processes(tmp_path, scenario):
    import cloudpickle
    from dask.distributed import Client, LocalCluster

    # The workers import this test module's task by value: tests/ is not a package on their path.
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    points = _points(scenario, 8, extra={5: "fail=yes"})
    with _sweeper(tmp_path / "serial", workers=1) as sweeper:
        serial = sweeper.run(points)
    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    ) as cluster:
        with Client(cluster) as client:
            assert len(client.scheduler_info()["workers"]) == 2
        with _sweeper(tmp_path / "dask", cluster=cluster.scheduler_address) as sweeper:
            assert sweeper.parallelism == 2
            distributed = sweeper.run(points)
    assert [r.ok for r in distributed] == [r.ok for r in serial]
    assert [r.summary for r in distributed] == [r.summary for r in serial]
    assert distributed[5].error == "ValueError: planted failure"


@pytest.mark.parametrize("terminal", [False, True])
def test_the_progress_bar_is_drawn_only_on_a_terminal(tmp_path, scenario, monkeypatch, terminal):
    stderr = io.StringIO()
    stderr.isatty = lambda: terminal
    monkeypatch.setattr(sys, "stderr", stderr)
    with Sweeper(tmp_path / "out", IDENTITY, task=square_task, workers=1) as sweeper:
        sweeper.run(_points(scenario, 3))
    assert ("\r" in stderr.getvalue()) == terminal


def _tls_files(folder: Path):
    """A throw-away CA and certificate (Dask's own ``Security.temporary``) written as PEM files,
    with the in-memory Security that the test cluster itself uses."""
    from distributed.security import Security

    security = Security.temporary()
    files = {"ca": security.tls_ca_file, "cert": security.tls_client_cert}
    files["key"] = security.tls_client_key
    paths = {}
    for name, text in files.items():
        paths[name] = folder / f"{name}.pem"
        paths[name].write_text(text, encoding="utf-8")
    return security, ClusterTls(str(paths["ca"]), str(paths["cert"]), str(paths["key"]))


def test_the_tls_options_become_the_clients_security(tmp_path, monkeypatch):
    import dask.distributed

    _, tls = _tls_files(tmp_path)
    seen = {}

    class Refused(Exception):
        pass

    def fake_client(address, **kwargs):
        seen.update(kwargs, address=address)
        raise Refused("no scheduler here")

    monkeypatch.setattr(dask.distributed, "Client", fake_client)
    sweeper = Sweeper(tmp_path / "out", IDENTITY, cluster="127.0.0.1:8786", cluster_tls=tls)
    with pytest.raises(SpecsimError, match=r"cannot reach a Dask scheduler at tls://127.0.0.1"):
        sweeper.__enter__()
    assert seen["address"] == "tls://127.0.0.1:8786"  # a bare HOST:PORT is dialled over TLS
    security = seen["security"]
    assert security.require_encryption
    assert (security.tls_ca_file, security.tls_client_cert, security.tls_client_key) == (
        tls.ca_file,
        tls.cert,
        tls.key,
    )
    seen.clear()
    with pytest.raises(SpecsimError):
        Sweeper(tmp_path / "out", IDENTITY, cluster="tcp://127.0.0.1:1").__enter__()
    assert seen["security"] is None  # no options: Dask's own configuration applies


@pytest.mark.parametrize(
    ("cluster", "files", "message"),
    [
        ("tcp://127.0.0.1:1", ("ca", "cert", "key"), "need a tls:// address"),
        ("127.0.0.1:1", ("ca",), "--cluster-tls-cert is missing"),
        ("127.0.0.1:1", ("cert", "key"), "--cluster-tls-ca-file is missing"),
        ("127.0.0.1:1", ("ca", "cert", "missing"), "--cluster-tls-key: file not found"),
        (None, ("ca", "cert"), "need --cluster"),
    ],
)
def test_tls_option_errors_are_one_line(tmp_path, cluster, files, message):
    _, tls = _tls_files(tmp_path)
    given = {"ca": tls.ca_file, "cert": tls.cert, "key": tls.key}
    given["missing"] = str(tmp_path / "nope.pem")
    chosen = ClusterTls(
        given["ca"] if "ca" in files else None,
        given["cert"] if "cert" in files else None,
        given["missing"] if "missing" in files else given["key"] if "key" in files else None,
    )
    with pytest.raises(SpecsimError, match=re.escape(message)):
        Sweeper(tmp_path / "out", IDENTITY, cluster=cluster, cluster_tls=chosen).__enter__()
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_the_dask_path_runs_on_a_tls_cluster_given_the_files(tmp_path, scenario):
    from dask.distributed import LocalCluster

    security, tls = _tls_files(tmp_path)
    points = _points(scenario, 3)
    with LocalCluster(
        n_workers=1,
        threads_per_worker=1,
        processes=False,
        protocol="tls://",
        security=security,
        dashboard_address=None,
    ) as cluster:
        address = cluster.scheduler_address
        assert address.startswith("tls://")
        plain = Sweeper(tmp_path / "plain", IDENTITY, cluster=address, connect_timeout_s=2)
        with pytest.raises(SpecsimError, match="cannot reach a Dask scheduler"):
            plain.__enter__()  # without the client's certificate the scheduler refuses it
        with _sweeper(tmp_path / "tls", cluster=address, cluster_tls=tls) as sweeper:
            results = sweeper.run(points)
    assert [r.summary["square"] for r in results] == [0.0, 1.0, 4.0]
