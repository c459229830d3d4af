"""KV-cache capacity of one replica: the device memory the weights leave, in tokens."""

from __future__ import annotations

from specsim.errors import SpecsimError
from specsim.profile import LoadedProfile
from specsim.scenario import Engine


def kv_capacity_tokens(
    profile: LoadedProfile, drafter: str | None, drafter_loaded: bool, engine: Engine
) -> int:
    """KV-cache tokens: memory left after the weights, over the KV bytes per token of both.

    ``drafter_loaded`` is false for k = 0 (the drafter is not deployed).
    """
    if engine.kv_capacity_tokens is not None:
        return engine.kv_capacity_tokens
    target = profile.profile.target
    draft = profile.drafter(drafter) if (drafter and drafter_loaded) else None
    weights = target.weight_bytes + (draft.weight_bytes if draft else 0)
    per_token = target.kv_bytes_per_token + (draft.kv_bytes_per_token if draft else 0)
    memory = profile.profile.hardware.memory_bytes * engine.memory_utilisation
    if per_token <= 0:
        raise SpecsimError(
            "profile has no target.kv_bytes_per_token, so the KV-cache size is unknown",
            file=str(profile.path),
            key="target.kv_bytes_per_token",
            fix="add it to the profile or set engine.kv_capacity_tokens in the scenario",
        )
    free = memory - weights
    if free < per_token:
        raise SpecsimError(
            f"the weights ({weights / 1e9:.1f} GB) leave no room for a KV cache in "
            f"{memory / 1e9:.1f} GB",
            file=str(profile.path),
            key="hardware.memory_bytes",
            fix="use a larger device, a smaller drafter or raise engine.memory_utilisation",
        )
    return int(free // per_token)
