"""What the losslessness checker judges: a built-in verifier, a negative control, or a user
callable (``package.module:function`` or a function object)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from specsim.errors import SpecsimError
from specsim.sampling import plugin, reference
from specsim.sampling.controls import CONTROLS
from specsim.sampling.kinds import VERIFIER_KINDS, VerifierKind


@dataclass(frozen=True)
class Subject:
    """What is being checked: a built-in verifier, a negative control, or a user callable."""

    name: str
    description: str
    rule: reference.ClosedFormRule | None  # None: no closed form (a user callable)
    greedy_reference: bool  # judged against target greedy decoding instead of sampling
    lossy_by_design: bool
    verify_with_raw_q: bool  # the raw-q control: hand the verifier softmax(raw drafter logits)
    load: Callable[[], Callable]  # returns the torch verifier (imports torch)
    negative_control: bool = False


def _builtin(kind: VerifierKind) -> Subject:
    return Subject(
        kind.name, kind.description, kind.closed_form(), kind.greedy_reference, kind.lossy,
        False, kind.load,
    )  # fmt: skip


VERIFIERS: dict[str, Subject] = {name: _builtin(kind) for name, kind in VERIFIER_KINDS.items()}


def subject_for(
    verifier: str | Callable, greedy_reference: bool = False, lossy_by_design: bool = False
) -> Subject:
    """The Subject for a built-in name, a control name, a ``module:function`` name or a
    verifier callable."""
    if isinstance(verifier, str) and plugin.is_plugin_spec(verifier):
        loaded = plugin.load_verifier(verifier)
        return _callable_subject(loaded, verifier, greedy_reference, lossy_by_design)
    if callable(verifier):
        name = getattr(verifier, "__name__", type(verifier).__name__)
        return _callable_subject(verifier, name, greedy_reference, lossy_by_design)
    if verifier in VERIFIERS:
        return VERIFIERS[verifier]
    if verifier in CONTROLS:
        c = CONTROLS[verifier]
        return Subject(
            c.name, f"negative control: {c.description}", c.rule, False, False,
            c.verify_with_raw_q, lambda: c.verifier, negative_control=True,
        )  # fmt: skip
    names = ", ".join([*VERIFIERS, *CONTROLS])
    raise SpecsimError(
        f"unknown verifier {verifier!r}", key="--verifier", fix=f"use {names} or MODULE:FUNCTION"
    )


def _callable_subject(function, name, greedy_reference, lossy_by_design) -> Subject:
    what = "user-supplied verifier" + (" (lossy by design)" if lossy_by_design else "")
    return Subject(name, what, None, greedy_reference, lossy_by_design, False, lambda: function)
