"""Load a third-party verifier named ``package.module:function`` or ``path/to/file.py:function``."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path

from specsim.errors import SpecsimError

KEY = "--verifier"


def is_plugin_spec(spec: str) -> bool:
    """A ``module:function`` name rather than a built-in verifier's name."""
    return ":" in spec


def load_verifier(spec: str) -> Callable:
    """The callable that ``spec`` names; a one-line error naming the fix otherwise.

    A module name is imported with the working folder on the path (as ``python -m`` does), so a
    verifier in the current project needs no installation.
    """
    module_name, _, attribute = spec.rpartition(":")
    if not module_name or not attribute.isidentifier():
        raise SpecsimError(
            f"{spec!r} is not MODULE:FUNCTION", key=KEY, fix="write e.g. mypkg.sampler:verify"
        )
    module = _load_file(module_name) if module_name.endswith(".py") else _import(module_name)
    function = getattr(module, attribute, None)
    if function is None:
        raise SpecsimError(
            f"module {module_name!r} has no attribute {attribute!r}",
            key=KEY,
            fix="check the function's name",
        )
    if not callable(function):
        raise SpecsimError(
            f"{spec!r} is a {type(function).__name__}, not a function",
            key=KEY,
            fix="name a function with the verifier signature (see specsim check sampler --help)",
        )
    return function


def _import(name: str):
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        raise SpecsimError(
            f"cannot import {name!r} ({exc.name} not found)",
            key=KEY,
            fix="install the package, run from its folder, or give path/to/file.py:function",
        ) from None
    except Exception as exc:
        raise SpecsimError(
            f"importing {name!r} failed: {type(exc).__name__}: {exc}",
            key=KEY,
            fix="fix the module so that it imports",
        ) from None


def _load_file(path: str):
    file = Path(path)
    if not file.is_file():
        raise SpecsimError("file not found", file=path, key=KEY, fix="check the path")
    spec = importlib.util.spec_from_file_location(f"specsim_plugin_{file.stem}", file)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise SpecsimError(
            f"loading failed: {type(exc).__name__}: {exc}",
            file=path,
            key=KEY,
            fix="fix the file so that it imports",
        ) from None
    return module
