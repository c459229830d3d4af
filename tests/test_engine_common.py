"""Shared fixtures for the engine, validation and rollout tests: the built-in models, loaded once.

``SPECSIM_TEST_MODELS`` may point at a folder holding the built-in model folders (a freshly
trained family, say); by default the committed built-ins are used.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import yaml

NAMES = ("specsim-target", "specsim-draft-small", "specsim-draft-tiny")


def model_spec(name: str) -> str:
    folder = os.environ.get("SPECSIM_TEST_MODELS")
    return str(Path(folder) / name) if folder else name


def prompts_path() -> str:
    folder = os.environ.get("SPECSIM_TEST_MODELS")
    if folder:
        return str(Path(folder) / "prompts.jsonl")
    from specsim.models import BUILTIN_PROMPTS

    return str(BUILTIN_PROMPTS)


@functools.cache
def model(name: str, device: str = "cpu"):
    from specsim.models import load_model

    return load_model(model_spec(name), device)


@functools.cache
def prompt_bank():
    from specsim.engine.workload import PromptBank
    from specsim.models import load_tokenizer

    return PromptBank.from_file(prompts_path(), load_tokenizer(model_spec("specsim-target")))


def drafter_map() -> dict[str, str]:
    return {
        "small": model_spec("specsim-draft-small"),
        "tiny": model_spec("specsim-draft-tiny"),
        "ngram": "ngram",
    }


def hand_profile(path, slow: float = 1.0, overhead=None, per_position=(0.8, 0.7)):
    """A profile in the shape the profiler writes, with round numbers: target 10 ms + 0.1 ms per
    token, drafter 1 ms + 0.01 ms per token (``slow`` scales time)."""

    def latency(fixed, per_token):
        return {"fit": {"fixed_s": fixed * slow, "per_batched_token_s": per_token * slow}}

    spec = {"kv_bytes_per_token": 4096, "weight_bytes": 10_000_000}
    data = {
        "version": 1,
        "name": "hand",
        "provenance": {"source": "measured", "device": "test", "date": "2026-01-01"},
        "hardware": {"name": "cpu", "memory_bytes": 8e9, "price_per_hour_usd": 0.0},
        "target": {"kind": "target", **spec, "latency": latency(0.01, 1e-4)},
        "drafters": {"small": {"kind": "draft_model", **spec, "latency": latency(0.001, 1e-5)}},
        "overhead": overhead or {"per_step_s": 1e-4},
        "acceptance": [
            {
                "drafter": "small",
                "verifier": "rejection",
                "temperature": 1.0,
                "per_position": list(per_position),
            }
        ],
    }
    path.write_text(yaml.safe_dump(data))
    return path
