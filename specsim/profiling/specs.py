"""Parsing ``--drafter NAME=SPEC`` arguments.

SPEC is a model (a local Hugging Face folder, a ``config.json`` alone for random weights, or a
built-in name), a prompt-lookup drafter ``ngram`` / ``ngram:N`` (N = n-gram size, default 3), or
``mtp``: the target's own multi-token-prediction module (measured from the target's checkpoint,
or sized by the roofline). Without ``NAME=``, the
name is derived from SPEC.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from specsim.drafters import parse_ngram
from specsim.errors import SpecsimError

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
MTP = "mtp"  # the target's MTP module as the drafter (``ModelShape.mtp_shape``)


@dataclass(frozen=True)
class DrafterArg:
    name: str
    spec: str
    ngram: int | None = None  # n-gram size for prompt lookup; None for a model

    @property
    def is_ngram(self) -> bool:
        return self.ngram is not None

    @property
    def is_mtp(self) -> bool:
        return self.spec == MTP

    @property
    def scored_by_start(self) -> bool:
        """Whether its drafts depend on where a step starts (``acceptance.Scored``'s A[s, i])."""
        return self.is_ngram or self.is_mtp


def default_name(spec: str) -> str:
    if parse_ngram(spec) is not None:
        return "ngram"
    if spec == MTP:
        return MTP
    path = Path(spec)
    stem = path.parent.name if path.name == "config.json" else path.name
    return stem.removesuffix(".json") or "drafter"


def parse_drafter(text: str, option: str = "--drafter") -> DrafterArg:
    name, spec = text.split("=", 1) if "=" in text else ("", text)
    name, spec = name.strip(), spec.strip()
    if not spec:
        raise SpecsimError(
            f"drafter {text!r} has no model",
            file=option,
            fix="write NAME=MODEL, NAME=ngram, NAME=ngram:N or NAME=mtp",
        )
    name = name or default_name(spec)
    if not _NAME.match(name):
        raise SpecsimError(
            f"drafter name {name!r} is not a plain name",
            file=option,
            fix="use letters, digits, '.', '_' or '-'",
        )
    return DrafterArg(name=name, spec=spec, ngram=parse_ngram(spec))


def parse_drafters(texts: list[str], option: str = "--drafter") -> list[DrafterArg]:
    drafters = [parse_drafter(t, option) for t in texts]
    seen: set[str] = set()
    for d in drafters:
        if d.name in seen:
            raise SpecsimError(
                f"drafter name {d.name!r} given twice",
                file=option,
                fix=f"name each drafter: {option} NAME=MODEL",
            )
        seen.add(d.name)
    return drafters
