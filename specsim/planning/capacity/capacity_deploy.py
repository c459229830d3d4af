"""The deployments ``plan capacity`` compares: a replica's tensor-parallel size and formats.

A deployment is a profile: given (``--profile``, which carries its TP and precision) or built
by the roofline per TP and precision from a model and a hardware file (``--tp``, ``--precision``
with ``--hardware``, ``--target-model``, ``--draft-model``; ``specsim.profiling.roofline``, the
same arithmetic as ``profile roofline``). A roofline that does not fit (weights over the
device memory, heads that do not split) is kept as a deployment that does not fit, with the
one-line reason, so the report can say why it was left out. A replica's price is its profile's
(``tp`` devices at the device's price), so a fleet costs replicas x tp x the device's price.
"""

from __future__ import annotations

import hashlib
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specsim.errors import SpecsimError

DEPLOYMENTS_DIR = "deployments"  # under --out: the profiles built per TP, which the runs load
KV_FORMATS = ("bfloat16", "float16", "fp8")
SHORT_FORMATS = {
    "bf16": "bfloat16",
    "fp16": "float16",
    "fp8": "fp8",
    "int4": "int4",
    "nvfp4": "nvfp4",
    "mxfp4": "mxfp4",
}
SHORT_NAMES = {v: k for k, v in SHORT_FORMATS.items()}


@dataclass(frozen=True)
class Precision:
    """Weight and KV-cache formats of a roofline deployment (``--precision fp8``, ``int4/fp8``)."""

    weights: str
    kv_cache: str

    @property
    def label(self) -> str:
        w, kv = SHORT_NAMES.get(self.weights, self.weights), SHORT_NAMES.get(self.kv_cache)
        weights_only = self.weights not in KV_FORMATS  # int4, FP4: no KV cache of their own
        return w if kv == w or (weights_only and kv == "bf16") else f"{w}/{kv}"


def parse_precision(text: str, option: str = "--precision") -> Precision:
    """``WEIGHTS[/KV]``: the KV cache follows the weights where it can (int4, FP4: bf16)."""
    weights, slash, kv = text.strip().lower().partition("/")
    if not slash:
        kv = weights if SHORT_FORMATS.get(weights) in KV_FORMATS else "bf16"
    if weights not in SHORT_FORMATS or SHORT_FORMATS.get(kv) not in KV_FORMATS:
        raise SpecsimError(
            f"unknown precision {text!r}",
            key=option,
            fix="give WEIGHTS[/KV] with weights bf16, fp16, fp8, int4, nvfp4 or mxfp4 and KV "
            "bf16, fp16 or fp8, e.g. fp8 or nvfp4/fp8",
        )
    return Precision(SHORT_FORMATS[weights], SHORT_FORMATS[kv])


@dataclass
class Deployment:
    """One way to deploy a replica. ``profile`` is None when it does not fit (``reason``)."""

    label: str
    tp: int
    precision: str
    source: str  # "scenario", "given" or "roofline"
    profile: Any = None  # a LoadedProfile
    reason: str | None = None
    text: str | None = None  # a built profile's YAML, written by ``write_built`` before runs

    def digest(self) -> str | None:
        """What the runs depend on: the profile's content."""
        if self.profile is None:
            return None
        if self.text is not None:
            return hashlib.sha256(self.text.encode()).hexdigest()
        from specsim.planning.sweep.points import file_digest

        return file_digest(self.profile.path)

    @property
    def fits(self) -> bool:
        return self.profile is not None

    # A deployment is what the search prices and simulates: another kind (prefill and decode
    # pools) gives its own devices, replica price and overrides.
    @property
    def devices(self) -> int:
        """Devices one replica takes."""
        return self.tp

    @property
    def replica_price(self) -> float:
        """A replica's price per hour: the profile's, tp x the device's."""
        return self.profile.profile.hardware.price_per_hour_usd

    @property
    def device_price(self) -> float | None:
        return None if self.profile is None else self.replica_price / self.devices

    def overrides(self) -> list[str]:
        """What a simulation of this deployment changes in the scenario."""
        if self.source == "scenario":
            return []
        return [
            f"profile={Path(self.profile.path).resolve()}",
            f"engine.tensor_parallel_size={self.tp}",
        ]

    def identity(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "tp": self.tp,
            "precision": self.precision,
            "profile": None if self.profile is None else str(Path(self.profile.path).resolve()),
            "reason": self.reason,
            "content": self.digest(),
        }


def profile_precision(profile) -> str:
    """A profile's target formats as a label (bf16, fp8, int4/fp8): its precision block, or
    the profile's own dtype (taken as bf16)."""
    spec = profile.profile.target.precision
    if spec is None:
        return "bf16"
    return Precision(spec.weights, spec.kv_cache).label


def given_deployments(paths: list[str]) -> list[Deployment]:
    """Deployments from profile files, each with the TP and precision it describes."""
    from specsim.profile import load_profile

    result = []
    for path in paths:
        profile = load_profile(path)
        tp = profile.profile.hardware.devices
        label = f"TP{tp} {profile_precision(profile)}"
        result.append(Deployment(label, tp, profile_precision(profile), "given", profile))
    return _unique_labels(result)


@dataclass(frozen=True)
class RooflineRecipe:
    """What ``profile roofline`` needs, less the TP and precision the search varies."""

    hardware: str
    target: str
    drafters: list[str]  # --draft-model texts: NAME=CONFIG or ngram[:N]
    acceptance_from: str | None = None
    draft_tp: int | None = None  # None: each TP's own (vLLM's default)
    expert_parallel: bool = False  # a mixture of experts' experts whole over TP > 1 devices


def roofline_deployments(
    recipe: RooflineRecipe, tps: list[int], precisions: list[Precision], out: Path
) -> list[Deployment]:
    """A roofline profile per (TP, precision), written under ``out/deployments``; a split or a
    size that does not fit becomes a deployment that does not fit, with its reason."""
    from specsim.profile import LoadedProfile
    from specsim.profiling.parallel import DoesNotFit
    from specsim.profiling.roofline import load_hardware, roofline_profile
    from specsim.profiling.specs import parse_drafters
    from specsim.profiling.writer import profile_yaml

    hw = load_hardware(recipe.hardware)
    drafters = parse_drafters(recipe.drafters, "--draft-model")
    for drafter in drafters:
        if not (drafter.is_ngram or drafter.is_mtp or Path(drafter.spec).exists()):
            raise SpecsimError(
                f"no model config at {drafter.spec!r}",
                file="--draft-model",
                fix="write NAME=CONFIG.json (a config.json or its folder), NAME=ngram, NAME=mtp "
                "or NAME=eagle3:CONFIG.json",
            )
    folder = out / DEPLOYMENTS_DIR
    result = []
    for tp in tps:
        for precision in precisions:
            weights = None if precision.weights == hw.dtype else precision.weights
            kv = None if precision.kv_cache == hw.dtype else precision.kv_cache
            ep = recipe.expert_parallel and tp > 1  # one device has nothing to deal out
            label = f"TP{tp} {precision.label}" + (" EP" if ep else "")
            name = f"{Path(recipe.target).stem}-{Path(recipe.hardware).stem}-tp{tp}-"
            name += precision.label.replace("/", "-") + ("-ep" if ep else "") + "-roofline"
            draft_tp = None if recipe.draft_tp is None else min(recipe.draft_tp, tp)
            try:
                profile = roofline_profile(
                    hardware_path=recipe.hardware,
                    target_path=recipe.target,
                    drafters=drafters,
                    name=name,
                    acceptance_path=recipe.acceptance_from,
                    command=profile_command(recipe, tp, draft_tp, weights, kv, folder / name, ep),
                    tp=tp,
                    draft_tp=draft_tp,
                    weights_dtype=weights,
                    kv_dtype=kv,
                    expert_parallel=ep,
                )
            except DoesNotFit as exc:
                reason = exc.message + (f" ({exc.key})" if exc.key else "")
                result.append(Deployment(label, tp, precision.label, "roofline", reason=reason))
                continue
            loaded = LoadedProfile(profile, folder / f"{name}.yaml")
            deployment = Deployment(label, tp, precision.label, "roofline", loaded)
            deployment.text = profile_yaml(profile)
            result.append(deployment)
    return _unique_labels(result)


def write_built(deployments: list[Deployment]) -> None:
    """Write the roofline-built profiles the runs load (once the plan has been checked)."""
    from specsim.fileio import write_text_atomic

    for d in deployments:
        if d.text is not None:
            Path(d.profile.path).parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(d.profile.path, d.text)


def profile_command(
    recipe: RooflineRecipe, tp, draft_tp, weights, kv, out: Path, ep: bool = False
) -> str:
    """The ``specsim profile roofline`` command that writes the same profile."""
    words = ["specsim", "profile", "roofline", "--hardware", recipe.hardware]
    words += ["--target", recipe.target]
    for drafter in recipe.drafters:
        words += ["--drafter", drafter]
    if recipe.acceptance_from:
        words += ["--acceptance-from", recipe.acceptance_from]
    words += ["--out", f"{out}.yaml"]
    if tp != 1:
        words += ["--tp", str(tp)]
    if draft_tp is not None:
        words += ["--draft-tp", str(draft_tp)]
    if weights:
        words += ["--weights-dtype", SHORT_NAMES.get(weights, weights)]
    if kv:
        words += ["--kv-dtype", SHORT_NAMES.get(kv, kv)]
    if ep:
        words.append("--enable-expert-parallel")
    return shlex.join(words)


def _unique_labels(deployments: list[Deployment]) -> list[Deployment]:
    """Two deployments of one label (two given profiles, both TP4 bf16) get numbered."""
    seen: dict[str, int] = {}
    for d in deployments:
        seen[d.label] = seen.get(d.label, 0) + 1
    counts: dict[str, int] = {}
    for d in deployments:
        if seen[d.label] > 1:
            counts[d.label] = counts.get(d.label, 0) + 1
            d.label = f"{d.label} #{counts[d.label]}"
    return deployments


@dataclass(frozen=True)
class DeploymentRequest:
    """The deployments a capacity plan searches: given profiles and roofline builds."""

    profiles: tuple[str, ...] = ()
    recipe: RooflineRecipe | None = None
    tps: tuple[int, ...] = (1,)
    precisions: tuple[Precision, ...] = ()

    def build(self, out: Path) -> list[Deployment]:
        built = given_deployments(list(self.profiles))
        if self.recipe is not None:
            precisions = list(self.precisions) or [Precision("bfloat16", "bfloat16")]
            built += roofline_deployments(self.recipe, list(self.tps), precisions, out)
        return _unique_labels(built)


def parse_tp_values(text: str, option: str = "--tp") -> tuple[int, ...]:
    """``1,2,4,8``: distinct tensor-parallel sizes, sorted."""
    from specsim.bounds import MAX_TENSOR_PARALLEL

    values = set()
    for part in (p.strip() for p in text.split(",")):
        if not part.isdigit() or not 1 <= int(part) <= MAX_TENSOR_PARALLEL:
            raise SpecsimError(
                f"tensor-parallel size {part!r} is not a whole number from 1 to "
                f"{MAX_TENSOR_PARALLEL}",
                key=option,
                fix="give sizes such as 2,4,8",
            )
        values.add(int(part))
    return tuple(sorted(values))


def deployment_request(
    profiles: list[str] | None,
    tps: str | None,
    precisions: list[str] | None,
    hardware: str | None,
    target_model: str | None,
    draft_models: list[str] | None,
    acceptance_from: str | None,
    draft_tp: int | None,
    expert_parallel: bool = False,
) -> DeploymentRequest | None:
    """The deployments the options ask for (None: the scenario's profile only)."""
    sizes = parse_tp_values(tps) if tps is not None else (1,)
    formats = tuple(parse_precision(p) for text in (precisions or []) for p in text.split(","))
    roofline = {"--tp": tps, "--precision": precisions, "--draft-model": draft_models}
    roofline |= {"--acceptance-from": acceptance_from, "--draft-tp": draft_tp}
    roofline["--enable-expert-parallel"] = expert_parallel or None
    asked = [option for option, value in roofline.items() if value is not None]
    if (asked or target_model) and not hardware:
        raise SpecsimError(
            f"{', '.join(asked or ['--target-model'])} build roofline deployments, which need "
            "--hardware and --target-model",
            key="--hardware",
            fix="add --hardware HW.yaml --target-model CONFIG.json, or drop "
            + ", ".join(asked or ["--target-model"]),
        )
    if hardware and not target_model:
        raise SpecsimError(
            "--hardware builds roofline deployments, which need --target-model",
            key="--target-model",
            fix="add --target-model CONFIG.json (the target's config.json)",
        )
    if not (profiles or hardware):
        return None
    recipe = None
    if hardware:
        recipe = RooflineRecipe(
            hardware,
            target_model,
            list(draft_models or []),
            acceptance_from,
            draft_tp,
            expert_parallel,
        )
    return DeploymentRequest(tuple(profiles or ()), recipe, sizes, formats)
