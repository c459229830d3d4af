"""The distributed path of the sweep engine: a ``dask.distributed`` client and its submissions.

The workers need specsim installed and the scenario, profile and trace files at the same paths
(a shared file system, or the same checkout on every machine).

Trust: Dask moves tasks and results as pickles, and the client unpickles every result the
cluster sends back, which runs whatever code the sender chose. Connect only to a scheduler you
trust, over TLS where the network is shared: ``ClusterTls`` (the ``--cluster-tls-*`` options)
gives the client its certificate and the CA that signed the cluster's; a ``tls://`` address
with no such options takes them from Dask's own configuration (``distributed.comm.tls``).
"""

from __future__ import annotations

import contextlib
import gc
import ipaddress
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from specsim.errors import SpecsimError
from specsim.planning.sweep.points import SweepPoint
from specsim.planning.sweep.tasks import Task, run_point

CLUSTER_CONNECT_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class ClusterTls:
    """The client's side of a TLS cluster (mutual TLS, as Dask does it): PEM file paths."""

    ca_file: str | None = None
    cert: str | None = None
    key: str | None = None

    def given(self) -> bool:
        return any((self.ca_file, self.cert, self.key))

    def security(self):
        """A ``distributed.Security`` requiring encryption, or a one-line error."""
        from distributed.security import Security

        options = {
            "--cluster-tls-ca-file": self.ca_file,
            "--cluster-tls-cert": self.cert,
            "--cluster-tls-key": self.key,
        }
        for option, path in options.items():
            if path is not None and not Path(path).is_file():
                raise SpecsimError(
                    f"{option}: file not found", file=path, key=option, fix="check the path"
                )
        if not (self.ca_file and self.cert):
            missing = "--cluster-tls-cert" if self.ca_file else "--cluster-tls-ca-file"
            raise SpecsimError(
                f"TLS to a Dask cluster needs both the CA file and a client certificate; "
                f"{missing} is missing",
                key=missing,
                fix="give --cluster-tls-ca-file and --cluster-tls-cert (and --cluster-tls-key "
                "unless the key is in the certificate file)",
            )
        return Security(
            require_encryption=True,
            tls_ca_file=self.ca_file,
            tls_client_cert=self.cert,
            tls_client_key=self.key,
        )


def tls_address(address: str, tls: ClusterTls | None) -> str:
    """``address`` as the client will dial it: TLS options make a bare HOST:PORT ``tls://``."""
    if tls is None or not tls.given():
        return address
    if "://" not in address:
        return f"tls://{address}"
    if not address.startswith("tls://"):
        raise SpecsimError(
            f"the --cluster-tls-* options need a tls:// address, not {address!r}",
            key="--cluster",
            fix="write tls://HOST:PORT (or HOST:PORT), or drop the TLS options",
        )
    return address


def _loopback(address: str) -> bool:
    """Whether ``address`` (SCHEME://HOST:PORT or HOST:PORT) names this machine."""
    host = address.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # another host name
        return False


def connect_cluster(address: str, timeout_s: float, tls: ClusterTls | None = None):
    """A Dask client for ``address``, or a one-line error within about ``timeout_s`` seconds."""
    from dask.distributed import Client

    fix = "start a scheduler and workers there (dask scheduler / dask worker ADDRESS) or check it"
    if "://" not in address and ":" not in address:
        raise SpecsimError(
            f"cluster address {address!r} has no port",
            key="--cluster",
            fix="write HOST:PORT or tcp://HOST:PORT",
        )
    address = tls_address(address, tls)
    if not (address.startswith("tls://") or _loopback(address)):
        warnings.warn(
            f"--cluster {address} is plain TCP to another machine: anyone on the network "
            "can read the tasks or send back results, which are unpickled here and run as "
            "code; use tls:// with --cluster-tls-ca-file and --cluster-tls-cert",
            stacklevel=2,
        )
    security = tls.security() if tls is not None and tls.given() else None
    try:
        client = Client(address, timeout=f"{timeout_s}s", security=security, set_as_default=False)
    except Exception as exc:
        reason = " ".join(str(exc).split())[:160] or type(exc).__name__
        # The half-made client closes itself when collected; collected later, inside another
        # client's start, its close waits on that start's loop and the process hangs.
        del exc
        gc.collect()
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
