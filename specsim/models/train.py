"""Train the built-in model family (one target, two drafters) on the standard library's source.

    python -m specsim.models.train --out specsim/models/builtin

Reproducible: fixed corpus (see ``corpus.py``; the command says when this Python's corpus differs
from the one the committed weights were trained on), fixed seeds, fixed steps, and the same batches
for every model. The drafters are trained on the same data as the target (no distillation). The
weights are written in the Hugging Face layout (float16) together with ``training.json`` (losses,
pairwise acceptance β, timings) and ``prompts.jsonl`` (prompts from held-out files). Never run in
tests or CI: tests load the committed weights.

``--models NAME,...`` trains a subset (models are independent, so they can train in separate
processes into the same ``--out``); the evaluation runs once all three are there, and
``--models ""`` only evaluates. See builtin/README.md for the figures and the runtime.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from specsim.fileio import dump_json, write_text_atomic
from specsim.models import corpus
from specsim.models.config import ModelConfig
from specsim.models.evaluate import evaluate_family
from specsim.models.loader import load_model, save_model
from specsim.models.tokenizer import BYTE_BOS_ID, BYTE_EOS_ID, BYTE_VOCAB_SIZE
from specsim.models.transformer import DecoderModel

# The corpus the committed weights were trained on (CPython 3.11.7's stdlib).
EXPECTED_CORPUS_SHA256 = "110b1c1c3a8284452cac64add7fef201708f4d6a8a4ef27f25bb8056542e277d"
CONTEXT = 512
PROMPT_COUNT = 64


def _config(
    name: str,
    model_type: str,
    layers: int,
    hidden: int,
    heads: int,
    kv_heads: int,
    intermediate: int,
    tied: bool,
) -> ModelConfig:
    return ModelConfig(
        vocab_size=BYTE_VOCAB_SIZE,
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=hidden // heads,
        intermediate_size=intermediate,
        max_position=CONTEXT,
        rope_theta=10000.0,
        norm_eps=1e-5,
        tie_embeddings=tied,
        model_type=model_type,
        name=name,
        attention_bias=model_type == "qwen2",
        bos_id=BYTE_BOS_ID,
        eos_id=BYTE_EOS_ID,
        tokenizer="bytes",
    )


# Three architectures of clearly different size; together they exercise the loader's variants
# (untied Llama with grouped-query attention, tied Qwen2 with q/k/v biases, tied Mistral). A small
# drafter of 2 x 128 matched the target's held-out loss at this budget, hence 2 x 96.
FAMILY = {
    "specsim-target": _config("specsim-target", "llama", 4, 256, 4, 2, 704, tied=False),
    "specsim-draft-small": _config("specsim-draft-small", "qwen2", 2, 96, 2, 1, 256, tied=True),
    "specsim-draft-tiny": _config("specsim-draft-tiny", "mistral", 1, 64, 1, 1, 176, tied=True),
}


@dataclasses.dataclass(frozen=True)
class TrainSettings:
    steps: int = 400
    batch_size: int = 16
    context: int = CONTEXT
    lr: float = 3e-3
    min_lr_fraction: float = 0.1
    warmup_steps: int = 20
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    seed: int = 1234
    bf16: bool = True


def _lr_at(step: int, s: TrainSettings) -> float:
    if step < s.warmup_steps:
        return s.lr * (step + 1) / s.warmup_steps
    progress = (step - s.warmup_steps) / max(1, s.steps - s.warmup_steps)
    cosine = 0.5 * (1 + math.cos(math.pi * progress))
    return s.lr * (s.min_lr_fraction + (1 - s.min_lr_fraction) * cosine)


def _batches(stream: torch.Tensor, s: TrainSettings):
    """The same sequence of random windows for every model (one generator per run)."""
    generator = torch.Generator().manual_seed(s.seed)
    for _ in range(s.steps):
        starts = torch.randint(
            0, stream.numel() - s.context - 1, (s.batch_size,), generator=generator
        )
        yield torch.stack([stream[i : i + s.context + 1] for i in starts.tolist()])


def train_model(config: ModelConfig, stream: torch.Tensor, s: TrainSettings, log) -> DecoderModel:
    torch.manual_seed(s.seed)
    model = DecoderModel(config)
    model.init_weights(torch.Generator().manual_seed(s.seed))
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": s.weight_decay},
            {"params": no_decay, "weight_decay": 0},
        ],
        lr=s.lr,
        betas=(0.9, 0.95),
    )
    model.train()
    started = time.perf_counter()
    for step, batch in enumerate(_batches(stream, s)):
        for group in optimizer.param_groups:
            group["lr"] = _lr_at(step, s)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=s.bf16):
            logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, config.vocab_size), batch[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), s.grad_clip)
        optimizer.step()
        if step % 25 == 0 or step == s.steps - 1:
            log(
                f"  {config.name} step {step:4d} loss {loss.item():.3f} "
                f"({time.perf_counter() - started:.0f} s)"
            )
    return model.eval()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for the model directories")
    parser.add_argument("--steps", type=int, default=TrainSettings.steps)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--fp32", action="store_true", help="train without bfloat16 autocast")
    parser.add_argument("--eval-windows", type=int, default=96)
    parser.add_argument(
        "--models",
        default=",".join(FAMILY),
        help="comma-separated subset to train (the models train independently, so they can run "
        "in separate processes; the evaluation runs once all are in --out)",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    settings = TrainSettings(steps=args.steps, bf16=not args.fp32)
    chosen = [name.strip() for name in args.models.split(",") if name.strip()]
    unknown = sorted(set(chosen) - set(FAMILY))
    if unknown:
        parser.error(f"unknown model {unknown[0]!r}; choose from {', '.join(FAMILY)}")

    def log(line: str) -> None:
        print(line, flush=True)

    files = corpus.corpus_files()
    sha = corpus.corpus_sha256(files)
    if sha != EXPECTED_CORPUS_SHA256:
        log(
            f"note: this Python's corpus (sha256 {sha[:12]}) differs from the one the committed "
            f"weights were trained on ({EXPECTED_CORPUS_SHA256[:12]}); results will differ"
        )
    train_files, held_files = corpus.split_files(files)
    train_stream = torch.from_numpy(corpus.token_stream(train_files))
    held_stream = torch.from_numpy(corpus.token_stream(held_files))
    log(
        f"corpus: {len(train_files)} training files ({train_stream.numel()} bytes), "
        f"{len(held_files)} held out ({held_stream.numel()} bytes)"
    )

    timings_file = out / "train_seconds.json"
    for name in chosen:
        started = time.perf_counter()
        model = train_model(FAMILY[name], train_stream, settings, log)
        seconds = round(time.perf_counter() - started, 1)
        save_model(model, out / name, dtype=torch.float16)
        timings = json.loads(timings_file.read_text()) if timings_file.is_file() else {}
        timings[name] = seconds
        write_text_atomic(timings_file, dump_json(timings))
    missing = [name for name in FAMILY if not (out / name / "model.safetensors").is_file()]
    if missing:
        log(f"trained {', '.join(chosen)}; evaluation waits for {', '.join(missing)}")
        return 0
    timings = json.loads(timings_file.read_text()) if timings_file.is_file() else {}

    # Evaluate what ships: the float16 files, loaded back as float32 through the public loader.
    shipped = {name: load_model(out / name) for name in FAMILY}
    report = evaluate_family(shipped, held_stream, settings.context, args.eval_windows)
    prompts = corpus.make_prompts(held_files, PROMPT_COUNT, np.random.default_rng(settings.seed))
    write_text_atomic(out / "prompts.jsonl", corpus.prompts_jsonl(prompts))
    report.update(
        command="python -m specsim.models.train --out " + str(args.out),
        corpus={
            "source": "top-level *.py files of the Python standard library, sorted by name",
            "sha256": sha,
            "python": platform.python_version(),
            "files": len(files),
            "held_out_files": [f.name for f in held_files],
        },
        settings=dataclasses.asdict(settings),
        params={name: c.param_count() for name, c in FAMILY.items()},
        train_seconds=timings,
        torch=torch.__version__,
        threads=args.threads,
    )
    write_text_atomic(out / "training.json", dump_json(report))
    log(json.dumps({k: report[k] for k in ("loss_nats_per_byte", "beta", "train_seconds")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
