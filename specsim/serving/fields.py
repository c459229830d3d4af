"""Reading values out of an engine's result: each one checked, each failure one line.

Every number must be finite (``inf`` only where the key allows it: a request rate), not negative
and within specsim's bounds; the error names the file, the run in it, the key and the fix.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from specsim.bounds import MAX_REQUESTS, MAX_SECONDS
from specsim.errors import SpecsimError

AS_WRITTEN = "give the file as the benchmark wrote it"


@dataclass(frozen=True)
class Where:
    """A run in a file: what an error line names."""

    source: str
    run: int = 0  # from 0
    fix: str = AS_WRITTEN  # what to do, unless an error says more

    def error(self, message: str, key: str | None, fix: str | None = None) -> SpecsimError:
        return SpecsimError(
            message, file=f"{self.source} (run {self.run + 1})", key=key, fix=fix or self.fix
        )


def _checked(value: Any, key: str, where: Where, maximum: float, integer: bool, allow_inf: bool):
    if isinstance(value, str) and allow_inf and value.strip().lower() in ("inf", "infinity"):
        value = math.inf
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise where.error(f"{value!r} is not a number", key)
    if math.isnan(value) or (math.isinf(value) and not (allow_inf and value > 0)):
        raise where.error(f"{value} is not a finite number", key)
    if value < 0:
        raise where.error(f"{value:g} is negative", key)
    if math.isinf(value):
        return value
    if value > maximum:
        raise where.error(f"{value:g} is past specsim's bound of {maximum:g}", key)
    if integer:
        if value != int(value):
            raise where.error(f"{value:g} is not a whole number", key)
        return int(value)
    return float(value)


def number(
    data: Mapping[str, Any],
    key: str,
    where: Where,
    maximum: float,
    *,
    integer: bool = False,
    allow_inf: bool = False,
    required: bool = True,
    fix: str | None = None,
) -> Any:
    """``data[key]`` checked (see the module docstring); None when absent or null and not
    ``required``."""
    value = data.get(key)
    if value is None:
        if required:
            raise where.error("missing", key, fix)
        return None
    return _checked(value, key, where, maximum, integer, allow_inf)


def numbers(
    data: Mapping[str, Any], key: str, where: Where, maximum: float, *, integer: bool = False
) -> tuple | None:
    """A list of numbers, each checked; None when the key is absent or null."""
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, Sequence) or isinstance(value, str):
        raise where.error(f"expected a list, found {type(value).__name__}", key)
    return tuple(
        _checked(item, f"{key}[{i}]", where, maximum, integer, False)
        for i, item in enumerate(value)
    )


def text(data: Mapping[str, Any], key: str, where: Where) -> str | None:
    """An optional string value (None when absent or null)."""
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise where.error(f"expected text, found {type(value).__name__}", key)
    return value


def agree(found: float, expected: float, relative: float = 1e-6) -> bool:
    """Two computations of one figure that should match up to float rounding."""
    return abs(found - expected) <= relative * max(abs(found), abs(expected)) + 1e-12


def completed_and_duration(data: Mapping[str, Any], where: Where) -> tuple[int, float]:
    """A run's ``completed`` requests and ``duration`` (vLLM's and SGLang's keys alike); a run
    that completed nothing says nothing of the server."""
    completed = number(data, "completed", where, MAX_REQUESTS, integer=True)
    duration = number(data, "duration", where, MAX_SECONDS)
    if completed == 0 or duration == 0:
        key = "completed" if completed == 0 else "duration"
        raise where.error("the run completed nothing", key, fix="rerun against a working server")
    return completed, duration
