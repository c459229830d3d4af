"""Models: one decoder in plain torch (Llama and its relatives), its KV cache, loaders, built-ins.

Public API::

    from specsim.models import load_model, load_tokenizer, BUILTIN_MODELS
    model = load_model(spec, device="cpu", dtype=torch.float32)
    cache = model.new_cache(batch_size, max_len)   # per-row lengths: cache.lengths [B]
    logits = model(tokens, cache, n_new=None)      # [B, T, V] float32; rows append at their own
                                                   # positions; n_new[b] real tokens per row
    cache.rollback(new_lengths)                    # drop rejected tokens, O(batch)
    cache.view(start, stop)                        # rows start:stop, sharing storage
    cache.reset(rows)                              # empty rows for new sequences
    tok = load_tokenizer(spec)                     # encode / decode / bos_id / eos_id
    load_config(spec)                              # ModelConfig without building the model
    save_model(model, directory, dtype)            # config.json + model.safetensors (HF layout)
    load_mtp_drafter(spec, target)                 # DeepSeek-V3's MTP module, as a drafter
    BUILTIN_PROMPTS                                # 64 held-out prompts, {"prompt": ...} per line

``spec`` is a built-in name (``specsim-target``, ``specsim-draft-small``, ``specsim-draft-tiny``),
a Hugging Face model directory (``config.json`` + ``model.safetensors`` or a sharded index;
model_type llama, mistral, qwen2, qwen3, gemma, gemma2, gemma3_text, phi3, mixtral, qwen3_moe or
deepseek_v3, each family's differences read by ``families.py``; both the ``rope_theta``/
``rope_scaling`` keys and transformers 5's ``rope_parameters``; default, linear and llama3 RoPE
scaling, and YaRN for DeepSeek-V3), or a
``config.json`` alone (seeded random weights). Sliding windows are applied (per layer where
Gemma 2/3 alternate); Qwen2's and Qwen3's (off in the released models) are refused.

Each call validates its inputs with one device-to-host sync; padding columns of a ragged call
write to a spare cache slot, so no row's real tokens are ever overwritten.

Sizes and FLOPs come from ``model.config`` (a ``ModelConfig``), from the architecture alone:

- ``param_count()`` (every expert of a mixture of experts); ``active_param_count()`` (a token's
  experts only); ``weight_bytes(dtype_bytes)`` (all experts: all are held in memory);
  ``kv_bytes_per_token(dtype_bytes)`` = 2 · layers · kv_heads · head_dim · dtype_bytes (latent
  attention: layers · (kv_lora_rank + qk_rope_head_dim) · dtype_bytes, what its cache holds).
- ``flops_per_token()`` = 2 · (parameters used in matrix multiplies: the active experts and the
  router, the output projection included even when tied; the embedding lookup and norms
  excluded) — the weights part.
- ``attention_flops_per_context_token()`` = 4 · layers · heads · head_dim: q·k plus the weighted
  sum of v, per new token per token attended to (latent attention: on the latent, as engines
  decode it).
- ``forward_flops(new_tokens, context_len)``: one row's pass, the two parts combined causally.

Only this package, profiling, sampling and the real engine import torch.
"""

from specsim.models.cache import KVCache
from specsim.models.config import ModelConfig
from specsim.models.loader import (
    BUILTIN_MODELS,
    BUILTIN_PROMPTS,
    load_config,
    load_model,
    load_mtp_drafter,
    load_tokenizer,
    save_model,
)
from specsim.models.tokenizer import ByteTokenizer, HFTokenizer
from specsim.models.transformer import DecoderModel

__all__ = [
    "BUILTIN_MODELS",
    "BUILTIN_PROMPTS",
    "ByteTokenizer",
    "DecoderModel",
    "HFTokenizer",
    "KVCache",
    "ModelConfig",
    "load_config",
    "load_model",
    "load_mtp_drafter",
    "load_tokenizer",
    "save_model",
]
