"""The one sweep engine: independent simulations on a local process pool or a Dask cluster.

Every planner command hands a list of ``SweepPoint`` to ``Sweeper.run``. Results are written one
JSON file per point (``DIR/points/<key>.json``) as they arrive, so an interrupted sweep rerun with
the same folder computes only the missing points. A point that fails is recorded with its
overrides and its one-line error (``<key>.failed.json``) and the sweep goes on; failed points are
retried on the next run. ``DIR/sweep.json`` names the sweep a folder holds, and a folder holding a
different sweep is refused.

The local path is ``concurrent.futures.ProcessPoolExecutor``; the distributed path is
``dask.distributed.Client``. Neither is reimplemented here: this module only keeps the books.
The pool's workers never outlive the sweep (``pool``).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections import deque
from collections.abc import Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specsim.errors import SpecsimError
from specsim.fileio import dump_json, write_text_atomic
from specsim.planning.sweep.cluster import (
    CLUSTER_CONNECT_TIMEOUT_S,
    ClusterTls,
    connect_cluster,
    run_on_cluster,
)
from specsim.planning.sweep.folder import POINTS, check_folder, jsonable, write_manifest
from specsim.planning.sweep.points import SweepPoint
from specsim.planning.sweep.pool import new_pool
from specsim.planning.sweep.tasks import Task, run_point, simulate_point

__all__ = ["PointResult", "SweepStats", "Sweeper", "run_point", "simulate_point"]

WORKER_DIED = "the worker process running it died (a crash or out of memory)"


@dataclass
class PointResult:
    point: SweepPoint
    key: str
    ok: bool
    summary: dict[str, Any] | None = None
    error: str | None = None
    cached: bool = False

    @property
    def tags(self) -> dict[str, Any]:
        return dict(self.point.tags)


@dataclass
class SweepStats:
    computed: int = 0
    cached: int = 0
    failed: int = 0
    seconds: float = 0.0
    failures: list[PointResult] = field(default_factory=list)

    def json(self) -> dict[str, Any]:
        """summary.json's ``simulations`` and ``failed``, as every planner writes them."""
        return {
            "simulations": {"computed": self.computed, "cached": self.cached},
            "failed": [
                {"overrides": list(f.point.overrides), "error": f.error} for f in self.failures
            ],
        }


def default_workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


class Sweeper:
    """Runs points into ``out``; use as a context manager (it owns a pool or a cluster client).

    ``identity`` is a JSON-able mapping naming the sweep (command, scenario digest, options): a
    folder whose ``sweep.json`` names another identity is refused. ``workers`` is the local pool
    size (1 runs in this process); ``cluster`` a Dask scheduler address, which replaces the pool,
    and ``cluster_tls`` the client's TLS files for it (see ``specsim.planning.sweep.cluster``).
    """

    def __init__(
        self,
        out: str | Path,
        identity: dict[str, Any],
        *,
        workers: int | None = None,
        cluster: str | None = None,
        cluster_tls: ClusterTls | None = None,
        progress: bool = True,
        task: Task = simulate_point,
        connect_timeout_s: float = CLUSTER_CONNECT_TIMEOUT_S,
    ):
        if workers is not None and workers < 1:
            raise SpecsimError(
                f"--workers must be at least 1 (got {workers})",
                key="--workers",
                fix="use 1 or more",
            )
        self.out = Path(out)
        self.identity = identity
        self.workers = workers or default_workers()
        self.cluster = cluster
        self.cluster_tls = cluster_tls
        if cluster_tls is not None and cluster_tls.given() and not cluster:
            raise SpecsimError(
                "the --cluster-tls-* options need --cluster",
                key="--cluster",
                fix="give --cluster tls://HOST:PORT, or drop the TLS options",
            )
        self.progress = progress
        self.task = task
        self.connect_timeout_s = connect_timeout_s
        self.stats = SweepStats()
        self._pool: ProcessPoolExecutor | None = None
        self._stop_pool = None  # the write end of the pool's stop pipe
        self._client = None

    # -- lifecycle -------------------------------------------------------------------------------
    def __enter__(self) -> Sweeper:
        self.check_folder()
        if self.cluster:
            self._client = connect_cluster(self.cluster, self.connect_timeout_s, self.cluster_tls)
        self._write_manifest()
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        self.close(interrupted=exc_type is not None)

    def close(self, interrupted: bool = False) -> None:
        """Shut the pool down; ``interrupted`` ends its workers now, losing the points in flight
        (a rerun computes them), rather than waiting for them."""
        if self._pool is not None:
            if interrupted:
                self._stop_workers()
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
            self._stop_workers()
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close(timeout=5)
            self._client = None

    @property
    def parallelism(self) -> int:
        """How many points run at once: pool size, or the cluster's worker threads."""
        if self._client is not None:
            info = self._client.scheduler_info()
            threads = sum(w.get("nthreads", 1) for w in info.get("workers", {}).values())
            return max(1, threads)
        return self.workers

    # -- the folder --------------------------------------------------------------------------------
    def check_folder(self) -> None:
        """Refuse a folder that holds another sweep or unrelated files; touch nothing."""
        check_folder(self.out, self.identity)

    def _write_manifest(self) -> None:
        write_manifest(self.out, self.identity)

    def _path(self, key: str, failed: bool = False) -> Path:
        return self.out / POINTS / (f"{key}.failed.json" if failed else f"{key}.json")

    def _load_cached(self, point: SweepPoint, key: str) -> PointResult | None:
        path = self._path(key)
        if not path.is_file():
            return None
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
            summary = record["summary"]
        except (OSError, ValueError, KeyError):
            return None  # a damaged record is recomputed
        return PointResult(point, key, True, summary=summary, cached=True)

    def _store(self, point: SweepPoint, key: str, record: dict[str, Any]) -> PointResult:
        stored = {
            "key": key,
            "scenario": point.scenario,
            "overrides": list(point.overrides),
            "tags": jsonable(dict(point.tags)),
        }
        if record["ok"]:
            measured = {"cpu_s": record["cpu_s"], "summary": record["summary"]}
            write_text_atomic(self._path(key), dump_json({**stored, **measured}))
            with contextlib.suppress(FileNotFoundError):
                self._path(key, failed=True).unlink()
            return PointResult(point, key, True, summary=record["summary"])
        write_text_atomic(
            self._path(key, failed=True), dump_json({**stored, "error": record["error"]})
        )
        return PointResult(point, key, False, error=record["error"])

    # -- running -----------------------------------------------------------------------------------
    def run(self, points: Sequence[SweepPoint], desc: str = "simulations") -> list[PointResult]:
        """Results in the order of ``points``; cached points are read, the rest computed."""
        started = time.perf_counter()
        keys = [p.key() for p in points]
        results: dict[str, PointResult] = {}
        todo: dict[str, SweepPoint] = {}
        for point, key in zip(points, keys, strict=True):
            if key in results or key in todo:
                continue  # the same simulation asked for twice runs once
            cached = self._load_cached(point, key)
            if cached is not None:
                results[key] = cached
                self.stats.cached += 1
            else:
                todo[key] = point
        if todo:
            bar = _progress_bar(len(todo), desc, self.progress)
            try:
                for key, record in self._compute(todo):
                    result = self._store(todo[key], key, record)
                    results[key] = result
                    self.stats.computed += 1
                    if not result.ok:
                        self.stats.failed += 1
                        self.stats.failures.append(result)
                        bar.write(f"point failed ({' '.join(todo[key].overrides)}): {result.error}")
                    bar.update(1)
            finally:
                bar.close()
        self.stats.seconds += time.perf_counter() - started
        return [_retag(results[key], point) for point, key in zip(points, keys, strict=True)]

    def map_local(self, fn, items: Sequence[Any], chunksize: int = 32) -> list[Any]:
        """``[fn(item) for item in items]`` on the local pool (in this process with one worker
        or a cluster): for cheap work over many items, such as a screen's estimates. ``fn`` must
        be importable by name and must not raise."""
        if self.workers == 1 or self._client is not None or len(items) <= chunksize:
            return [fn(item) for item in items]
        return list(self._ensure_pool().map(fn, items, chunksize=chunksize))

    def _compute(self, todo: dict[str, SweepPoint]) -> Iterable[tuple[str, dict[str, Any]]]:
        if self._client is not None:
            yield from run_on_cluster(self._client, self.task, todo)
        elif self.workers == 1 or len(todo) == 1:
            for key, point in todo.items():
                yield key, run_point(self.task, point.scenario, list(point.overrides))
        else:
            yield from self._compute_pool(todo)

    def _compute_pool(self, todo: dict[str, SweepPoint]) -> Iterable[tuple[str, dict[str, Any]]]:
        """At most ``workers`` points in flight, so a dying worker implicates only those.

        When a worker dies (out of memory, a crash in native code) the pool breaks and every
        point in flight is lost. Those points become suspects and are rerun one at a time in a
        fresh pool: the one that kills its worker when alone is recorded as failed, the others
        complete, and the sweep goes on in parallel.
        """
        queue = deque(todo)
        suspects: deque[str] = deque()
        while queue or suspects:
            pool = self._ensure_pool()
            if suspects:
                key = suspects.popleft()
                point = todo[key]
                try:
                    record = pool.submit(
                        run_point, self.task, point.scenario, list(point.overrides)
                    ).result()
                except BrokenProcessPool:
                    self._drop_pool()
                    record = {"ok": False, "error": WORKER_DIED}
                except Exception as exc:  # the result could not come back (e.g. unpicklable)
                    record = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
                yield key, record
                continue
            in_flight: dict[Future, str] = {}
            broken = False
            while (queue or in_flight) and not broken:
                while queue and len(in_flight) < self.workers:
                    point = todo[queue[0]]
                    try:
                        future = pool.submit(
                            run_point, self.task, point.scenario, list(point.overrides)
                        )
                    except BrokenProcessPool:
                        # A worker died after the last wait returned: the pool refuses new
                        # points. This one never ran; it stays queued for the next pool.
                        broken = True
                        break
                    in_flight[future] = queue.popleft()
                if broken:
                    break
                done, _ = wait(in_flight, return_when=FIRST_COMPLETED)
                for future in done:
                    key = in_flight.pop(future)
                    if future.exception() is not None:  # BrokenProcessPool: run_point never raises
                        broken = True
                        suspects.append(key)
                    else:
                        yield key, future.result()
            if broken:
                for future, key in in_flight.items():
                    finished = future.done() and future.exception() is None
                    if finished:
                        yield key, future.result()
                    else:
                        suspects.append(key)
                self._drop_pool()

    def _drop_pool(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
            self._stop_workers()

    def _stop_workers(self) -> None:
        if self._stop_pool is not None:
            self._stop_pool.close()
            self._stop_pool = None

    def _ensure_pool(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool, self._stop_pool = new_pool(self.workers)
        return self._pool


def _retag(result: PointResult, point: SweepPoint) -> PointResult:
    """The result under the asking point's tags (two points with one key may be tagged apart)."""
    if result.point is point:
        return result
    return PointResult(point, result.key, result.ok, result.summary, result.error, result.cached)


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def write(self, text: str) -> None:
        print(text, file=sys.stderr)

    def close(self) -> None:
        pass


def _progress_bar(total: int, desc: str, enabled: bool):
    # A bar redrawn with carriage returns is noise in a log file or a CI transcript.
    if not enabled or not sys.stderr.isatty():
        return _NoBar()
    from tqdm import tqdm

    return tqdm(
        total=total, desc=desc, unit="sim", file=sys.stderr, leave=False, dynamic_ncols=True
    )
