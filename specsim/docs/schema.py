"""The profile and scenario reference pages, from the pydantic models: key, type, default,
allowed values and description of every field."""

from __future__ import annotations

import inspect
import sys
import types
import typing
from typing import Any

import annotated_types
import pydantic
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from specsim.docs.markdown import GENERATED, docstring_markdown, table

SCALARS = {str: "string", int: "integer", float: "number", bool: "boolean", type(None): "null"}


def _is_model(tp: Any) -> bool:
    return inspect.isclass(tp) and issubclass(tp, pydantic.BaseModel)


def _constraint_text(items: list[Any]) -> list[str]:
    words = []
    for item in items:
        if isinstance(item, FieldInfo):
            words += _constraint_text(item.metadata)
        elif isinstance(item, annotated_types.Ge):
            words.append(f"≥ {item.ge}")
        elif isinstance(item, annotated_types.Gt):
            words.append(f"> {item.gt}")
        elif isinstance(item, annotated_types.Le):
            words.append(f"≤ {item.le}")
        elif isinstance(item, annotated_types.Lt):
            words.append(f"< {item.lt}")
        elif isinstance(item, annotated_types.MinLen):
            words.append(f"at least {item.min_length} item(s)")
        elif isinstance(item, annotated_types.MaxLen):
            words.append(f"at most {item.max_length} item(s)")
    return words


def describe_type(tp: Any) -> tuple[str, list[str]]:
    """(type in words, allowed values / constraints) for an annotation."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Annotated:
        inner, allowed = describe_type(args[0])
        return inner, allowed + _constraint_text(list(args[1:]))
    if origin is typing.Literal:
        kinds = sorted({SCALARS.get(type(a), "value") for a in args})
        return " or ".join(kinds), [", ".join(f"`{_yaml_value(a)}`" for a in args)]
    if origin in (typing.Union, types.UnionType):
        parts = [describe_type(a) for a in args]
        allowed = [w for _, ws in parts for w in ws]
        return " or ".join(name for name, _ in parts), allowed
    if origin is list:
        inner, allowed = describe_type(args[0])
        return f"list of {inner}", [f"each {w}" for w in allowed]
    if origin is dict:
        key, _ = describe_type(args[0])
        value, allowed = describe_type(args[1])
        return f"mapping {key} → {value}", [f"each value {w}" for w in allowed]
    if origin is tuple:
        return "[" + ", ".join(describe_type(a)[0] for a in args) + "]", []
    if _is_model(tp):
        return f"[{tp.__name__}](#{tp.__name__.lower()})", []
    return SCALARS.get(tp, getattr(tp, "__name__", str(tp))), []


def _yaml_value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return repr(value)
    return str(value)


def default_text(field: FieldInfo) -> str:
    if field.default_factory is not None:
        value = field.default_factory()
        if isinstance(value, pydantic.BaseModel):
            return "its section's defaults"
        return f"`{value!r}`"
    if field.default is PydanticUndefined:
        return "**required**"
    return f"`{_yaml_value(field.default)}`"


def nested_models(tp: Any) -> list[type[pydantic.BaseModel]]:
    """The pydantic models an annotation refers to, in order."""
    if _is_model(tp):
        return [tp]
    found: list[type[pydantic.BaseModel]] = []
    for arg in typing.get_args(tp):
        found += [m for m in nested_models(arg) if m not in found]
    return found


def _holds(tp: Any, container: type) -> bool:
    """Whether an annotation is (or wraps, in a union) a ``container`` such as list or dict."""
    if typing.get_origin(tp) is container:
        return True
    return typing.get_origin(tp) in (typing.Union, types.UnionType) and any(
        _holds(a, container) for a in typing.get_args(tp)
    )


def schema_page(root: type[pydantic.BaseModel], title: str, intro: str) -> str:
    """One Markdown page: a section per model reachable from ``root``, depth first."""
    order: list[type[pydantic.BaseModel]] = []
    used_at: dict[type[pydantic.BaseModel], list[str]] = {root: []}

    def visit(model: type[pydantic.BaseModel], path: str) -> None:
        if model not in order:
            order.append(model)
        for name, field in model.model_fields.items():
            key = f"{path}.{name}" if path else name
            if _holds(field.annotation, list):
                key += "[]"
            elif _holds(field.annotation, dict):
                key += ".<name>"
            for child in nested_models(field.annotation):
                used_at.setdefault(child, []).append(key)
                if child not in order:
                    visit(child, key)

    visit(root, "")
    parts = [f"# {title}", GENERATED, intro]
    for model in order:
        heading = f"## {model.__name__}"
        where = used_at.get(model) or []
        lines = [heading]
        if where:
            lines.append("Used at " + ", ".join(f"`{w}`" for w in where) + ".")
        else:
            lines.append("The top level of the file.")
        doc = docstring_markdown(model.__doc__)
        if doc:
            lines.append(doc)
        rows = []
        for name, field in model.model_fields.items():
            kind, allowed = describe_type(field.annotation)
            allowed += _constraint_text(field.metadata)
            rows.append(
                [
                    f"`{name}`",
                    kind,
                    default_text(field),
                    "; ".join(allowed),
                    field.description or "",
                ]
            )
        lines.append(table(["key", "type", "default", "allowed", "description"], rows))
        parts.append("\n\n".join(lines))
    return "\n\n".join(parts) + "\n"


def schema_pages() -> dict[str, str]:
    from specsim.profile import schema as profile_schema
    from specsim.scenario import Scenario

    scenario_intro = (
        docstring_markdown(sys.modules[Scenario.__module__].__doc__)
        + "\n\nShipped examples: `scenarios/*.yaml`. Unknown keys are errors. Any value can be "
        "overridden on the command line with `--set section.key=value` (type-checked against "
        "this schema). `specsim schema scenario` prints the same schema as JSON Schema."
    )
    profile_intro = (
        docstring_markdown(profile_schema.__doc__)
        + "\n\nShipped profiles and how to make your own: `profiles/README.md`. Unknown keys are "
        "errors. `specsim schema profile` prints the same schema as JSON Schema."
    )
    return {
        "scenario.md": schema_page(Scenario, "Scenario file reference", scenario_intro),
        "profile.md": schema_page(profile_schema.Profile, "Profile file reference", profile_intro),
    }
