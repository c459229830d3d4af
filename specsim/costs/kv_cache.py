"""KV-cache capacity of one replica: the device memory the weights leave, in tokens.

A replica that spans several devices (tensor parallelism) holds on each a shard of the target
and, per drafter, a shard or (drafter TP 1) the whole drafter on one device; vLLM sizes every
device's cache alike, so the device holding the most decides: the profile's per-device bytes.

The engine's budget is vLLM's (``Worker.determine_available_memory``): the requested share of
the device less the weights, the profiling pass's activation peak and the memory allocated
outside torch (NCCL, cuBLAS); the figures behind the reservation are in
docs/notes/2026-12-03-kv-budget.md.
"""

from __future__ import annotations

from specsim.errors import SpecsimError
from specsim.profile import LoadedProfile
from specsim.scenario import Engine

GIB = 2**30
# Activation peak of vLLM's profiling pass of max_batched_tokens tokens, in units of one hidden
# state (bf16) per token: Llama-3-8B's 1.19-1.26 GiB at 8,192 tokens, hidden 4,096; the TP-2
# log prints the same peak, so it is not divided by TP.
ACTIVATION_HIDDEN_STATES = 19.5
# Memory outside torch after the profiling pass: 0.1-0.35 GiB on one device in vLLM's logs;
# tensor parallelism adds NCCL and custom all-reduce buffers, 1.79 GiB (TP 2 less TP 1).
NON_TORCH_BYTES = 0.3 * GIB
NON_TORCH_TP_BYTES = 1.79 * GIB


def kv_capacity_tokens(
    profile: LoadedProfile, drafter: str | None, drafter_loaded: bool, engine: Engine
) -> int:
    """KV-cache tokens: one device's memory left after the weights it holds, over the KV bytes
    per token it holds of both models.

    ``drafter_loaded`` is false for k = 0 (the drafter is not deployed).
    """
    check_tensor_parallel(profile, engine)
    if engine.kv_capacity_tokens is not None:
        return engine.kv_capacity_tokens
    target = profile.profile.target
    draft = profile.drafter(drafter) if (drafter and drafter_loaded) else None
    weights = target.device_weight_bytes + (draft.device_weight_bytes if draft else 0)
    per_token = target.device_kv_bytes_per_token + (draft.device_kv_bytes_per_token if draft else 0)
    memory = profile.profile.hardware.memory_bytes * engine.memory_utilisation
    if per_token <= 0:
        raise SpecsimError(
            "profile has no target.kv_bytes_per_token, so the KV-cache size is unknown",
            file=str(profile.path),
            key="target.kv_bytes_per_token",
            fix="add it to the profile or set engine.kv_capacity_tokens in the scenario",
        )
    reserved = engine_reservation_bytes(profile, engine)
    free = memory - weights - reserved
    if free < per_token:
        raise SpecsimError(
            f"the weights ({weights / 1e9:.1f} GB) and the engine's activations and buffers "
            f"({reserved / 1e9:.1f} GB) leave no room for a KV cache in {memory / 1e9:.1f} GB",
            file=str(profile.path),
            key="hardware.memory_bytes",
            fix="use a larger device, a smaller drafter or raise engine.memory_utilisation",
        )
    return int(free // per_token)


def engine_reservation_bytes(profile: LoadedProfile, engine: Engine) -> float:
    """Device memory the engine holds besides weights and KV cache: the activation peak of a
    pass of ``max_batched_tokens`` tokens and the buffers allocated outside torch; nothing for a
    padded engine (specsim's own, Hugging Face generate): it preallocates no cache pool."""
    if engine.padded_attention:
        return 0.0
    hidden = profile.profile.target.hidden_size
    activation = ACTIVATION_HIDDEN_STATES * engine.max_batched_tokens * hidden * 2
    tp = profile.profile.hardware.devices
    return activation + NON_TORCH_BYTES + (NON_TORCH_TP_BYTES if tp > 1 else 0.0)


def check_tensor_parallel(
    profile: LoadedProfile, engine: Engine, key: str = "engine.tensor_parallel_size"
) -> None:
    """A scenario's stated tensor-parallel size (at ``key``) must be the one the profile
    describes: a pass's time, the memory per device and the price all depend on it."""
    stated = engine.tensor_parallel_size
    described = profile.profile.hardware.devices
    if stated is not None and stated != described:
        raise SpecsimError(
            f"the scenario's {key} is {stated} but profile "
            f"{profile.path.name} describes replicas of {described} device(s)",
            file=str(profile.path),
            key=key,
            fix=f"set {key}: {described}, use a profile written "
            f"for {stated} devices (specsim profile roofline --tp {stated}), or scale a "
            "roofline profile with engine.tensor_parallel_scaling (flagged as derived)",
        )


def blocks_for(tokens: int, block_size: int) -> int:
    """KV-cache blocks that hold ``tokens`` slots: vLLM's cdiv(tokens, block_size)."""
    return -(-tokens // block_size)


def kv_capacity_blocks(capacity_tokens: int, block_size: int) -> int:
    """Whole blocks in a cache of ``capacity_tokens`` slots (vLLM sizes the cache as memory over
    the bytes of one block, which rounds the same way)."""
    blocks = capacity_tokens // block_size
    if blocks < 1:
        raise SpecsimError(
            f"a KV cache of {capacity_tokens} tokens holds no block of {block_size}",
            key="engine.block_size",
            fix="lower engine.block_size or give the engine more memory",
        )
    return blocks
