"""The fast path's optional compiled kernels (numba), with the same results as the numpy code.

``pip install 'specsim-llm[fast]'`` adds numba; without it, or with ``SPECSIM_COMPILED=0``, the
numpy code runs. ``SPECSIM_COMPILED=1`` insists on the kernels (a clear error without numba);
unset or ``auto``: the kernels when numba is installed and the run is long enough to repay
compiling them (``MIN_REQUESTS``; a run's choice depends on it alone, or on the requests a sweep
says its process will simulate in all, ``expecting``; never on what the process ran before). The
choice is read when a run starts (``active``), so the benchmarks and the tests can run both in
one process; numba itself is imported only when the kernels first run (``kernels``), so the
short commands never import it.

The kernels compile once per machine: numba's on-disk cache keeps them in
``cache_folder()`` (``$SPECSIM_CACHE_DIR``, else ``$XDG_CACHE_HOME/specsim`` or
``~/.cache/specsim``), in a sub-folder named by a hash of every ``compiled_*.py`` source and of
numba's version. numba checks only a kernel's own file for changes, not the files of the
kernels and constants it uses, so the hash covers them all: an edit anywhere compiles afresh.
A later process, a pool worker or a Dask worker on the machine loads them in well under a
second.

The kernels (``compiled_kernels.py``) do what the numpy code they replace does, value for value:
every number they add up is a whole number below 2^53 (token counts, contexts, query-key pairs),
so the order of the additions cannot change a sum, and the one non-integer operation (a uniform
plus its row's level shift, searched in the acceptance table) is the same float addition and
comparison. The acceptance stream on this path is ``compiled_stream.JumpStream``: numpy's PCG64
stepped in numba, so a stretch draws only its occupied slots' uniforms and jumps over the rest.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import math
import os
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

from specsim.errors import SpecsimError

ENV = "SPECSIM_COMPILED"
# Compiling costs about 6 CPU seconds; the kernels save about 0.15 ms per request at low load
# and 0.03 ms on a saturated replica: below this many requests ``auto`` keeps numpy.
MIN_REQUESTS = 50_000
_loaded: ModuleType | None = None
_expected = 0.0  # requests this process is about to simulate in all (``expecting``)


def available() -> bool:
    """Whether numba is installed (the ``fast`` extra)."""
    return importlib.util.find_spec("numba") is not None


def active(requests: float = math.inf) -> bool:
    """Whether the compiled kernels run (``SPECSIM_COMPILED``: 0, 1 or auto) for a run of
    about ``requests`` requests."""
    setting = os.environ.get(ENV, "auto").strip().lower()
    if setting in ("0", "off", "false", "no"):
        return False
    if setting in ("1", "on", "true", "yes"):
        if not available():
            raise SpecsimError(
                f"{ENV}={setting} asks for the compiled simulator, but numba is not installed; "
                "fix: pip install 'specsim-llm[fast]', or unset it"
            )
        return True
    if setting != "auto":
        raise SpecsimError(f"{ENV}={setting!r} is not one of 0, 1, auto; fix: set one of those")
    if not available():
        return False
    return max(requests, _expected) >= MIN_REQUESTS


@contextlib.contextmanager
def expecting(requests: float) -> Iterator[None]:
    """Within it, ``auto`` counts ``requests``: what this process simulates in all, run after
    run (a sweep's share per worker), so that a sweep of many short runs compiles once and
    gains, where one short run alone would not repay it."""
    global _expected
    before, _expected = _expected, float(requests)
    try:
        yield
    finally:
        _expected = before


# Every kernel module, imported together so that each dispatcher is made under the cache folder.
KERNEL_MODULES = (
    "compiled_kernels",
    "compiled_step_kernel",
    "compiled_loop_kernel",
    "compiled_serving_kernel",
)


def cache_folder() -> Path:
    """Where the compiled kernels are kept: a folder per version of their sources."""
    import numba

    root = os.environ.get("SPECSIM_CACHE_DIR") or Path(
        os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache", "specsim"
    )
    digest = hashlib.sha256(numba.__version__.encode())
    for source in sorted(Path(__file__).parent.glob("compiled_*.py")):
        digest.update(source.name.encode() + b"\0" + source.read_bytes())
    return Path(root, f"numba-{digest.hexdigest()[:16]}")


def kernel_module(name: str = "compiled_kernels") -> ModuleType:
    """A compiled kernels' module (numba imported, and every kernel module loaded from the
    on-disk cache or made to be compiled into it, on the first call)."""
    global _loaded
    if _loaded is None:
        from numba.core import config

        before, config.CACHE_DIR = config.CACHE_DIR, str(cache_folder())
        try:  # each dispatcher takes its cache folder when it is made, at import
            for module in KERNEL_MODULES:
                importlib.import_module(f"specsim.simulation.{module}")
        finally:
            config.CACHE_DIR = before
        _loaded = importlib.import_module("specsim.simulation.compiled_kernels")
    return importlib.import_module(f"specsim.simulation.{name}")


def kernels() -> ModuleType:
    """The stretch kernels' module (``compiled_kernels``)."""
    return kernel_module()
