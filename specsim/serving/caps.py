"""The engines' batch caps, by each engine's own keys: the running-sequence cap (specsim's
``engine.max_batch``) and the per-iteration token budget (``engine.max_batched_tokens``).

A benchmark result file does not carry them (SGLang's ``server_info`` aside), so a run is
replayed with the caps read from its server's log or flags file when one is given
(``read_server_args``), otherwise with the engine version's own defaults for the device
(``CapRule.defaults``), and every output says which.

- vLLM: ``EngineArgs.get_batch_defaults`` (``vllm/engine/arg_utils.py``, vLLM 0.33.0 wheel,
  commit 4ba787ec9: engine-formats.md section 3.6), the API server's values: a device of at
  least 70 GiB whose name has no "a100" gets 1,024 sequences and 8,192 tokens (16,384 from
  160 GiB), any other 256 sequences and 2,048 tokens.
- SGLang: ``max_running_requests`` is 48 when speculating and unset (engine-formats.md section
  4.5), otherwise sized from the KV cache pool (no cap of its own: specsim's largest batch,
  the KV cache then limits); ``chunked_prefill_size`` by device memory
  (``python/sglang/srt/server_args.py``): below 35 GiB 2,048, below 160 GiB 8,192, else 16,384.
- TensorRT-LLM: ``max_batch_size`` 2,048 and ``max_num_tokens`` 8,192 (``llm_args.py``
  @ 0004396, engine-formats.md section 5.5).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from specsim.bounds import MAX_BATCH

GIB = 2**30
CAPS = ("max_batch", "max_batched_tokens")  # specsim's scenario keys, in CapRule.keys order


@dataclass(frozen=True)
class Device:
    """What an engine's defaults depend on: the device's name and its memory in bytes."""

    name: str
    memory_bytes: float


@dataclass(frozen=True)
class CapRule:
    keys: tuple[str, str]  # the engine's own names of CAPS
    # (device or None, speculating) -> (max_batch, max_batched_tokens, why in words)
    defaults: Callable[[Device | None, bool], tuple[int, int, str]]


def _memory(device: Device | None) -> float:
    return 0.0 if device is None else device.memory_bytes


def _vllm(device: Device | None, speculating: bool) -> tuple[int, int, str]:
    memory = _memory(device)
    on = "no device known" if device is None else f"{device.name}, {memory / GIB:.0f} GiB"
    if memory >= 70 * GIB and "a100" not in device.name.lower():
        tokens = 16384 if memory >= 160 * GIB else 8192
        return 1024, tokens, f"vLLM 0.33's API-server default ({on})"
    return 256, 2048, f"vLLM 0.33's API-server default ({on}: below 70 GiB or an A100)"


def _sglang(device: Device | None, speculating: bool) -> tuple[int, int, str]:
    memory = _memory(device)
    tokens = 4096 if device is None else 2048 if memory < 35 * GIB else 8192
    tokens = 16384 if memory >= 160 * GIB else tokens
    running = 48 if speculating else MAX_BATCH
    why = "48 when speculating" if speculating else "sized by the KV cache: no cap of its own"
    on = "no device known" if device is None else f"{device.name}, {memory / GIB:.0f} GiB"
    return running, tokens, f"SGLang's default ({why}; {on})"


def _trtllm(device: Device | None, speculating: bool) -> tuple[int, int, str]:
    return 2048, 8192, "TensorRT-LLM's default (llm_args.py)"


VLLM = CapRule(("max_num_seqs", "max_num_batched_tokens"), _vllm)
SGLANG = CapRule(("max_running_requests", "chunked_prefill_size"), _sglang)
TRTLLM = CapRule(("max_batch_size", "max_num_tokens"), _trtllm)


def _pattern(key: str) -> re.Pattern:
    """``--max-num-seqs 512``, ``--max-num-seqs=512``, ``max_num_seqs=512`` (a ServerArgs
    repr), ``'max_num_seqs': 512`` (vLLM's non-default args), ``max_batch_size: 512`` (YAML)."""
    name = key.replace("_", "[-_]")
    return re.compile(rf"(?<![\w-])(?:--)?{name}['\"]?\s*(?:=|:|\s)\s*['\"]?(\d+)\b")


def states_flag(text: str, flag: str) -> bool:
    """Whether a server log or flags file turns ``flag`` on: ``--enable-mixed-chunk`` (a
    switch on the command line), ``enable_mixed_chunk=True`` (a ServerArgs repr),
    ``enable_mixed_chunk: true`` (YAML); the last mention decides."""
    name = flag.replace("_", "[-_]")
    mentions = re.findall(rf"(?<![\w-])(?:--)?{name}(?![\w-])['\"]?(\s*[=:]\s*['\"]?\w+)?", text)
    if not mentions:
        return False
    value = mentions[-1].strip(" =:'\"").lower()
    return value in ("", "true", "1")


def read_server_args(text: str, rule: CapRule) -> dict[str, int]:
    """The caps a server log or flags file states, by specsim's keys (the last mention of
    each: a log repeats its arguments at most as they were given)."""
    found = {}
    for cap, key in zip(CAPS, rule.keys, strict=True):
        values = _pattern(key).findall(text)
        if values:
            found[cap] = int(values[-1])
    return found
