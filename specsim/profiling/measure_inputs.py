"""The measured profiler's inputs: the device, the models' configurations and weights, the
prompt set, and what the profile says of the machine (checked before minutes of timing)."""

from __future__ import annotations

import platform
from dataclasses import dataclass, field
from pathlib import Path

from specsim.errors import SpecsimError
from specsim.profiling.specs import DrafterArg

DTYPES = {"float32": 4, "bfloat16": 2, "float16": 2}
CPU_MAX_PROMPTS, CPU_MAX_NEW = 24, 48
CUDA_MAX_PROMPTS, CUDA_MAX_NEW = 64, 128


@dataclass
class MeasureOptions:
    target: str
    drafters: list[DrafterArg]
    name: str
    device: str = "cpu"
    dtype: str | None = None
    grid: list[str] = field(default_factory=list)
    prompts: str | None = None
    temperatures: list[float] = field(default_factory=lambda: [1.0])
    time_budget: float | None = None
    repeats: int | None = None
    clock: str = "wall"
    seed: int = 0
    max_new_tokens: int | None = None
    max_prompts: int | None = None
    acceptance: bool = True
    sequences_prefix: str | None = None
    command: str | None = None
    trees: list = field(default_factory=list)  # TreeShape: tree acceptance to measure
    tree_drafts: list[str] = field(default_factory=list)  # keep these draftings (empty: all)


def device_name(device: str) -> str:
    import torch

    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"CPU: {model}, {torch.get_num_threads()} torch threads"


def check_device(device: str) -> None:
    """A clear error for a device this machine does not have (before any model loads)."""
    import torch

    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise SpecsimError(
                "CUDA is not available on this machine",
                file="--device",
                fix="use --device cpu, or run on a machine with a GPU",
            )
    elif device != "cpu":
        raise SpecsimError(f"unknown device {device!r}", file="--device", fix="cpu or cuda")


def check_options_device(opts: MeasureOptions):
    import torch

    check_device(opts.device)
    dtype = opts.dtype or ("bfloat16" if opts.device.startswith("cuda") else "float32")
    if dtype not in DTYPES:
        raise SpecsimError(
            f"unknown dtype {dtype!r}", file="--dtype", fix=f"use one of {', '.join(DTYPES)}"
        )
    return dtype, getattr(torch, dtype)


def check_mtp_clock(opts: MeasureOptions) -> None:
    """The reference clock's speed probes time ``(tokens, cache)`` passes of a model, which an
    MTP module (fed the target's hidden states) does not take."""
    mtp = next((d for d in opts.drafters if d.is_mtp), None)
    if mtp is not None and opts.clock == "reference":
        raise SpecsimError(
            f"the reference clock does not probe MTP modules (drafter {mtp.name}=mtp)",
            file="--clock",
            fix="use --clock cpu or --clock wall with an mtp drafter",
        )


def prompt_ids(opts: MeasureOptions, tokenizer, max_position: int, max_new: int):
    from specsim.workload.prompts import read_prompts

    path = opts.prompts
    if path is None:
        from specsim.models import BUILTIN_PROMPTS

        if not Path(BUILTIN_PROMPTS).is_file():
            raise SpecsimError(
                "no prompt set given and the built-in one is missing",
                file="--prompts",
                fix="pass --prompts FILE (.jsonl or text), or --no-acceptance",
            )
        path = BUILTIN_PROMPTS
    texts = read_prompts(path)
    limit = opts.max_prompts or (CUDA_MAX_PROMPTS if opts.device != "cpu" else CPU_MAX_PROMPTS)
    keep = max_position - max_new
    ids = [tokenizer.encode(t, add_bos=True)[-keep:] for t in texts[:limit]]
    return [i for i in ids if i], str(path), len(texts)


def check_model_configs(opts: MeasureOptions) -> None:
    """Every model's config.json read (a bad one refused, and a target without the MTP
    module an mtp drafter needs) before any loads, and --max-new-tokens within the models'
    positions."""
    from specsim.models import load_config
    from specsim.models.deepseek_mtp import check_has_mtp

    specs = [opts.target, *(d.spec for d in opts.drafters if not (d.is_ngram or d.is_mtp))]
    configs = [load_config(spec) for spec in specs]
    if any(d.is_mtp for d in opts.drafters):  # a target without the module, before it loads
        check_has_mtp(configs[0], opts.target)
    max_position = min(config.max_position for config in configs)
    if opts.max_new_tokens is not None and opts.max_new_tokens >= max_position:
        raise SpecsimError(
            f"{opts.max_new_tokens} generated tokens per prompt leave no room for a prompt in "
            f"the models' {max_position} positions",
            file="--max-new-tokens",
            fix=f"give fewer than {max_position}",
        )


def load_models(opts: MeasureOptions, dtype) -> dict:
    from specsim.models import load_model, load_mtp_drafter

    models = {"target": load_model(opts.target, opts.device, dtype, seed=opts.seed)}
    vocab = models["target"].config.vocab_size
    for d in opts.drafters:
        if d.is_ngram:
            continue
        if d.is_mtp:  # the target checkpoint's own module, sharing its vocabulary
            models[d.name] = load_mtp_drafter(
                opts.target, models["target"], opts.device, dtype, seed=opts.seed
            )
            continue
        models[d.name] = load_model(d.spec, opts.device, dtype, seed=opts.seed)
        if models[d.name].config.vocab_size != vocab:
            raise SpecsimError(
                f"drafter vocabulary {models[d.name].config.vocab_size} differs from the "
                f"target's {vocab}",
                file=d.spec,
                key="vocab_size",
                fix="pair the target with a drafter that shares its tokenizer",
            )
    return models


def software() -> dict[str, str]:
    import torch

    from specsim.profiling.writer import software_versions

    return software_versions({"torch": torch.__version__})


def hardware_block(device: str) -> dict:
    """Device memory; price 0 for a CPU (edit it), peak numbers unknown for a measured device."""
    import torch

    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(torch.device(device))
        return {
            "name": props.name,
            "memory_bytes": float(props.total_memory),
            "price_per_hour_usd": 0.0,
        }
    try:
        import os

        memory = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        memory = 1.0e9
    return {"name": device_name(device), "memory_bytes": memory, "price_per_hour_usd": 0.0}
