"""Parsing ``--drafter NAME=SPEC`` arguments.

SPEC is a model (a local Hugging Face folder, a ``config.json`` alone for random weights, or a
built-in name), a prompt-lookup drafter ``ngram`` / ``ngram:N`` (N = n-gram size, default 3),
``mtp``: the target's own multi-token-prediction module (measured from the target's checkpoint,
or sized by the roofline), or ``eagle:CONFIG`` / ``eagle3:CONFIG``: an EAGLE or EAGLE-3 head
given by its own ``config.json`` (sized by the roofline only, ``specsim.profiling.heads``).
Without ``NAME=``, the name is derived from SPEC.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from specsim.drafters import parse_ngram
from specsim.errors import SpecsimError
from specsim.profiling.heads import BLOCK_METHODS, HEAD_METHODS

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
MTP = "mtp"  # the target's MTP module as the drafter (``ModelShape.mtp_shape``)


@dataclass(frozen=True)
class DrafterArg:
    name: str
    spec: str
    ngram: int | None = None  # n-gram size for prompt lookup; None for a model
    head: str | None = None  # eagle, eagle3, p_eagle or dflash: its config.json is ``spec``
    max_k: int | None = None  # a parallel drafter's block, given as NAME=METHOD:CONFIG:K

    @property
    def is_ngram(self) -> bool:
        return self.ngram is not None

    @property
    def is_mtp(self) -> bool:
        return self.spec == MTP and self.head is None

    @property
    def scored_by_start(self) -> bool:
        """Whether its drafts depend on where a step starts (``acceptance.Scored``'s A[s, i])."""
        return self.is_ngram or self.is_mtp


def split_head(spec: str) -> tuple[str | None, str]:
    """``eagle3:CONFIG`` -> (``eagle3``, ``CONFIG``); anything else -> (None, spec)."""
    method, colon, path = spec.partition(":")
    if colon and method in HEAD_METHODS:
        return method, path.strip()
    return None, spec


def default_name(spec: str) -> str:
    if parse_ngram(spec) is not None:
        return "ngram"
    if spec == MTP:
        return MTP
    spec = split_head(spec)[1]
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
            fix="write NAME=MODEL, NAME=ngram, NAME=ngram:N, NAME=mtp or NAME=eagle3:CONFIG",
        )
    name = name or default_name(spec)
    if not _NAME.match(name):
        raise SpecsimError(
            f"drafter name {name!r} is not a plain name",
            file=option,
            fix="use letters, digits, '.', '_' or '-'",
        )
    head, path = split_head(spec)
    if head is not None:
        if not path:
            raise SpecsimError(
                f"drafter {text!r} names no config",
                file=option,
                fix=f"write NAME={head}:CONFIG, CONFIG the head's config.json",
            )
        config, colon, block = path.rpartition(":")
        if colon and block.isdigit() and int(block) > 0 and head in BLOCK_METHODS:
            return DrafterArg(name=name, spec=config, head=head, max_k=int(block))
        return DrafterArg(name=name, spec=path, head=head)
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


def refuse_heads(drafters: list[DrafterArg], option: str = "--drafter") -> None:
    """Heads are sized by the roofline only: measuring one needs its weights and the target's
    hidden-state taps, which the profiler does not run."""
    for d in drafters:
        if d.head is not None:
            raise SpecsimError(
                f"drafter {d.name!r} is an {d.head} head, which profile measure cannot run",
                file=option,
                fix=f"describe it with specsim profile roofline --drafter {d.name}={d.head}:CONFIG",
            )
