"""Keyword arguments as ``--set`` overrides, so the API is type-checked by the same schema path.

``speculation__k=3`` is ``--set speculation.k=3``: a double underscore stands for each dot (a
dotted key also works, as ``**{"speculation.k": 3}``), and a list item is named by its index
(``fleet__pools__1__speculation__k=2``). Each value is written as the YAML text that reads back
as the same value, so ``specsim.config.apply_overrides`` and the scenario's schema see exactly
what ``--set`` would give them: the same values, the same one-line errors, and (in a sweep's
identity and summary) the same override strings.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from numbers import Integral, Real
from typing import Any

import yaml

from specsim.errors import SpecsimError

KEY_SEPARATOR = "__"


def override_texts(settings: Mapping[str, Any]) -> list[str]:
    """``{"speculation__k": 3}`` -> ``["speculation.k=3"]``, in the order given."""
    out = []
    for name, value in settings.items():
        key = name.replace(KEY_SEPARATOR, ".")
        out.append(f"{key}={value_text(value, key)}")
    return out


def value_text(value: Any, key: str = "value") -> str:
    """The YAML text ``--set KEY=TEXT`` takes for ``value`` (a plain scalar where it reads back
    unchanged, so ``"rejection"`` and ``3`` stay as a command line would write them)."""
    if isinstance(value, str) and value and _reads_back(value):
        return value
    return _flow(value, key)


def _flow(value: Any, key: str) -> str:
    """``value`` as YAML flow text: JSON's spelling, which YAML reads, with YAML's float forms."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, os.PathLike):
        return _flow(os.fspath(value), key)
    if isinstance(value, Integral):
        return str(int(value))
    if isinstance(value, Real):
        return _float_text(float(value))
    if isinstance(value, Mapping):
        items = []
        for name, item in value.items():
            if not isinstance(name, str):
                raise _unwritable(value, key)
            items.append(f"{json.dumps(name, ensure_ascii=False)}: {_flow(item, key)}")
        return "{" + ", ".join(items) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_flow(item, key) for item in value) + "]"
    if hasattr(value, "tolist"):  # a numpy scalar or array
        return _flow(value.tolist(), key)
    raise _unwritable(value, key)


def _float_text(value: float) -> str:
    if math.isnan(value):
        return ".nan"
    if math.isinf(value):
        return ".inf" if value > 0 else "-.inf"
    text = repr(value)
    mantissa, e, exponent = text.partition("e")
    if e and "." not in mantissa:  # YAML 1.1 reads 1e-05 as a string, 1.0e-05 as a float
        text = f"{mantissa}.0e{exponent}"
    return text


def _reads_back(text: str) -> bool:
    try:
        return yaml.safe_load(text) == text
    except (yaml.YAMLError, ValueError):  # ValueError: an integer past Python's digit limit
        return False


def _unwritable(value: Any, key: str) -> SpecsimError:
    return SpecsimError(
        f"cannot pass a {type(value).__name__} as a scenario value",
        file="overrides",
        key=key,
        fix="give a number, a string, True/False, None, or a list or dict of them",
    )
