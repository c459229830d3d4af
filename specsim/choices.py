"""The named choices of a scenario that the simulator implements: window policies and routers.

One registry each, names and what they mean. The scenario schema's literals and descriptions
(and so its reference page) come from here; the simulation keys its implementations by these
names (``WINDOW_POLICY_CLASSES`` in ``specsim.simulation.policy``, ``ROUTER_CLASSES`` in
``specsim.simulation.fleet``) and checks that each has one. The registry sits below the
scenario because the scenario may not import the simulation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class Choice:
    name: str
    description: str  # a clause for the schema: "'name': description"


def registry(*choices: Choice) -> dict[str, Choice]:
    return {choice.name: choice for choice in choices}


def schema_literal(choices: dict[str, Choice]) -> Any:
    """The schema type that accepts exactly the registry's names."""
    return Literal[tuple(choices)]


def schema_description(choices: dict[str, Choice]) -> str:
    """The names with their meanings, for a schema description: "'a': ...; 'b': ..."."""
    return "; ".join(f"'{c.name}': {c.description}" for c in choices.values())


def check_implemented(choices: dict[str, Choice], implementations: dict, what: str) -> None:
    """Fail the import of an implementing module unless it covers exactly the registry's
    names: a name a scenario may choose must never reach the simulation unimplemented."""
    missing = sorted(set(choices) - set(implementations))
    unlisted = sorted(set(implementations) - set(choices))
    if missing or unlisted:
        raise ImportError(f"{what}: none implements {missing}; not in the registry: {unlisted}")


WINDOW_POLICIES = registry(
    Choice("fixed", "always k"),
    Choice("by_batch", "k from `k_by_batch` by running batch size"),
    Choice(
        "adaptive",
        "before each iteration, the k in 0..k that saves the most step time for this batch, "
        "from the engine's own cost model (see specsim.simulation.policy); it cannot remove the "
        "cost of having a drafter deployed",
    ),
    Choice(
        "adaptive_steps",
        "SGLang's --speculative-adaptive: per batch-size tier, steps chosen among candidates by "
        "a moving average of accepted drafts (`adaptive_steps`; k is the initial steps)",
    ),
    Choice(
        "adaptive_verification",
        "vLLM's enable_adaptive_verification: every row drafts k; each iteration verifies the "
        "budget of drafts with the most expected tokens per second of step time, the drafts "
        "most likely to survive first, so rows verify different lengths",
    ),
)

ROUTERS = registry(
    Choice("round_robin", "in turn"),
    Choice("least_outstanding", "to the replica with the fewest queued plus running requests"),
    Choice("random", "uniformly at random"),
    Choice(
        "cache_aware",
        "as sglang-router's cache_aware policy, for `workload.prefix` source 'session': a turn "
        "goes to the replica that remembers its session's previous turn, unless that replica's "
        "queued plus running requests exceed the least loaded one's by more than "
        "`fleet.balance_abs_threshold`; otherwise (and for every other workload) as "
        "'least_outstanding'",
    ),
)
