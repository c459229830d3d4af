"""A scenario's engine-side switches on speculation, beside the window policy: TensorRT-LLM's
acceptance off-switch, SGLang's adaptive-steps constants, and a shift in acceptance part-way
through a workload (to see when the off-switch trips and how adaptive steps follow).

The models sit below ``specsim.scenario`` (which holds them in ``speculation``); the simulation
implements them (``specsim.simulation.engine_policies``, ``specsim.simulation.acceptance``).
The defaults are the engines' own, read from their source (cited where each is used).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from specsim.bounds import MAX_COUNT, MAX_FACTOR, MAX_K, MAX_REQUESTS, BatchSize, Seconds
from specsim.config import StrictModel

# SGLang 0.5.23 ``sglang/srt/speculative/adaptive_spec_params.py``: DEFAULT_ADAPTIVE_CONFIG (the
# tiers, keyed by the smallest batch each applies to) and AdaptiveStepSlot's defaults.
SGLANG_TIERS = (
    (1, (1, 3, 5, 7), 0.0, -0.25),
    (8, (0, 1, 3), 0.0, 0.0),
    (32, (0, 1), 0.0, 0.0),
    (64, (0,), 0.0, 0.0),
)
SGLANG_EMA_ALPHA = 0.2
SGLANG_UPDATE_INTERVAL = 5
SGLANG_WARMUP_BATCHES = 10
SGLANG_DOWN_HYSTERESIS = -0.25
SGLANG_UP_HYSTERESIS = 0.0

Steps = Annotated[int, Field(ge=0, le=MAX_K)]
Hysteresis = Annotated[float, Field(ge=-32, le=32)]
Iterations = Annotated[int, Field(ge=1, le=MAX_COUNT)]


class AcceptanceGate(StrictModel):
    """TensorRT-LLM's acceptance off-switch (``acceptance_rate_threshold``,
    ``acceptance_rate_window_size``): once the mean of the last ``window`` speculating
    iterations' acceptance rates (accepted drafts / drafted tokens, the whole batch's) falls
    below ``threshold``, speculation is off for the rest of the run, on every row."""

    threshold: Annotated[float, Field(gt=0, le=1)] = Field(
        description="acceptance rate (accepted / drafted tokens) below which speculation turns "
        "off for good; TensorRT-LLM's acceptance_rate_threshold"
    )
    window: Iterations = Field(
        description="speculating iterations averaged (one sample each; the switch can trip "
        "from the window-th on); TensorRT-LLM's acceptance_rate_window_size"
    )


class AdaptiveTier(StrictModel):
    """One of SGLang's adaptive tiers: the batch sizes from ``min_batch`` up to the next tier's
    run its own steps, chosen from ``candidate_steps`` by its own moving average."""

    min_batch: BatchSize = Field(
        description="smallest running batch this tier applies to (SGLang's config key); "
        "batches below the first tier use the first"
    )
    candidate_steps: list[Steps] = Field(
        min_length=1, description="the draft lengths (speculative_num_steps) it may choose; 0: off"
    )
    up_hysteresis: Hysteresis | None = Field(
        default=None, description="added to each rise threshold (default: the config's)"
    )
    down_hysteresis: Hysteresis | None = Field(
        default=None, description="added to each drop threshold (default: the config's)"
    )


def _sglang_tiers() -> list[AdaptiveTier]:
    return [
        AdaptiveTier(min_batch=b, candidate_steps=list(s), up_hysteresis=up, down_hysteresis=down)
        for b, s, up, down in SGLANG_TIERS
    ]


class AdaptiveSteps(StrictModel):
    """SGLang's ``--speculative-adaptive-config`` (its defaults when absent): per tier, an EMA of
    the accepted drafts per request, updated every decode batch; after ``warmup_batches``, every
    ``update_interval`` batches the steps move down while the EMA is at or below
    (a lower candidate - 0.5 + down_hysteresis) and otherwise up while it is above
    (the current steps - 0.5 + up_hysteresis); a tier at 0 steps probes the next candidate.
    SGLang's ``ceiling_coeff`` (0, off, in every default tier) is not modelled."""

    ema_alpha: Annotated[float, Field(gt=0, le=1)] = Field(
        default=SGLANG_EMA_ALPHA, description="weight of each batch's mean in the EMA"
    )
    update_interval: Iterations = Field(
        default=SGLANG_UPDATE_INTERVAL, description="batches between decisions"
    )
    warmup_batches: Annotated[int, Field(ge=0, le=MAX_COUNT)] = Field(
        default=SGLANG_WARMUP_BATCHES, description="batches before the first decision"
    )
    up_hysteresis: Hysteresis = Field(
        default=SGLANG_UP_HYSTERESIS, description="tiers' default rise hysteresis"
    )
    down_hysteresis: Hysteresis = Field(
        default=SGLANG_DOWN_HYSTERESIS, description="tiers' default drop hysteresis"
    )
    tiers: list[AdaptiveTier] = Field(
        default_factory=_sglang_tiers,
        min_length=1,
        description="the tiers, by increasing min_batch (default: SGLang's four)",
    )

    @model_validator(mode="after")
    def _ordered(self) -> AdaptiveSteps:
        starts = [tier.min_batch for tier in self.tiers]
        if starts != sorted(set(starts)):
            raise ValueError("adaptive_steps.tiers must have increasing min_batch")
        return self

    @property
    def candidate_steps(self) -> list[int]:
        """Every tier's candidates together (SGLang sizes its buffers, and checks the initial
        --speculative-num-steps, against this union)."""
        return sorted({s for tier in self.tiers for s in tier.candidate_steps})

    def engine_config(self) -> dict:
        """The JSON SGLang reads from --speculative-adaptive-config: global knobs, then one
        entry per tier keyed by its min_batch (a tier's entry overrides the globals)."""
        out: dict = {
            "ema_alpha": self.ema_alpha,
            "update_interval": self.update_interval,
            "warmup_batches": self.warmup_batches,
            "up_hysteresis": self.up_hysteresis,
            "down_hysteresis": self.down_hysteresis,
        }
        for tier in self.tiers:
            entry: dict = {"candidate_steps": list(tier.candidate_steps)}
            for key in ("up_hysteresis", "down_hysteresis"):
                if getattr(tier, key) is not None:
                    entry[key] = getattr(tier, key)
            out[str(tier.min_batch)] = entry
        return out


class AcceptanceShift(StrictModel):
    """The workload's acceptance changes part-way: requests sent from a stated index or time on
    accept at the profile's conditional rates times ``factor`` (capped at 1). One trigger."""

    after_requests: Annotated[int, Field(ge=0, le=MAX_REQUESTS)] | None = Field(
        default=None, description="requests with this arrival index or later (0-based) shift"
    )
    after_s: Seconds | None = Field(
        default=None, description="requests sent at or after this simulated time shift"
    )
    factor: Annotated[float, Field(ge=0, le=MAX_FACTOR)] = Field(
        description="multiplies every per-position acceptance rate (0: nothing accepted)"
    )

    @model_validator(mode="after")
    def _one_trigger(self) -> AcceptanceShift:
        if (self.after_requests is None) == (self.after_s is None):
            raise ValueError("acceptance_shift needs exactly one of after_requests and after_s")
        return self

    def applies(self, rid: int, arrival: float) -> bool:
        if self.after_requests is not None:
            return rid >= self.after_requests
        return arrival >= self.after_s
