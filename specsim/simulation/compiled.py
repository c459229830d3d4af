"""The fast path's compiled kernels (numba): the simulator's hot loop, compiled once per machine.

numba is a dependency of the base install; the kernels are imported when a fast-path replica
first runs (``kernel_module``), so commands that simulate nothing never import numba.

The kernels compile once per machine: numba's on-disk cache keeps them in
``cache_folder()`` (``$SPECSIM_CACHE_DIR``, else ``$XDG_CACHE_HOME/specsim`` or
``~/.cache/specsim``), in a sub-folder named by a hash of every ``compiled_*.py`` source and of
numba's version, and of the cost formula they compile (``kernel_sources``). numba checks only a
kernel's own file for changes, not the files of the functions and constants it uses, so the
hash covers them all: an edit anywhere compiles afresh.
A later process, a pool worker or a Dask worker on the machine loads them in well under a
second.

The kernels (``compiled_kernels.py``) do what the per-iteration reference does, value for value:
every number they add up is a whole number below 2^53 (token counts, contexts, query-key pairs),
so the order of the additions cannot change a sum, and the one non-integer operation (a uniform
plus its row's level shift, searched in the acceptance table) is the same float addition and
comparison. The acceptance stream on this path is ``compiled_stream.JumpStream``: numpy's PCG64
stepped in numba, so a kernel draws only its occupied slots' uniforms and jumps over the rest.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import tempfile
import warnings
from pathlib import Path
from types import ModuleType

_loaded: ModuleType | None = None


# Every kernel module, imported together so that each dispatcher is made under the cache folder.
KERNEL_MODULES = (
    "compiled_kernels",
    "compiled_step_kernel",
    "compiled_kv_kernel",
    "compiled_policy_kernel",
    "compiled_admission_kernel",
    "compiled_prefill_kernel",
    "compiled_serving_kernel",
)


def cache_folder() -> Path:
    """Where the compiled kernels are kept: a folder per version of their sources."""
    import numba

    root = os.environ.get("SPECSIM_CACHE_DIR") or Path(
        os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache", "specsim"
    )
    digest = hashlib.sha256(numba.__version__.encode())
    for source in kernel_sources():
        digest.update(source.name.encode() + b"\0" + source.read_bytes())
    return Path(root, f"numba-{digest.hexdigest()[:16]}")


def kernel_sources() -> list[Path]:
    """Every file the kernels are compiled from: the ``compiled_*.py`` modules and the cost
    formula they compile (``costs/formula.py``, with the pass latency it calls)."""
    package = Path(__file__).parent.parent
    return [
        *sorted(Path(__file__).parent.glob("compiled_*.py")),
        package / "costs" / "formula.py",
        package / "profile" / "latency.py",
    ]


def writable(folder: Path) -> Path:
    """``folder``, made if need be; a temporary one where it cannot be written (a read-only
    home): the kernels then compile once per process instead of once per machine."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder):
            return folder
    except OSError:
        return Path(tempfile.mkdtemp(prefix="specsim-numba-"))


def kernel_module(name: str = "compiled_kernels") -> ModuleType:
    """A compiled kernels' module (numba imported, and every kernel module loaded from the
    on-disk cache or made to be compiled into it, on the first call)."""
    global _loaded
    if _loaded is None:
        from numba.core import config

        if config.DISABLE_JIT:  # Python runs the source: PCG64's 64-bit products wrap on purpose
            warnings.filterwarnings(
                "ignore", "overflow encountered", RuntimeWarning, r"specsim\.simulation\.compiled_"
            )
        before, config.CACHE_DIR = config.CACHE_DIR, str(writable(cache_folder()))
        try:  # each dispatcher takes its cache folder when it is made, at import
            for module in KERNEL_MODULES:
                importlib.import_module(f"specsim.simulation.{module}")
        finally:
            config.CACHE_DIR = before
        _loaded = importlib.import_module("specsim.simulation.compiled_kernels")
    return importlib.import_module(f"specsim.simulation.{name}")


def kernels() -> ModuleType:
    """The shared kernels' module (``compiled_kernels``: the PCG64 stream)."""
    return kernel_module()
