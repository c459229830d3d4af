"""How the checker calls a verifier and reads what it returns (torch).

A verifier is called with one row per speculative step (see ``checker`` for the signature), in
one of two input styles:

- ``probs``: ``verifier(p, q, draft_tokens, n_drafts, randomness)`` with the target's and the
  drafter's processed probabilities (``q`` is None for a deterministic drafter);
- ``logits``: ``verifier(target_logits, drafter_logits, draft_tokens, n_drafts, randomness, *,
  temperature, top_k, top_p)`` with the raw logits, so that the verifier's own temperature /
  top-k / top-p processing is exercised (``drafter_logits`` is None for a deterministic drafter).

The drafts always come from the correctly processed q. What the verifier returns must have
``.accepted`` ``[B]`` and ``.tokens`` ``[B, k+1]`` (or be the pair ``(accepted, tokens)``):
``tokens[b, :accepted[b]]`` are the accepted drafts and ``tokens[b, accepted[b]]`` the corrected
or bonus token; positions after it are not read. An output that breaks this is a ``Malformed``
verdict with the reason and example rows, never an exception.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from specsim.sampling.logits import process_logits
from specsim.sampling.problem import Processing, ToyModels
from specsim.sampling.randomness import VerifierRandomness

DTYPES = {"float32": torch.float32, "float64": torch.float64}
EXAMPLE_ROWS = 3


@dataclass(frozen=True)
class VerifierTables:
    """What the drafter samples from and what the verifier is given, as tables ``[V, V, V]``
    indexed by the last two context tokens."""

    q_draft: torch.Tensor  # processed q the drafts come from
    p_in: torch.Tensor  # the target's input: processed p, or raw logits
    q_in: torch.Tensor | None  # the drafter's input; None for a deterministic drafter
    style: str
    processing: Processing

    @property
    def vocab(self) -> int:
        return self.q_draft.shape[-1]


def verifier_tables(
    models: ToyModels,
    processing: Processing,
    drafter: str = "sample",
    verify_with_raw_q: bool = False,
    style: str = "probs",
    dtype: torch.dtype = torch.float32,
) -> VerifierTables:
    """Process the toy logits with the real ``process_logits`` (in float64, then cast)."""
    args = (processing.temperature, processing.top_k, processing.top_p)
    target_logits = torch.from_numpy(models.target_logits)
    drafter_logits = torch.from_numpy(models.drafter_logits)
    p = process_logits(target_logits, *args)
    q = process_logits(drafter_logits, *args)
    q_verify = process_logits(drafter_logits) if verify_with_raw_q else q
    if drafter == "greedy":
        q = torch.zeros_like(q).scatter_(-1, q.argmax(dim=-1, keepdim=True), 1.0)
        q_verify = None
    if style == "logits":
        p_in, q_in = target_logits, None if q_verify is None else drafter_logits
    else:
        p_in, q_in = p, q_verify
    return VerifierTables(
        q_draft=q.to(dtype),
        p_in=p_in.to(dtype),
        q_in=None if q_in is None else q_in.to(dtype),
        style=style,
        processing=processing,
    )


@dataclass(frozen=True)
class Malformed:
    """A verifier output that breaks the contract: why, and a few offending rows."""

    reason: str
    examples: list[dict[str, Any]]

    def to_json(self) -> dict[str, Any]:
        return {"reason": self.reason, "examples": self.examples}


def call_verifier(
    verifier: Callable,
    tables: VerifierTables,
    contexts: torch.Tensor,
    drafts: torch.Tensor,
    n_drafts: torch.Tensor,
    randomness: VerifierRandomness,
) -> tuple[torch.Tensor, torch.Tensor] | Malformed:
    """Call the verifier on rows whose context is ``contexts`` [R, 2] and whose drafts are
    ``drafts`` [R, k] (-1 past ``n_drafts``). Returns (emitted tokens [R, k+1], counts [R]) with
    tokens past each count set to -1, or a ``Malformed`` verdict."""
    p_rows, q_rows = path_rows(tables, contexts, drafts)
    args = (p_rows, q_rows, drafts, n_drafts, randomness)
    try:
        if tables.style == "logits":
            pr = tables.processing
            result = verifier(*args, temperature=pr.temperature, top_k=pr.top_k, top_p=pr.top_p)
        else:
            result = verifier(*args)
    except Exception as exc:
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        reason = f"the verifier raised {type(exc).__name__}" + (f": {message}" if message else "")
        return Malformed(reason, _examples(range(min(EXAMPLE_ROWS, len(drafts))), args))
    return read_output(result, args, tables.vocab)


def path_rows(
    tables: VerifierTables, contexts: torch.Tensor, drafts: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The verifier's inputs along each row's path: p [R, k+1, V] and q [R, k, V] (or None).
    Past a row's window the drafts are -1; those positions follow token 0 (padding)."""
    a, b = contexts[:, 0], contexts[:, 1]
    k = drafts.shape[1]
    p_rows, q_rows = [], []
    for i in range(k):
        p_rows.append(tables.p_in[a, b])
        if tables.q_in is not None:
            q_rows.append(tables.q_in[a, b])
        a, b = b, drafts[:, i].clamp(min=0)
    p_rows.append(tables.p_in[a, b])
    q = torch.stack(q_rows, dim=1) if tables.q_in is not None else None
    return torch.stack(p_rows, dim=1), q


def read_output(result, args: tuple, vocab: int) -> tuple[torch.Tensor, torch.Tensor] | Malformed:
    """Check a verifier's output against the contract (see the module docstring)."""
    drafts, n_drafts = args[2], args[3]
    rows, k = drafts.shape
    if isinstance(result, tuple) and len(result) == 2:
        accepted, tokens = result
    else:
        accepted, tokens = getattr(result, "accepted", None), getattr(result, "tokens", None)
    if not isinstance(tokens, torch.Tensor) or tuple(tokens.shape) != (rows, k + 1):
        shape = tuple(tokens.shape) if isinstance(tokens, torch.Tensor) else type(tokens).__name__
        return Malformed(
            f"tokens of shape {shape}, expected {(rows, k + 1)} (an object with .accepted [B] "
            "and .tokens [B, k+1], or the pair (accepted, tokens))",
            _examples(range(min(EXAMPLE_ROWS, rows)), args),
        )
    if not isinstance(accepted, torch.Tensor) or tuple(accepted.shape) != (rows,):
        return Malformed(
            f"accepted counts of shape {tuple(getattr(accepted, 'shape', ()))}, expected {(rows,)}",
            _examples(range(min(EXAMPLE_ROWS, rows)), args),
        )
    if accepted.is_floating_point() or tokens.is_floating_point():
        return Malformed(
            "accepted counts and tokens must be integer tensors",
            _examples(range(min(EXAMPLE_ROWS, rows)), args),
        )
    accepted, tokens = accepted.long().cpu(), tokens.long().cpu()
    out_of_window = (accepted < 0) | (accepted > n_drafts)
    if bool(out_of_window.any()):
        return _malformed_rows(
            "accepted counts outside [0, n_drafts]", out_of_window, args, accepted, tokens
        )
    counts = accepted + 1
    position = torch.arange(k + 1)
    emitted = position < counts.unsqueeze(1)
    bad_prefix = ((position[:k] < accepted.unsqueeze(1)) & (tokens[:, :k] != drafts)).any(1)
    if bool(bad_prefix.any()):
        return _malformed_rows(
            "an accepted prefix that differs from the drafts", bad_prefix, args, accepted, tokens
        )
    bad_range = (emitted & ((tokens < 0) | (tokens >= vocab))).any(1)
    if bool(bad_range.any()):
        return _malformed_rows(
            f"an emitted token outside the vocabulary [0, {vocab})", bad_range, args, accepted,
            tokens,
        )  # fmt: skip
    return torch.where(emitted, tokens, -1), counts


def _malformed_rows(reason, bad, args, accepted, tokens) -> Malformed:
    rows = bad.nonzero().squeeze(-1)[:EXAMPLE_ROWS].tolist()
    examples = _examples(rows, args)
    for example, row in zip(examples, rows, strict=True):
        example["accepted"] = int(accepted[row])
        example["tokens"] = tokens[row].tolist()
    return Malformed(f"{reason} ({int(bad.sum())} of {len(bad)} rows)", examples)


def _examples(rows, args) -> list[dict[str, Any]]:
    drafts, n_drafts, randomness = args[2], args[3], args[4]
    return [
        {
            "row": int(row),
            "draft_tokens": drafts[row].tolist(),
            "n_drafts": int(n_drafts[row]),
            "accept_uniforms": [round(float(u), 6) for u in randomness.accept[row]],
            "sample_uniform": round(float(randomness.sample[row]), 6),
        }
        for row in rows
    ]
