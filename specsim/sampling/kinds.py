"""The verifiers: one registry, from which every other part takes their names and properties.

Each entry names its batched torch function (in ``specsim.sampling.verifiers``) and its closed
form (a ``ClosedFormRule`` in ``specsim.sampling.reference``) by attribute, resolved on first
use, so importing this module imports neither torch nor numpy (the CLI builds its parser from
it). The profile schema and the scenario take their ``verifier`` values from it, the CLIs their
choices, the checker its subjects, the engine its step, and the profiler how it scores each
verifier. Adding a verifier is one entry here plus its two implementations;
``tests/test_verifier_kinds.py`` resolves every entry's parts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from specsim.sampling.reference import ClosedFormRule


@dataclass(frozen=True)
class AcceptanceScoring:
    """How the profiler turns its per-position scores (``specsim.profiling.scoring``) along the
    target's text into this verifier's acceptance entries.

    ``score``: the per-position acceptance whose first positions give ``token_beta_mean`` and
    the spread across requests; ``walk``: the one the chain statistics walk (given the text,
    for a lossless verifier); ``tv``: the per-position distance of the output from p, for a
    lossy verifier; ``sequences``: the per-request sequences it writes, if any (``beta`` only
    for a draft model); ``at_zero``: also measured at T = 0 when T = 0 is asked for (a
    greedy-reference verifier is measured at T = 0 only, and always).
    """

    score: str
    walk: str
    tv: str | None = None
    sequences: Literal["run_length", "beta"] | None = None
    at_zero: bool = False


@dataclass(frozen=True)
class VerifierKind:
    """One verifier: what it is, where its implementations live, and how it is judged.

    ``lossy``: its output is not the target's distribution (the checker reports its distance,
    reports flag it). ``greedy_reference``: lossless means equal to target-only greedy decoding;
    its acceptance does not depend on temperature.
    """

    name: str
    description: str
    function: str  # the batched torch verifier, an attribute of specsim.sampling.verifiers
    rule: str  # its closed form, a ClosedFormRule in specsim.sampling.reference
    lossy: bool
    greedy_reference: bool
    scoring: AcceptanceScoring

    def load(self) -> Callable[..., Any]:
        """The batched torch function (imports torch)."""
        from specsim.sampling import verifiers

        return getattr(verifiers, self.function)

    def closed_form(self) -> ClosedFormRule:
        """The ``reference.ClosedFormRule`` (imports numpy)."""
        from specsim.sampling import reference

        return getattr(reference, self.rule)


VERIFIER_KINDS: dict[str, VerifierKind] = {
    kind.name: kind
    for kind in (
        VerifierKind(
            "rejection",
            "exact modified rejection sampling",
            function="verify_rejection",
            rule="REJECTION",
            lossy=False,
            greedy_reference=False,
            # Walked given the emitted text (see scoring.py); its per-request means are beta's,
            # the steadier estimate of them.
            scoring=AcceptanceScoring("beta", "text_accept", sequences="beta", at_zero=True),
        ),
        VerifierKind(
            "greedy",
            "greedy verification (lossless means: equals target-only greedy decoding)",
            function="verify_greedy",
            rule="GREEDY",
            lossy=False,
            greedy_reference=True,
            scoring=AcceptanceScoring("match", "match", sequences="run_length"),
        ),
        VerifierKind(
            "typical",
            "Medusa typical acceptance (lossy by design)",
            function="verify_typical",
            rule="TYPICAL",
            lossy=True,
            greedy_reference=False,
            scoring=AcceptanceScoring("typical", "typical", tv="typical_tv"),
        ),
    )
}

DEFAULT_VERIFIER = "rejection"
LOSSY_VERIFIERS = frozenset(name for name, kind in VERIFIER_KINDS.items() if kind.lossy)
VerifierName = Literal[tuple(VERIFIER_KINDS)]  # type: ignore[valid-type]  # schema fields


def verifier_descriptions() -> str:
    """Every verifier with its description, for a schema field or an option's help."""
    return "; ".join(f"'{kind.name}': {kind.description}" for kind in VERIFIER_KINDS.values())


# ----------------------------------------------------------------------------------------------
# Tree verification: the tree-aware extension of the registry above. Each entry extends one
# verifier kind (its lossy and greedy-reference flags are that kind's) to a tree step, for the
# way the drafter drew each node's children from q: "iid" (independent draws), or
# "without-replacement" (each child's token removed before the next is drawn); ``None``: any.
# A deterministic drafter (top-k children, q None) suits either exact entry: they coincide.

TREE_DRAFTS = ("iid", "without-replacement")


@dataclass(frozen=True)
class TreeVerifierKind:
    """One tree verifier: the verifier kind it extends, the drafts it is exact for, and its
    batched torch function (``specsim.sampling.tree_verifiers``) and closed form (a
    ``TreeRule`` in ``specsim.sampling.tree_reference``) by attribute."""

    name: str
    verifier: str  # a VERIFIER_KINDS name
    drafts: str | None  # a TREE_DRAFTS value, or None: any
    description: str
    function: str
    rule: str

    @property
    def kind(self) -> VerifierKind:
        return VERIFIER_KINDS[self.verifier]

    def load(self) -> Callable[..., Any]:
        from specsim.sampling import tree_verifiers

        return getattr(tree_verifiers, self.function)

    def closed_form(self) -> Any:
        from specsim.sampling import tree_reference

        return getattr(tree_reference, self.rule)


TREE_VERIFIER_KINDS: dict[str, TreeVerifierKind] = {
    kind.name: kind
    for kind in (
        TreeVerifierKind(
            "rejection-iid",
            "rejection",
            "iid",
            "multi-draft speculative sampling, children drawn i.i.d. from q (SpecInfer)",
            "verify_tree_rejection",
            "TREE_REJECTION",
        ),
        TreeVerifierKind(
            "rejection-without-replacement",
            "rejection",
            "without-replacement",
            "multi-draft speculative sampling, children drawn without replacement (Sequoia, RSD)",
            "verify_tree_without_replacement",
            "TREE_WITHOUT_REPLACEMENT",
        ),
        TreeVerifierKind(
            "greedy",
            "greedy",
            None,
            "greedy tree: follow the child that is argmax p at every depth",
            "verify_tree_greedy",
            "TREE_GREEDY",
        ),
        TreeVerifierKind(
            "typical",
            "typical",
            None,
            "Medusa typical acceptance over a tree (lossy by design)",
            "verify_tree_typical",
            "TREE_TYPICAL",
        ),
    )
}


def tree_verifier_for(verifier: str, drafts: str) -> TreeVerifierKind:
    """The tree verifier of a verifier kind for children drafted ``drafts`` (TREE_DRAFTS)."""
    for kind in TREE_VERIFIER_KINDS.values():
        if kind.verifier == verifier and kind.drafts in (None, drafts):
            return kind
    raise KeyError(f"no tree verifier for {verifier!r} with {drafts!r} drafts")
