"""Schema-validated YAML configuration (profiles, scenarios) and ``--set`` overrides.

Every configuration model derives from ``StrictModel``: unknown keys are errors, types are checked,
and a validation failure becomes a one-line ``SpecsimError`` naming the file, the dotted key and a
fix. ``--set a.b=value`` overrides are applied to the raw mapping before validation, so they are
type-checked by the same schema.
"""

from __future__ import annotations

import copy
import difflib
import re
import unicodedata
from pathlib import Path
from typing import Annotated, Any, TypeVar

import pydantic

from specsim.errors import SpecsimError
from specsim.fileio import read_yaml
from specsim.parsing import parse_yaml


class StrictModel(pydantic.BaseModel):
    """Base for configuration models: no unknown keys, and every number finite (a key that
    takes nan or inf would say so in its description, and set ``allow_inf_nan`` itself)."""

    model_config = pydantic.ConfigDict(
        extra="forbid", strict=False, frozen=False, allow_inf_nan=False
    )


M = TypeVar("M", bound=StrictModel)

# A spreadsheet opening a CSV runs a cell that starts with one of these as a formula.
FORMULA_STARTS = ("=", "+", "-", "@")


def check_name(value: str) -> str:
    """A name that reaches CSV cells, report titles or file names: printable, not empty, not a
    formula.

    Control characters (and the Unicode line and paragraph separators) would break rows or
    lines; a leading '=', '+', '-' or '@' would be run by a spreadsheet.
    """
    if not value.strip():
        raise ValueError("the name is empty; fix: give a name")
    bad = next((c for c in value if unicodedata.category(c) in ("Cc", "Zl", "Zp")), None)
    if bad is not None:
        raise ValueError(
            f"name {value!r} holds the control character {bad!r}; fix: use printable characters"
        )
    if value.startswith(FORMULA_STARTS):
        raise ValueError(
            f"name {value!r} starts with {value[0]!r}, which a spreadsheet runs as a formula; "
            "fix: start it with a letter or a digit"
        )
    return value


Name = Annotated[str, pydantic.AfterValidator(check_name)]

_FIXES = {
    "extra_forbidden": "remove the key or check its spelling",
    "missing": "add the key",
    "greater_than": "use a larger value",
    "greater_than_equal": "use a larger value",
    "less_than": "use a smaller value",
    "less_than_equal": "use a smaller value",
    "literal_error": "use one of the allowed values",
    "enum": "use one of the allowed values",
    "value_error": "set the keys the message names so that they agree",
    "int_from_float": "give a whole number",
    "int_parsing_size": "give a smaller whole number",
    "finite_number": "give a finite number (not nan or inf)",
    "too_short": "give more items",
    "too_long": "give fewer items",
}


_PYDANTIC_LOC = re.compile(r"^[a-z]+(-[a-z]+)+\[")


def _dotted(loc: tuple[Any, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif parts:
            parts.append(f".{item}")
        else:
            parts.append(str(item))
    return "".join(parts)


def _meant(loc: tuple[Any, ...], errors: list[dict]) -> str | None:
    """The missing key beside an unknown one that its name resembles, if any."""
    missing = [
        str(e["loc"][-1]) for e in errors if e["type"] == "missing" and e["loc"][:-1] == loc[:-1]
    ]
    close = difflib.get_close_matches(str(loc[-1]), missing, n=1, cutoff=0.6)
    return close[0] if close else None


def validation_error(exc: pydantic.ValidationError, source: str) -> SpecsimError:
    """The first problem of a pydantic error as a one-line ``SpecsimError``.

    An unknown key comes first: a misspelt key also leaves the key it meant missing, and the
    misspelling is what the user must find. A missing key beside it is offered as the fix.
    """
    errors = exc.errors(include_url=False)
    err = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    # Function validators and tagged unions add loc entries such as "function-after[...]" that
    # are not keys; drop them. A key may itself hold a hyphen (a drafter named "qwen2.5-0.5b")
    # or a bracket (a mistyped "pools[0]").
    loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and _PYDANTIC_LOC.match(p)))
    key = _dotted(loc) or None
    message = err["msg"]
    own_fix = None
    if err["type"] == "value_error":
        # A model validator's own sentence; pydantic prefixes it with "Value error, ". A
        # validator may end it with "; fix: ..." to give a more precise fix than the generic one.
        message = message.removeprefix("Value error, ")
        message, _, own_fix = message.partition("; fix: ")
    if err["type"] not in ("missing", "extra_forbidden", "value_error") and "input" in err:
        shown = repr(err["input"])
        if len(shown) <= 60:
            message += f" (got {shown})"
    fix = own_fix or _FIXES.get(err["type"])
    if err["type"] == "extra_forbidden":
        meant = _meant(err["loc"], errors)
        fix = f"rename it to {meant!r}, the key it resembles" if meant else fix
    if fix is None:
        # Type and parsing errors (and any other kind): the schema pages list what each key takes.
        fix = "give a value of the expected type (see docs/reference)"
    more = len(exc.errors()) - 1
    if more:
        message += f" (and {more} more problem{'s' if more > 1 else ''})"
    return SpecsimError(message, file=source, key=key, fix=fix)


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"speculation.k=3"`` -> (["speculation", "k"], 3). The value is read as YAML."""
    if "=" not in text:
        raise SpecsimError(
            f"override {text!r} has no '='", file="--set", fix="write --set section.key=value"
        )
    dotted, raw = text.split("=", 1)
    path = [p.strip() for p in dotted.strip().split(".")]
    if not all(path):
        raise SpecsimError(
            f"override key {dotted!r} is empty or has an empty part",
            file="--set",
            fix="write --set section.key=value",
        )
    try:
        value = parse_yaml(raw, "--set") if raw.strip() else ""
    except SpecsimError:  # not YAML: the schema says what the key takes instead
        value = raw
    return path, value


def apply_overrides(data: dict[str, Any], overrides: list[str] | None) -> dict[str, Any]:
    """A copy of ``data`` with each ``key.path=value`` override applied.

    A numeric part indexes a list that is already there: ``fleet.pools.1.speculation.k=2``.
    """
    result = copy.deepcopy(data)
    for text in overrides or []:
        path, value = parse_override(text)
        node: Any = result
        for i, part in enumerate(path):
            parent = ".".join(path[:i])
            if isinstance(node, list):
                if not (part.isdigit() and int(part) < len(node)):
                    raise SpecsimError(
                        f"{parent} is a list of {len(node)}; {part!r} is not an index in it",
                        file="--set",
                        key=".".join(path),
                        fix=f"use an index from 0 to {len(node) - 1}"
                        if node
                        else f"the list is empty: set {parent}=[...] instead",
                    )
                part = int(part)
            elif not isinstance(node, dict):
                raise SpecsimError(
                    f"{parent} is a value, not a section",
                    file="--set",
                    key=".".join(path),
                    fix=f"set {parent}=VALUE itself, or a key of a section",
                )
            if i == len(path) - 1:
                node[part] = value
            elif isinstance(node, dict) and node.get(part) is None:
                node[part] = {}
                node = node[part]
            else:
                node = node[part]
    return result


def validate_as(model: type[M], data: dict[str, Any], source: str) -> M:
    """``data`` validated against ``model``, or the one-line error naming ``source``."""
    try:
        return model.model_validate(data)
    except pydantic.ValidationError as exc:
        raise validation_error(exc, source) from None


def load_yaml_as(
    model: type[M], path: str | Path, overrides: list[str] | None = None, what: str = "YAML file"
) -> M:
    """Read ``path``, apply overrides, validate against ``model``; one-line errors throughout."""
    data = apply_overrides(read_yaml(path, what), overrides)
    source = str(path) + (" (with --set overrides)" if overrides else "")
    return validate_as(model, data, source)
