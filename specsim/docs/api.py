"""The Python API's reference page, from the docstrings and signatures of ``specsim.api``."""

from __future__ import annotations

import inspect
from typing import Any

from specsim import api
from specsim.docs.markdown import GENERATED, docstring_markdown

FUNCTIONS = (
    "simulate",
    "plan_window",
    "plan_capacity",
    "plan_disaggregated",
    "drafter_swap",
    "load_run",
)
CLASSES = ("Result", "PlanResult", "ValidationRun", "BenchValidationRun")


def signature_text(name: str, function: Any) -> str:
    """``name(a, *, b=None, **overrides)``: parameters and defaults, no annotations (their
    rendering varies between Python versions; the docstrings say what each takes)."""
    parts = []
    keyword_only = False
    for parameter in inspect.signature(function).parameters.values():
        if parameter.name == "self":
            continue
        if parameter.kind is parameter.KEYWORD_ONLY and not keyword_only:
            parts.append("*")
            keyword_only = True
        if parameter.kind is parameter.VAR_KEYWORD:
            parts.append(f"**{parameter.name}")
        elif parameter.default is parameter.empty:
            parts.append(parameter.name)
        else:
            parts.append(f"{parameter.name}={parameter.default!r}")
    return f"{name}({', '.join(parts)})"


def _members(cls: type) -> list[str]:
    """A class's public methods and properties, each a bullet with its docstring's text."""
    lines = []
    for name, member in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(member, property):
            lines.append(f"- `.{name}`: {_one_paragraph(member.__doc__)}")
        elif inspect.isfunction(member):
            lines.append(f"- `.{signature_text(name, member)}`: {_one_paragraph(member.__doc__)}")
    return lines


def _one_paragraph(text: str | None) -> str:
    return " ".join(inspect.cleandoc(text).replace("``", "`").split()) if text else ""


def api_page() -> str:
    blocks = ["# Python API", GENERATED, docstring_markdown(api.__doc__), "## Functions"]
    for name in FUNCTIONS:
        function = getattr(api, name)
        blocks += [
            f"### `specsim.{signature_text(name, function)}`",
            docstring_markdown(function.__doc__),
        ]
    blocks.append("## What they return")
    for name in CLASSES:
        cls = getattr(api, name)
        blocks += [f"### `specsim.{name}`", docstring_markdown(cls.__doc__)]
        members = _members(cls)
        if members:
            blocks.append("\n".join(members))
    return "\n\n".join(blocks) + "\n"
