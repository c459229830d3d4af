"""Reading one key of a Hugging Face ``config.json``: type-checked, bounded, and a one-line
``SpecsimError`` naming the file and the key when it is wrong. Shared by the common keys
(``config.py``) and the families' own (``families.py``)."""

from __future__ import annotations

import math
from typing import Any

from specsim.bounds import MAX_DIMENSION
from specsim.errors import SpecsimError

SUPPORTED_ROPE_SCALING = ("default", "linear", "llama3")
# YaRN is read for the families whose reference this decoder is checked against (DeepSeek-V3).
YARN_FAMILIES = ("deepseek_v3",)
_YARN_NUMBERS = ("beta_fast", "beta_slow", "mscale", "mscale_all_dim", "attention_factor")
# Past any model: a dimension or window at bounds.MAX_DIMENSION, a context length at 2**31
# (Llama 4 has 10M positions), a real-valued key (a RoPE base, a cap, a scale, an epsilon) 1e12.
_HIGHEST = {int: MAX_DIMENSION, float: 1e12}
_POSITION_KEYS = ("max_position_embeddings", "original_max_position_embeddings")


def get_key(data: dict[str, Any], key: str, kind: type, source: str, default: Any = ...) -> Any:
    """One key of a config.json, type-checked and, for a number, positive and bounded. bool is
    not accepted where int is expected."""
    if key not in data or data[key] is None:
        if default is ...:
            raise SpecsimError(
                "missing key", file=source, key=key, fix=f"add {key!r} to the config.json"
            )
        return default
    value = data[key]
    is_int = isinstance(value, int) and not isinstance(value, bool)
    ok = isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))
    if not (ok or (kind is float and is_int)):
        raise SpecsimError(
            f"expected {kind.__name__}, got {value!r:.40}",
            file=source,
            key=key,
            fix=f"give a {kind.__name__}",
        )
    if kind not in (int, float):
        return value
    highest = 2**31 if key in _POSITION_KEYS else _HIGHEST[kind]
    if value > highest:  # compared before any conversion: a huge int has no float
        raise SpecsimError(
            f"must be at most {highest:g}, got {value!r:.40}",
            file=source,
            key=key,
            fix="give the model's own value (copy the config.json again)",
        )
    value = float(value) if kind is float else value
    if not (math.isfinite(value) and value > 0):
        raise SpecsimError(
            f"must be positive, got {value!r}", file=source, key=key, fix="give a positive number"
        )
    return value


def token_id(data: dict[str, Any], key: str, source: str) -> int | None:
    """bos/eos ids; Hugging Face allows a list for eos (several stop tokens): take the first."""
    value = data.get(key)
    if isinstance(value, list) and value:
        value = value[0]
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise SpecsimError(
            f"expected a token id, got {value!r}", file=source, key=key, fix="give an integer"
        )
    return value


def read_rope(
    data: dict[str, Any], source: str, default_theta: float = 10000.0, yarn: bool = False
) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, scaling). Older configs have ``rope_theta`` and ``rope_scaling``; newer
    ones (transformers 5) one ``rope_parameters`` mapping holding both. ``yarn``: the family
    may use YaRN scaling."""
    if data.get("rope_parameters") is not None:
        params, key = data["rope_parameters"], "rope_parameters"
        if not isinstance(params, dict):
            raise SpecsimError("expected a mapping", file=source, key=key, fix="give a mapping")
        theta = get_key(
            {f"{key}.rope_theta": params.get("rope_theta")},
            f"{key}.rope_theta",
            float,
            source,
            default_theta,
        )
        return theta, read_rope_scaling(params, source, key, yarn)
    theta = get_key(data, "rope_theta", float, source, default_theta)
    scaling = data.get("rope_scaling")
    if scaling is None:
        return theta, None
    return theta, read_rope_scaling(scaling, source, "rope_scaling", yarn)


def read_rope_scaling(
    scaling: Any, source: str, key: str, yarn: bool = False
) -> dict[str, Any] | None:
    if not isinstance(scaling, dict):
        raise SpecsimError("expected a mapping", file=source, key=key, fix="give a mapping or null")
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type == "yarn" and yarn:
        return _read_yarn(scaling, source, key)
    if rope_type not in SUPPORTED_ROPE_SCALING:
        raise SpecsimError(
            f"rope scaling {rope_type!r} is not supported",
            file=source,
            key=f"{key}.rope_type",
            fix=f"use one of {', '.join(SUPPORTED_ROPE_SCALING)} or remove rope_scaling"
            + (f" (yarn: {', '.join(YARN_FAMILIES)} only)" if rope_type == "yarn" else ""),
        )
    if rope_type == "default":
        return None
    factor = scaling.get("factor")
    if not isinstance(factor, (int, float)) or isinstance(factor, bool) or factor <= 0:
        raise SpecsimError(
            f"expected a positive factor, got {factor!r}",
            file=source,
            key=f"{key}.factor",
            fix="give a positive number",
        )
    if rope_type == "llama3":
        for name in ("low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
            value = scaling.get(name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                raise SpecsimError(
                    f"expected a positive number, got {value!r}",
                    file=source,
                    key=f"{key}.{name}",
                    fix=f"copy {key} from the model's original config.json",
                )
    kept = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    return {"rope_type": rope_type, **{k: scaling[k] for k in kept if k in scaling}}


def _read_yarn(scaling: dict[str, Any], source: str, key: str) -> dict[str, Any]:
    """YaRN's keys as transformers reads them: a factor and the pretrained context length
    (required), the ramp's betas, the attention scale's mscale terms, truncation (optional)."""
    out: dict[str, Any] = {"rope_type": "yarn"}
    for name in ("factor", "original_max_position_embeddings"):
        value = scaling.get(name)
        if not _is_number(value) or value <= 0 or value > 2**31:
            raise SpecsimError(
                f"expected a positive number, got {value!r:.40}",
                file=source,
                key=f"{key}.{name}",
                fix=f"copy {key} from the model's original config.json",
            )
        out[name] = value
    for name in _YARN_NUMBERS:
        value = scaling.get(name)
        if value is None:
            continue
        if not _is_number(value) or not 0 <= value <= _HIGHEST[float]:
            raise SpecsimError(
                f"expected a number from 0 to 1e12, got {value!r:.40}",
                file=source,
                key=f"{key}.{name}",
                fix=f"copy {key} from the model's original config.json",
            )
        out[name] = value
    truncate = scaling.get("truncate")
    if truncate is not None and not isinstance(truncate, bool):
        raise SpecsimError(
            f"expected true or false, got {truncate!r:.40}",
            file=source,
            key=f"{key}.truncate",
            fix="give a boolean or remove the key",
        )
    if truncate is not None:
        out["truncate"] = truncate
    return out


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
