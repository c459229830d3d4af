"""Logits processing (temperature, top-k, top-p) and inverse-CDF sampling with explicit uniforms.

The target and the drafter share this processing. The drafter samples from its *processed* q, and
the verifier must be given that same processed q: verifying against the raw softmax while drafting
from a top-k/top-p/temperature-processed q breaks losslessness (see ``controls.RAW_Q``).
"""

from __future__ import annotations

import torch

from specsim.sampling.validation import (
    SamplingInputError,
    check_non_negative,
    check_uniforms,
    require_float,
)

Param = float | int | torch.Tensor


def process_logits(
    logits: torch.Tensor,
    temperature: Param = 1.0,
    top_k: Param = 0,
    top_p: Param = 1.0,
) -> torch.Tensor:
    """Turn logits ``[..., V]`` into next-token probabilities ``[..., V]``.

    Order, as in vLLM: divide by the temperature, keep the ``top_k`` largest logits (0 = all),
    then keep the smallest set of most likely tokens whose probability reaches ``top_p``
    (1 = all), and renormalise. Each parameter is a number or a tensor of shape
    ``logits.shape[:-1]`` (one value per row, e.g. per request). Temperature 0 means greedy: the
    row becomes one-hot at ``argmax`` (ties: lowest index). Ties at the top-k / top-p boundary are
    broken towards the lower token id. Half-precision logits are processed in float32; float32
    and float64 keep their dtype. ``-inf`` logits (masked tokens) are allowed; NaN and ``+inf``
    are not.
    """
    require_float_any(logits)
    if bool(torch.isnan(logits).any() | torch.isposinf(logits).any()):
        raise SamplingInputError(
            "contains NaN or +inf", key="logits", fix="check the model output before sampling"
        )
    x = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    rows, vocab = x.shape[:-1], x.shape[-1]
    temp = _per_row(temperature, rows, x, "temperature")
    k = _per_row(top_k, rows, x, "top_k")
    p_top = _per_row(top_p, rows, x, "top_p")
    if bool((temp < 0).any()):
        raise SamplingInputError("must be >= 0", key="temperature", fix="use 0 for greedy")
    if bool(((k < 0) | (k != k.round())).any()):
        raise SamplingInputError("must be a whole number >= 0", key="top_k", fix="0 turns it off")
    if bool(((p_top <= 0) | (p_top > 1)).any()):
        raise SamplingInputError("must lie in (0, 1]", key="top_p", fix="1 turns it off")
    if bool(torch.isneginf(x).all(dim=-1).any()):
        raise SamplingInputError(
            "a row has no finite logit", key="logits", fix="leave at least one token unmasked"
        )

    greedy = temp == 0
    scaled = x / torch.where(greedy, torch.ones_like(temp), temp).unsqueeze(-1)
    needs_top_k = bool(((k > 0) & (k < vocab)).any())
    needs_top_p = bool((p_top < 1).any())
    if needs_top_k or needs_top_p:
        scaled = _mask_top_k_top_p(scaled, k, p_top, needs_top_k, needs_top_p)
    probs = torch.softmax(scaled, dim=-1)
    if bool(greedy.any()):
        one_hot = torch.zeros_like(probs).scatter_(-1, x.argmax(dim=-1, keepdim=True), 1.0)
        probs = torch.where(greedy.unsqueeze(-1), one_hot, probs)
    return probs


def require_float_any(logits: torch.Tensor) -> None:
    require_float(logits, "logits", max(getattr(logits, "ndim", 1), 1), "logits [..., V]")


def _per_row(value: Param, rows: torch.Size, like: torch.Tensor, name: str) -> torch.Tensor:
    t = torch.as_tensor(value, dtype=like.dtype, device=like.device)
    if t.ndim and tuple(t.shape) != tuple(rows):
        raise SamplingInputError(
            f"expected a number or shape {tuple(rows)}, got shape {tuple(t.shape)}",
            key=name,
            fix="pass one value per row of logits",
        )
    if bool(torch.isnan(t).any()):
        raise SamplingInputError("is NaN", key=name)
    return t.expand(rows)


def _mask_top_k_top_p(
    scaled: torch.Tensor,
    k: torch.Tensor,
    p_top: torch.Tensor,
    needs_top_k: bool,
    needs_top_p: bool,
) -> torch.Tensor:
    vocab = scaled.shape[-1]
    sorted_logits, order = scaled.sort(dim=-1, descending=True, stable=True)
    rank = torch.arange(vocab, device=scaled.device)
    keep = torch.ones_like(sorted_logits, dtype=torch.bool)
    if needs_top_k:
        k_eff = torch.where((k > 0) & (k < vocab), k, torch.full_like(k, vocab))
        keep &= rank < k_eff.unsqueeze(-1)
    if needs_top_p:
        probs = torch.softmax(sorted_logits.masked_fill(~keep, float("-inf")), dim=-1)
        # Probability of the strictly more likely tokens; the top token always survives.
        mass_before = probs.cumsum(dim=-1) - probs
        keep &= mass_before < p_top.unsqueeze(-1)
    keep_by_token = torch.empty_like(keep).scatter_(-1, order, keep)
    return scaled.masked_fill(~keep_by_token, float("-inf"))


def sample_from_probs(
    probs: torch.Tensor, uniforms: torch.Tensor, *, validate: bool = True
) -> torch.Tensor:
    """One token per row of ``probs`` ``[..., V]`` by inverse CDF with ``uniforms`` ``[...]``.

    Returns int64 ``[...]``: the smallest token whose cumulative probability exceeds
    ``u * total``. Rows need not be normalised (a residual can be passed as is) but must be
    non-negative with a positive, finite sum. Tokens of probability 0 are never returned.
    """
    if validate:
        require_float(probs, "probs", max(probs.ndim, 1), "probabilities [..., V]")
        check_uniforms(uniforms, "uniforms", tuple(probs.shape[:-1]))
        check_non_negative(probs, "probs")
    tokens, total = inverse_cdf(probs, uniforms)
    tokens, total = tokens.reshape(uniforms.shape), total.reshape(uniforms.shape)
    if validate and not bool((torch.isfinite(total) & (total > 0)).all()):
        raise SamplingInputError(
            "a row has no probability mass (or NaN/inf)", key="probs", fix="check the inputs"
        )
    return tokens


INVERSE_CDF_BLOCK = 256


def inverse_cdf(
    weights: torch.Tensor, uniforms: torch.Tensor, block: int = INVERSE_CDF_BLOCK
) -> tuple[torch.Tensor, torch.Tensor]:
    """Unchecked inverse-CDF sample of non-negative weight rows ``[R, V]``; also each row's mass.

    For a large vocabulary a full cumulative sum over every row is the slow part (a sequential
    scan), so it is done in two levels: sums of blocks of ``block`` tokens (a fast reduction),
    the block holding ``u * total``, then the cumulative sum inside that one block. The result
    is the smallest token whose cumulative weight exceeds ``u * total``, as with one cumsum.
    """
    weights = weights.reshape(-1, weights.shape[-1])
    if weights.dtype in (torch.float16, torch.bfloat16):
        weights = weights.float()  # a half-precision running sum loses the tail of the CDF
    uniforms = uniforms.reshape(-1)
    rows, vocab = weights.shape
    if vocab <= 2 * block:
        cdf = weights.cumsum(dim=-1)
        target = _target(cdf[:, -1], uniforms, cdf.dtype)
        tokens = torch.searchsorted(cdf, target.unsqueeze(-1), right=True).squeeze(-1)
        # A NaN or zero total would search past the end; callers check the mass returned.
        return tokens.clamp_(max=vocab - 1), cdf[:, -1]
    full = vocab // block
    sums = weights[:, : full * block].view(rows, full, block).sum(dim=-1)
    if full * block < vocab:
        sums = torch.cat([sums, weights[:, full * block :].sum(dim=-1, keepdim=True)], dim=1)
    block_cdf = sums.cumsum(dim=-1)
    total = block_cdf[:, -1]
    target = _target(total, uniforms, block_cdf.dtype)
    chosen = torch.searchsorted(block_cdf, target.unsqueeze(-1), right=True).squeeze(-1)
    chosen = chosen.clamp_(max=block_cdf.shape[1] - 1)
    offset = torch.where(
        chosen > 0,
        block_cdf.gather(1, (chosen - 1).clamp(min=0).unsqueeze(-1)).squeeze(-1),
        torch.zeros_like(total),
    )
    index = chosen.unsqueeze(-1) * block + torch.arange(block, device=weights.device)
    inside = index < vocab
    in_block = torch.where(inside, weights.gather(1, index.clamp(max=vocab - 1)), 0.0)
    inner_cdf = in_block.cumsum(dim=-1) + offset.unsqueeze(-1)
    position = torch.searchsorted(inner_cdf, target.unsqueeze(-1), right=True).squeeze(-1)
    past_end = position >= block
    if bool(past_end.any()):
        # Block sums and the in-block scan round differently; a target within rounding of the
        # block's end takes the block's last token of positive weight.
        positive = (in_block[past_end] > 0).flip(-1).to(torch.int8)
        position[past_end] = block - 1 - positive.argmax(dim=-1)
    tokens = chosen * block + position
    return tokens.clamp_(max=vocab - 1), total


def _target(total: torch.Tensor, uniforms: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    # u < 1, but u * total can round up to total; the largest float below it keeps the search
    # inside the support (it then lands on the last token with positive probability).
    target = uniforms.to(dtype) * total
    return torch.minimum(target, torch.nextafter(total, torch.zeros_like(total)))
