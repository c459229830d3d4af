"""The exact sampling core and the losslessness checker.

Notation: p = target, q = drafter, k = window size, B = rows (sequences), V = vocabulary.
Every function is batched over rows and takes its randomness explicitly, so results are
reproducible and a batched call equals the per-row calls.

Logits processing and sampling (torch):
- ``process_logits(logits [..., V], temperature=1.0, top_k=0, top_p=1.0) -> probs [..., V]``:
  temperature, then top-k, then top-p, renormalised; temperature 0 gives one-hot argmax (greedy).
  Parameters may be per-row tensors of shape ``[...]``. The drafter samples from its processed q
  and the verifier must get that same processed q.
- ``sample_from_probs(probs [..., V], uniforms [...]) -> tokens [...] int64``: inverse CDF, one
  uniform per row; rows may be unnormalised (non-negative, positive sum).
- ``draw_randomness(generator, B, k) -> VerifierRandomness(accept [B, k], sample [B])``: the
  uniforms a verifier needs, in a fixed draw order.

Verifiers (torch), all ``f(p, q, draft_tokens, n_drafts=None, randomness=None, *, validate=True)
-> VerifyResult``:
- inputs: ``p [B, k+1, V]`` target probabilities (the last position scores the bonus token);
  ``q [B, k, V]`` the drafter's processed probabilities, or ``None`` for a deterministic drafter
  (one-hot q); ``draft_tokens [B, k]`` int64; ``n_drafts [B]`` int64 in [0, k] (ragged windows;
  None = k; padded positions may hold -1); ``randomness`` a ``VerifierRandomness``.
- ``VerifyResult``: ``accepted [B]`` int64, ``tokens [B, k+1]`` int64 (accepted drafts then one
  corrected/bonus token, padded with -1), ``accepted_mask [B, k]`` bool (accepted prefix only).
- ``verify_rejection``: exact modified rejection sampling (lossless: output distributed as p).
- ``verify_greedy``: accept while draft == argmax p; lossless w.r.t. target greedy decoding.
- ``verify_typical``: Medusa typical acceptance, p(x) > min(0.09, 0.3 exp(-H(p))). LOSSY.
- ``kinds.VERIFIER_KINDS``: the registry of these verifiers (name, description, lossy and
  greedy-reference flags, the torch function and closed form by name, how the profiler scores
  it); every other part takes the names from it. Importing it imports neither torch nor numpy.
- ``validate=True`` (default) checks every input (one extra read of p and q: row sums); bad
  input (wrong shape, NaN, rows not summing to 1, tokens outside [0, V), ...) raises
  ``SamplingInputError``, both a ``SpecsimError`` and a ``ValueError``.
- ``acceptance_probabilities(p, q, draft_tokens=None) -> [B, k]``: beta_i = sum min(p_i, q_i)
  (1 - TV), or p_i(x_i) for a deterministic drafter (``q=None``).

Checker (numpy closed form; torch for callables and the Monte Carlo part):
- ``check_sampler(verifier="rejection" | control name | "module:function" | callable, *,
  vocab=8, k=3, samples=200_000, seed=0, temperature=1.0, top_k=0, top_p=1.0,
  drafter="sample", ragged=False, alpha=0.01, inputs="probs", dtype="float32") -> SamplerCheck``
  with ``lossless``, ``closed_form_max_abs_error``, ``tv_distance``, ``p_value``,
  ``window_tests`` ... over the whole window of k + 1 emitted tokens (see ``checker``).
- ``CONTROLS``: known-wrong verifiers the checker must flag (see ``controls``).
- ``reference``: the closed-form enumeration; ``enumeration``: the exact enumeration of a
  callable; ``stats``: the goodness-of-fit tests and their power; ``harness``: the callable's
  signature.

Tree verification (torch; ``tree_verifiers`` documents the signature the engine calls), all
``f(p [B, N+1, V], q [B, N+1, V] | None, draft_tokens [B, N], tree: TreeShape, randomness
(accept [B, N], sample [B]), *, active=None, validate=True) -> TreeVerifyResult(accepted [B],
path [B, D], tokens [B, D+1])``, row 0 of p and q at the root and row i+1 after node i;
``active [B, N]`` bool gives each row its own subtree (as ``n_drafts`` shortens a chain):
- ``verify_tree_rejection``: SpecInfer's multi-draft rule, children drawn i.i.d. from q (exact);
- ``verify_tree_without_replacement``: the rule for children drawn without replacement (exact);
- ``verify_tree_greedy``: follow the argmax child; ``verify_tree_typical``: Medusa's, LOSSY;
- ``kinds.TREE_VERIFIER_KINDS`` / ``kinds.tree_verifier_for(verifier, drafts)``: their registry;
- ``check_tree_sampler(verifier, *, tree="2,2,1", drafts=None, ...) -> TreeSamplerCheck``: the
  closed form (``tree_reference``), or for your own tree verifier (a callable or
  ``module:function``) the enumeration of its step (``tree_enumeration``), and a Monte Carlo
  test (``tree_montecarlo``) over the tree's D + 1 tokens; ``TREE_CONTROLS``
  (``tree_controls``): the tree bugs it must flag.
- ``check_sequences(verifier | step=... | control=..., *, tree=None, k=3, tokens=6, ...) ->
  SequenceCheck``: whole runs of n tokens with a verifier (or a step function that owns its KV
  cache, ``sequence_loops``) in the loop, tested against the target's exact sequence
  distribution; ``SEQUENCE_CONTROLS``: the cross-step bugs it must flag (``sequences``).

One verification step of an engine (the generator lives on p's device)::

    p = process_logits(target_logits, temperature, top_k, top_p)    # [B, k+1, V]
    q = process_logits(drafter_logits, temperature, top_k, top_p)   # [B, k, V]; drafts came from it
    gen = torch.Generator(device=p.device).manual_seed(seed)
    randomness = draw_randomness(gen, B, k, device=p.device)
    step = verify_rejection(p, q, draft_tokens, n_drafts, randomness)
    new_tokens = step.tokens[step.tokens >= 0]   # per row: step.tokens[b, : step.accepted[b] + 1]

Importing this package does not import torch; the torch functions load on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "process_logits": "logits",
    "sample_from_probs": "logits",
    "VerifierRandomness": "randomness",
    "draw_randomness": "randomness",
    "VerifyResult": "verifiers",
    "verify_rejection": "verifiers",
    "verify_greedy": "verifiers",
    "verify_typical": "verifiers",
    "acceptance_probabilities": "verifiers",
    "SamplingInputError": "validation",
    "check_sampler": "checker",
    "SamplerCheck": "checker",
    "CONTROLS": "controls",
    "TreeVerifyResult": "tree_verifiers",
    "verify_tree_rejection": "tree_verifiers",
    "verify_tree_without_replacement": "tree_verifiers",
    "verify_tree_greedy": "tree_verifiers",
    "verify_tree_typical": "tree_verifiers",
    "check_tree_sampler": "tree_checker",
    "TreeSamplerCheck": "tree_checker",
    "TREE_CONTROLS": "tree_controls",
    "check_sequences": "sequences",
    "SequenceCheck": "sequences",
    "SEQUENCE_CONTROLS": "sequences",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module = importlib.import_module(f"specsim.sampling.{_LAZY[name]}")
        return getattr(module, name)
    raise AttributeError(f"module 'specsim.sampling' has no attribute {name!r}")
