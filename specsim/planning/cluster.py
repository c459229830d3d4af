"""The distributed path of the sweep engine: a ``dask.distributed`` client and its submissions.

The workers need specsim installed and the scenario, profile and trace files at the same paths
(a shared file system, or the same checkout on every machine).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from specsim.errors import SpecsimError
from specsim.planning.points import SweepPoint
from specsim.planning.tasks import Task, run_point

CLUSTER_CONNECT_TIMEOUT_S = 5.0


def connect_cluster(address: str, timeout_s: float):
    """A Dask client for ``address``, or a one-line error within about ``timeout_s`` seconds."""
    from dask.distributed import Client

    fix = "start a scheduler and workers there (dask scheduler / dask worker ADDRESS) or check it"
    if "://" not in address and ":" not in address:
        raise SpecsimError(
            f"cluster address {address!r} has no port",
            key="--cluster",
            fix="write HOST:PORT or tcp://HOST:PORT",
        )
    try:
        client = Client(address, timeout=f"{timeout_s}s", set_as_default=False)
    except Exception as exc:
        reason = " ".join(str(exc).split())[:160] or type(exc).__name__
        raise SpecsimError(
            f"cannot reach a Dask scheduler at {address} within {timeout_s:g} s ({reason})",
            key="--cluster",
            fix=fix,
        ) from None
    try:
        client.wait_for_workers(1, timeout=timeout_s)
    except Exception:
        with contextlib.suppress(Exception):
            client.close(timeout=2)
        raise SpecsimError(
            f"the Dask scheduler at {address} has no workers", key="--cluster", fix=fix
        ) from None
    return client


def run_on_cluster(client, task: Task, todo: dict[str, SweepPoint]) -> Iterator[tuple[str, dict]]:
    """Submit every point to the cluster; yield (key, record) as each one completes."""
    from dask.distributed import as_completed

    futures = {}
    for key, point in todo.items():
        future = client.submit(
            run_point,
            task,
            point.scenario,
            list(point.overrides),
            key=f"specsim-point-{key}",
            pure=False,
        )
        futures[future] = key
    for future in as_completed(list(futures), loop=client.loop):
        key = futures[future]
        try:
            record = future.result()
        except Exception as exc:  # the worker died repeatedly (KilledWorker) or was lost
            text = " ".join(str(exc).split())
            record = {"ok": False, "error": f"cluster: {type(exc).__name__}: {text}"}
        yield key, record
