"""A roofline profile scaled to another tensor-parallel size: a stated derivation, flagged.

A scenario that asks for a TP its profile does not describe is refused unless it opts in with
``engine.tensor_parallel_scaling`` (the link the all-reduces cross). Only a roofline profile
scales: its fit is the roofline's sum of terms (``specsim.profiling.roofline``), so each term
can be taken apart and rebuilt for ``t1`` devices from the profile's ``t0``:

* weight read ``knee x slope`` (a mixture of experts' routed experts' read apart, in the
  fit's experts term) and matmul compute ``slope - all-reduce per token`` shrink by
  ``t0 / t1``; the launch overhead ``fixed - weight read - all-reduce per pass`` stays;
* the all-reduces, two ring all-reduces per layer of ``hidden x 2`` bytes a token, are taken
  out at ``t0`` and put in at ``t1`` over the stated link;
* KV bytes per device and attention FLOPs (decode's and prefill's) shrink by ``t0 / t1`` (KV
  heads are taken to divide over the devices: the profile does not say how many there are, and
  with fewer heads than devices vLLM replicates them, which this does not see);
* a replica's price is ``t1 / t0`` times the profile's; a device's memory stays.

Draft models sharded like the target follow it; a draft model on one device stays there. A
measured or calibrated profile is refused: how its passes scale over devices is unknown. The
derived profile says all of this in its provenance.
"""

from __future__ import annotations

import pydantic
from pydantic import Field

from specsim.bounds import Bytes, Seconds, Share
from specsim.config import StrictModel, validation_error
from specsim.errors import SpecsimError
from specsim.profile.latency import LatencyFit
from specsim.profile.schema import ModelSpec, Profile, Sharding

ACTIVATION_BYTES = 2  # the all-reduced activations stay in 16 bits whatever the weights
ALLREDUCES_PER_LAYER = 2  # after attention and after the MLP


class TensorParallelScaling(StrictModel):
    """The link the scaled profile's all-reduces cross (the profile's own are taken out over
    the same link): per direction per device, as the hardware files give it."""

    bandwidth_bytes_per_s: Bytes = Field(description="per device, per direction")
    latency_s: Seconds = Field(description="per ring step")
    efficiency: Share = Field(
        default=0.8, description="share of the link bandwidth an all-reduce reaches"
    )


def ring_allreduce_seconds(nbytes: float, devices: int, bandwidth: float, latency: float) -> float:
    """A ring all-reduce of ``nbytes`` over ``devices``: ``2 (p - 1)`` steps of the latency and
    ``2 (p - 1) / p`` of the bytes at ``bandwidth`` (Thakur, Rabenseifner and Gropp 2005)."""
    if devices == 1:
        return 0.0
    steps = 2 * (devices - 1)
    return steps * latency + steps / devices * nbytes / bandwidth


def allreduce_seconds(
    layers: int, hidden: int, devices: int, link: TensorParallelScaling
) -> tuple[float, float]:
    """(seconds per token, seconds per pass) of a pass's all-reduces over ``devices``."""
    count = ALLREDUCES_PER_LAYER * layers
    bandwidth = link.bandwidth_bytes_per_s * link.efficiency
    per_token = count * ring_allreduce_seconds(hidden * ACTIVATION_BYTES, devices, bandwidth, 0)
    return per_token, count * ring_allreduce_seconds(0, devices, bandwidth, link.latency_s)


def scaled_fit(
    fit: LatencyFit, spec: ModelSpec, t0: int, t1: int, link: TensorParallelScaling, where: str
) -> LatencyFit:
    """``fit`` of a model sharded over ``t0`` devices, rebuilt for ``t1`` (module docstring)."""
    memory = fit.knee_tokens * fit.per_batched_token_s
    token0, pass0 = allreduce_seconds(spec.layers, spec.hidden_size, t0, link)
    token1, pass1 = allreduce_seconds(spec.layers, spec.hidden_size, t1, link)
    compute = fit.per_batched_token_s - token0
    experts = fit.experts
    experts_s = experts.weights_s if experts is not None else 0.0  # read by share, not fixed
    launch = fit.fixed_s - memory - pass0
    if compute <= 0 or launch < -1e-5 * fit.fixed_s or not spec.layers or not spec.hidden_size:
        raise SpecsimError(
            "its latency fit is not the roofline's sum of terms over the stated link, so it "
            "cannot be taken apart",
            file=where,
            key="engine.tensor_parallel_scaling",
            fix="state the link the profile was written with, or write a profile for this TP "
            "(specsim profile roofline --tp N)",
        )
    shrink = t0 / t1
    slope = compute * shrink + token1
    return fit.model_copy(
        update={
            "fixed_s": memory * shrink + max(launch, 0.0) + pass1,
            "per_batched_token_s": slope,
            "knee_tokens": memory * shrink / slope,
            "per_kv_token_s": fit.per_kv_token_s * shrink,
            "per_attention_pair_s": fit.per_attention_pair_s * shrink,
            "per_prefill_pair_s": None
            if fit.per_prefill_pair_s is None
            else fit.per_prefill_pair_s * shrink,
            "experts": None
            if experts is None
            else experts.model_copy(update={"weights_s": experts_s * shrink}),
            "held_out": None,
        }
    )


def _scaled_spec(
    spec: ModelSpec, t0: int, t1: int, link: TensorParallelScaling, where: str
) -> ModelSpec:
    devices = spec.sharding.tensor_parallel_size if spec.sharding else 1
    if spec.latency is None or (devices == 1 and t0 > 1):
        return spec  # a prompt-lookup drafter, or a draft model on one device
    new = t1 if devices == t0 else devices
    latency = spec.latency.model_copy(
        update={"fit": scaled_fit(spec.latency.fit, spec, devices, new, link, where)}
    )
    sharding = None
    if t1 > 1:
        sharding = Sharding(
            tensor_parallel_size=new,
            weight_bytes_per_device=round(spec.weight_bytes / new),
            kv_bytes_per_token_per_device=round(spec.kv_bytes_per_token / new),
        )
    return spec.model_copy(update={"latency": latency, "sharding": sharding})


def _not_scalable(spec: ModelSpec) -> str | None:
    """Why a sharded spec's terms do not divide over devices as the scaling assumes, or None."""
    sharding = spec.sharding
    if sharding is None:
        return None
    if sharding.expert_parallel_size:
        return "deals its experts over the devices (expert parallelism: all-to-all exchanges)"
    per_device, devices = sharding.kv_bytes_per_token_per_device, sharding.tensor_parallel_size
    # Per-device bytes are written rounded: half a byte a device is not a replicated cache.
    if per_device is not None and per_device * devices > spec.kv_bytes_per_token + devices:
        return "keeps a KV cache that is not divided over the devices (latent or replicated)"
    return None


def scale_profile(profile: Profile, tp: int, link: TensorParallelScaling, where: str) -> Profile:
    """``profile`` (a roofline over ``t0`` devices) as a roofline over ``tp``, flagged."""
    t0 = profile.hardware.devices
    if profile.provenance.source != "roofline":
        raise SpecsimError(
            f"profile {profile.name!r} is {profile.provenance.source}, so how its passes scale "
            f"from {t0} to {tp} devices is unknown",
            file=where,
            key="engine.tensor_parallel_scaling",
            fix=f"measure or write a profile for {tp} devices, or drop "
            "engine.tensor_parallel_scaling",
        )
    for name, spec in (("target", profile.target), *profile.drafters.items()):
        why = _not_scalable(spec)
        if why is not None:
            raise SpecsimError(
                f"profile {profile.name!r}: {name} {why}, which this scaling (weights, KV heads "
                "and two all-reduces per layer, each divided over the devices) does not model",
                file=where,
                key="engine.tensor_parallel_scaling",
                fix=f"write a roofline for {tp} devices (profile roofline --tp {tp}), or drop "
                "engine.tensor_parallel_scaling",
            )
    hardware = profile.hardware.model_copy(
        update={
            "tensor_parallel_size": tp if tp > 1 else None,
            "price_per_hour_usd": profile.hardware.price_per_hour_usd * tp / t0,
        }
    )
    note = (
        f" Derived (engine.tensor_parallel_scaling): scaled from {t0} to {tp} device(s) by the "
        "roofline's arithmetic, not written from the model and hardware files: weight read, "
        f"matmul compute, KV bytes and attention per device x {t0}/{tp}; two ring all-reduces "
        f"per layer over the stated link ({link.bandwidth_bytes_per_s / 1e9:g} GB/s x "
        f"{link.efficiency:g}, {link.latency_s * 1e6:g} us a step) taken out at {t0} and put "
        f"in at {tp}; KV heads taken to divide over the devices; price x {tp}/{t0}."
    )
    provenance = profile.provenance.model_copy(
        update={
            "device": f"{tp} x {hardware.name} (tensor parallel; derived from {t0})",
            "notes": profile.provenance.notes + note,
        }
    )
    scaled = profile.model_copy(
        update={
            "name": f"{profile.name}-scaled-tp{tp}",
            "provenance": provenance,
            "hardware": hardware,
            "target": _scaled_spec(profile.target, t0, tp, link, where),
            "drafters": {
                name: _scaled_spec(spec, t0, tp, link, where)
                for name, spec in profile.drafters.items()
            },
        }
    )
    try:
        return Profile.model_validate(scaled.model_dump())
    except pydantic.ValidationError as exc:
        # A slow link within the schema's bounds can still put a pass past any real one.
        problem = validation_error(exc, where)
        raise SpecsimError(
            f"the profile scaled over this link is out of bounds ({problem.key}: "
            f"{problem.message})",
            file=where,
            key="engine.tensor_parallel_scaling.bandwidth_bytes_per_s",
            fix="state the link's real bandwidth (bytes per second, per direction)",
        ) from None


def scaled_note(profile: Profile) -> str | None:
    """The derivation note of a scaled profile (None: not derived)."""
    notes = profile.provenance.notes
    at = notes.find(" Derived (engine.tensor_parallel_scaling)")
    return None if at < 0 else notes[at + 1 :]
