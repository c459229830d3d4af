"""The local process pool a sweep runs on, whose workers never outlive the sweep.

Each pool worker watches a pipe that only the sweep's process holds open: when the sweep ends
early (an error, Ctrl-C, SIGTERM) it closes the pipe, and when that process is killed the
kernel does. Workers start without the caller's main module (``_main_hidden``).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor

WORKER_STOPPED = 75  # exit status of a worker whose sweep has ended


def new_pool(workers: int) -> tuple[ProcessPoolExecutor, object]:
    """A pool of ``workers`` processes and the write end of its stop pipe: closing it (or this
    process ending) ends every worker."""
    # forkserver: workers start from a clean process, not a copy of this one's threads.
    method = "forkserver" if sys.platform.startswith("linux") else "spawn"
    context = type(multiprocessing.get_context(method))()
    context.Process = _ForkServerWorker if method == "forkserver" else _SpawnWorker
    if method == "forkserver":
        context.set_forkserver_preload(["specsim.planning.sweep.sweeper"])
    watched, stop = context.Pipe(duplex=False)
    pool = ProcessPoolExecutor(
        max_workers=workers,
        mp_context=context,
        initializer=_exit_with_the_sweep,
        initargs=(watched,),
    )
    return pool, stop


@contextlib.contextmanager
def _main_hidden() -> Iterator[None]:
    """Hide the caller's main module from multiprocessing while a worker starts.

    Workers run only specsim's functions, so they never need the caller's script; re-running it
    in each worker would start the sweep again there when it lacks an ``if __name__ ==
    "__main__"`` guard, and fail outright for ``python -`` (no file). Without ``__spec__`` and
    ``__file__`` multiprocessing treats it as ``python -c``: the worker imports no main module.
    """
    main = sys.modules.get("__main__")
    if main is None:
        yield
        return
    saved = {name: vars(main)[name] for name in ("__spec__", "__file__") if name in vars(main)}
    main.__spec__ = None
    vars(main).pop("__file__", None)
    try:
        yield
    finally:
        vars(main).pop("__spec__", None)
        vars(main).update(saved)


class _SpawnWorker(multiprocessing.context.SpawnProcess):
    def start(self) -> None:
        with _main_hidden():
            super().start()


if sys.platform != "win32":

    class _ForkServerWorker(multiprocessing.context.ForkServerProcess):
        def start(self) -> None:
            with _main_hidden():
                super().start()


def _exit_with_the_sweep(watched) -> None:
    """Pool worker start-up: exit when the sweep closes the pipe or its process is gone.

    Only the sweep's process holds the pipe's write end, so end-of-file comes exactly when it
    closes it or dies (SIGKILL included); the worker has nothing of its own to save.
    """

    def wait_for_the_end() -> None:
        with contextlib.suppress(EOFError, OSError):
            while True:
                watched.recv_bytes()
        os._exit(WORKER_STOPPED)

    threading.Thread(target=wait_for_the_end, name="specsim-sweep-watch", daemon=True).start()
