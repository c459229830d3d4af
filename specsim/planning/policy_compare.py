"""What ``plan window``, ``plan capacity`` and ``report drafter-swap`` share when they compare
window policies: the names ``--policies`` takes, where each policy starts, and the tie rule.

Policies rank by simplicity in ``window_policies.LABELS``' order (the static k, the k-by-batch
table, the goodput policy, then the engines' own policies): contenders equal under a plan's
tie rule go to the simplest, since a lead inside it is no reason to deploy a harder policy.
"""

from __future__ import annotations

from collections.abc import Sequence

from specsim.errors import SpecsimError
from specsim.planning.window.window_policies import (
    ADAPTIVE_STEPS,
    LABELS,
    initial_steps,
    parse_policies,
)

STATIC, BY_BATCH, ADAPTIVE = "static", "by_batch", "adaptive"


def check_names(names: Sequence[str], allowed: Sequence[str], what: str) -> None:
    """One-line error for a ``--policies`` name not in ``allowed`` (``what``: "a policy plan
    window adds", ...)."""
    for name in names:
        if name not in allowed:
            raise SpecsimError(
                f"{name!r} is not {what}",
                key="--policies",
                fix=f"give comma-separated names of: {', '.join(allowed)}",
            )


def compared_policies(given, command: str) -> tuple[str, ...]:
    """``--policies`` for a command that compares every policy ``LABELS`` names: the names in
    ``LABELS``' order, once each (one-line error for any other)."""
    names = parse_policies(given)
    check_names(names, tuple(LABELS), f"a policy {command} compares")
    return tuple(n for n in LABELS if n in names)


def simplicity(name: str) -> int:
    """A policy's rank in ``LABELS`` (0: the static k, the simplest)."""
    return list(LABELS).index(name)


def start_k(name: str, speculation, top: int) -> int:
    """The k a policy's run sets: SGLang's adaptive steps start at the largest of its candidate
    steps within ``top``; every other policy takes ``top`` as its widest window."""
    if name == ADAPTIVE_STEPS:
        return initial_steps(speculation.steps_config.candidate_steps, top)
    return top


def check_reach(names: Sequence[str], speculation, limit: int) -> None:
    """A policy that may choose a window the profile's acceptance cannot answer is refused."""
    if ADAPTIVE_STEPS in names:
        widest = max(speculation.steps_config.candidate_steps)
        if widest > limit:
            raise SpecsimError(
                f"SGLang's adaptive steps may choose {widest} steps, but the profile's "
                f"acceptance for {speculation.drafter!r} answers k up to {limit}",
                key="--policies",
                fix="profile more positions, or give speculation.adaptive_steps tiers within it",
            )
