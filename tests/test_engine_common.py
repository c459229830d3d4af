"""Shared fixtures for the engine, validation and rollout tests: the built-in models, loaded once.

``SPECSIM_TEST_MODELS`` may point at a folder holding the built-in model folders (a freshly
trained family, say); by default the committed built-ins are used.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

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
def model(name: str):
    from specsim.models import load_model

    return load_model(model_spec(name))


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
