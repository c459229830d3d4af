"""A profile's ``provenance``: where its numbers came from (measured, roofline, calibrated on
benchmark runs), the speed reference a measured profile was timed against, and a calibration's
terms, runs and held-out errors."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from specsim.bounds import (
    MAX_COUNT,
    MAX_FACTOR,
    Factor,
    NonNegFactor,
    PositiveSeconds,
    Seconds,
    Share,
)
from specsim.config import StrictModel


class ReferencePasses(StrictModel):
    decode_s: PositiveSeconds = Field(description="the decode pass (batch 1, 128 cached tokens)")
    prefill_s: PositiveSeconds = Field(description="the prefill pass (batch 1, a 96-token prompt)")


class SpeedReference(StrictModel):
    """Timing on a shared CPU (``specsim.engine.speed_reference``): the speeds a profile taken
    with a CPU clock was rescaled to, and how far the machine ran from them."""

    decode_s: PositiveSeconds | None = Field(
        default=None,
        description="--clock reference: the target's decode pass (batch 1, 128 cached tokens) "
        "at the speed every timing is rescaled to; specsim validate --clock reference rescales "
        "the engine's time to it too",
    )
    prefill_s: PositiveSeconds | None = Field(
        default=None,
        description="--clock reference: the target's prefill pass (batch 1, a 96-token prompt) at "
        "the reference speed; passes feeding more tokens than a decode are rescaled between the "
        "two references",
    )
    host_s: PositiveSeconds | None = Field(
        default=None,
        description="--clock reference: the engine's own work in one speculative step without a "
        "model pass at the reference speed; the work between passes is rescaled by it",
    )
    drafters: dict[str, ReferencePasses] | None = Field(
        default=None,
        description="--clock reference: each draft model's own decode and prefill reference "
        "passes at the reference speed; its passes are rescaled by its own probes",
    )
    slowdown: Factor | None = Field(
        default=None,
        description="--clock reference: the median of the target's decode probes during "
        "profiling over its reference (1 = as fast). Well below 1, the references were taken "
        "while the machine was slow and every pass was rescaled from far off: profile again",
    )
    overhead_pass_scale: Factor | None = Field(
        default=None,
        description="--clock cpu or reference: how fast the target's decode passes ran in the "
        "overhead waves against the latency fits (the median of measured / predicted over "
        "target-alone decodes). The overhead terms are fitted against the passes at this "
        "speed, so that the machine's drift between the two measurements stays out of them",
    )


# Profiles written before the block existed carried its keys flat in ``provenance``: read
# them as the block (the mapping is one to one), so no measured profile has to be redone.
FLAT_SPEED_KEYS = {
    "reference_pass_s": "decode_s",
    "reference_prefill_s": "prefill_s",
    "reference_host_s": "host_s",
    "drafter_references": "drafters",
    "reference_slowdown": "slowdown",
    "overhead_pass_scale": "overhead_pass_scale",
}


class BenchFile(StrictModel):
    """A benchmark result file a calibration read (``specsim profile from-bench``)."""

    path: str = Field(description="the file as given on the command line")
    sha256: str = Field(description="of the whole file")
    runs: Annotated[int, Field(ge=1, le=MAX_COUNT)] = Field(description="runs read from it")
    format: str = Field(description="vllm-bench, sglang-bench or normalised-csv")
    engine: str = Field(description="vllm, sglang, trtllm or other, as the file says")
    engine_version: str | None = Field(default=None, description="where the file says")
    model: str | None = Field(default=None, description="the served model, where the file says")


class CalibratedTerm(StrictModel):
    """A term a calibration fitted on its prior profile (``specsim.calibration.terms``)."""

    name: str = Field(description="e.g. target.decode, drafters.NAME.per_speculative_step_s")
    kind: Literal["factor", "seconds"] = Field(
        description="factor: multiplies the prior's terms; seconds: the value itself"
    )
    value: Annotated[float, Field(ge=0, le=MAX_FACTOR)] = Field(description="as written")
    prior: Annotated[float, Field(ge=0, le=MAX_FACTOR)] = Field(description="the prior's value")
    determined: bool = Field(
        description="true: the runs determine it (spread_ratio below the calibration's "
        "threshold) and it was fitted; false: it keeps the prior's value"
    )
    spread_ratio: Annotated[float, Field(ge=0, le=1)] = Field(
        description="the term's posterior standard deviation over its prior's (1: the runs "
        "say nothing of it)"
    )


class HeldOut(StrictModel):
    """Leave one run out: fit on the others, predict it, over every fitted figure."""

    runs: Annotated[int, Field(ge=1, le=MAX_COUNT)]
    median_abs_error: NonNegFactor = Field(description="|predicted / measured - 1|, median")
    max_abs_error: NonNegFactor = Field(description="|predicted / measured - 1|, largest")


class CheckedFigure(StrictModel):
    """One figure over the runs a calibration never saw."""

    runs: Annotated[int, Field(ge=1, le=MAX_COUNT)] = Field(description="runs with the figure")
    median_abs_error: NonNegFactor = Field(description="|predicted / measured - 1|, median")
    max_abs_error: NonNegFactor = Field(description="|predicted / measured - 1|, largest")


class Checked(StrictModel):
    """Runs of the deployment the fit never saw (``profile from-bench --check-runs``),
    predicted on the fitted profile as ``validate --bench`` predicts them."""

    files: list[BenchFile] = Field(min_length=1)
    runs: list[str] = Field(min_length=1, description="the runs' labels")
    figures: dict[str, CheckedFigure] = Field(
        description="per figure (e.g. tpot_s.mean, throughput_tokens_per_s) the error over the runs"
    )


class Calibration(StrictModel):
    """How a calibrated profile was fitted to an engine's own benchmark runs."""

    prior: str = Field(description="the --into profile the terms scale")
    prior_source: str = Field(description="that profile's provenance.source")
    files: list[BenchFile] = Field(min_length=1)
    terms: list[CalibratedTerm]
    threshold: Share = Field(description="a term is determined when its spread ratio is below this")
    fit_median_abs_error: NonNegFactor = Field(
        description="|simulated / measured - 1| over every fitted figure of every run, median"
    )
    held_out: HeldOut | None = Field(
        default=None, description="absent with a single run, or when not computed"
    )
    runs_source: str | None = Field(
        default=None,
        description="where the runs come from, as stated with --runs-source (publication, "
        "address, engine version, date of the runs)",
    )
    checked: Checked | None = Field(
        default=None,
        description="the error on runs the fit never saw, per figure (absent without --check-runs)",
    )
    report: str | None = Field(
        default=None, description="the calibration report beside the profile (JSON)"
    )


class Provenance(StrictModel):
    source: Literal["measured", "calibrated", "published", "roofline"] = Field(
        description="measured on a device, calibrated to a serving engine's own benchmark "
        "runs (specsim profile from-bench), taken from a publication, or a roofline estimate"
    )
    device: str = Field(description="the device the numbers describe, in words")
    date: str = Field(description="ISO date the numbers were produced")
    software: dict[str, str] = Field(default_factory=dict, description="name -> version")
    command: str | None = Field(default=None, description="the command that wrote the profile")
    notes: str = ""
    profiling_seconds: Seconds | None = Field(default=None, description="wall time of profiling")
    calibration: Calibration | None = Field(
        default=None, description="source calibrated: the runs, the fitted terms, their errors"
    )
    speed_reference: SpeedReference | None = Field(
        default=None,
        description="profiled with a CPU clock on a shared machine: the reference speeds and "
        "the machine's drift (absent on a wall clock). The flat keys of older profiles "
        "(reference_pass_s, reference_prefill_s, reference_host_s, drafter_references, "
        "reference_slowdown, overhead_pass_scale) are read into it",
    )

    @model_validator(mode="before")
    @classmethod
    def _speed_keys_into_their_block(cls, data):
        if not isinstance(data, dict) or not FLAT_SPEED_KEYS.keys() & data.keys():
            return data
        if data.get("speed_reference") is not None:
            flat = ", ".join(k for k in FLAT_SPEED_KEYS if k in data)
            raise ValueError(
                f"{flat} and speed_reference both given; fix: keep speed_reference and drop "
                "the older flat keys"
            )
        block = {new: data[old] for old, new in FLAT_SPEED_KEYS.items() if old in data}
        rest = {k: v for k, v in data.items() if k not in FLAT_SPEED_KEYS}
        return {**rest, "speed_reference": block}
