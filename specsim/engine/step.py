"""One speculative step over a batch of rows: k draft passes, one verification pass, rollback.

State kept per row (``Rows``): the row's whole token sequence ``seq[b, :s_len[b]]`` (prompt plus
everything emitted), the target's KV cache and the drafter's. Invariants between steps:

- the target's cache holds ``s_len - 1`` tokens: every token except the last emitted one, which
  is the first input of the next verification pass;
- the drafter's cache holds at most ``s_len - 1`` tokens; it lags by two after a step whose
  drafts were all accepted (the last draft was sampled, never fed), so its first pass feeds the
  row's missing tokens, 1 or 2 of them (a ragged pass).

A step with window k:

1. draft: k drafter passes; row b drafts ``n_drafts[b]`` tokens (``<= k``), sampled from the
   drafter's processed q (a prompt-lookup drafter proposes instead, with one-hot q);
2. verify: one target pass over ``[last token, drafts]`` (``n_drafts + 1`` positions per row),
   then the project's verifier (``specsim.sampling``) with explicit uniforms;
3. roll back: the target keeps ``s_len + accepted`` tokens, the drafter at most as many.

``k = 0`` (or rows without drafts) is plain target decoding through the same code.

``Faults`` plants known rollback bugs so the end-to-end tests can show that they catch them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specsim.engine.mtp_step import draft_mtp, is_mtp, mtp_keep, prefill_mtp, record_hidden
from specsim.models import DecoderModel, KVCache
from specsim.sampling.kinds import DEFAULT_VERIFIER, VERIFIER_KINDS
from specsim.sampling.logits import process_logits, sample_from_probs
from specsim.sampling.randomness import VerifierRandomness

VERIFIERS = {name: kind.load() for name, kind in VERIFIER_KINDS.items()}


@dataclass(frozen=True)
class Sampling:
    """Logits processing shared by target and drafter, and the verifier."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    verifier: str = DEFAULT_VERIFIER

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        return process_logits(logits, self.temperature, self.top_k, self.top_p)


@dataclass(frozen=True)
class Faults:
    """Planted bugs, off by default. Used only to show that the tests catch them.

    ``skip_draft_rollback``: the drafter's cache keeps its rejected drafts.
    ``target_rollback_extra``: the target keeps this many tokens more than it accepted
    (1 = the classic off-by-one: the first rejected draft stays in the target's cache).
    """

    skip_draft_rollback: bool = False
    target_rollback_extra: int = 0
    # An MTP drafter's (mtp_step): fed the target's states after its final norm; its cache
    # keeps one entry made from its own state.
    mtp_hidden_after_norm: bool = False
    mtp_keep_draft_entry: bool = False


@dataclass(frozen=True)
class StepUniforms:
    """The random numbers of one step, per row: ``draft [B, w]`` to sample drafts from q,
    ``accept [B, w]`` for the accept tests, ``sample [B]`` for the corrected or bonus token.
    ``w`` may exceed the step's k (only the first k columns are used), so a row can draw the
    same count every step from its own stream whatever the rest of the batch does."""

    draft: torch.Tensor
    accept: torch.Tensor
    sample: torch.Tensor

    def to(self, device: torch.device) -> StepUniforms:
        return StepUniforms(self.draft.to(device), self.accept.to(device), self.sample.to(device))

    @staticmethod
    def draw(generator: torch.Generator, batch: int, width: int) -> StepUniforms:
        """One generator for the whole batch (offline generation)."""
        u = torch.rand((batch, 2 * width + 1), generator=generator, dtype=torch.float64)
        return StepUniforms(u[:, :width], u[:, width : 2 * width], u[:, 2 * width])

    @staticmethod
    def per_row(generators: list[torch.Generator], width: int) -> StepUniforms:
        """One generator per row (per request): a request's draws do not depend on its batch."""
        u = torch.stack(
            [torch.rand(2 * width + 1, generator=g, dtype=torch.float64) for g in generators]
        )
        return StepUniforms(u[:, :width], u[:, width : 2 * width], u[:, 2 * width])


@dataclass
class Rows:
    """The rows taking part in a step: sequences, their lengths and both caches (views)."""

    seq: torch.Tensor  # [B, L] int64
    s_len: torch.Tensor  # [B] int64
    target_cache: KVCache
    draft_cache: KVCache | None
    hidden: torch.Tensor | None = None  # [B, L + 1, h]: the target's, for an MTP drafter


@dataclass(frozen=True)
class StepResult:
    """``tokens [B, k+1]`` emitted (padded with -1), ``accepted [B]``, ``drafted [B]``,
    ``logprob [B, k+1]`` raw target log-probability of each emitted token (0 at padding)."""

    tokens: torch.Tensor
    accepted: torch.Tensor
    drafted: torch.Tensor
    logprob: torch.Tensor


@dataclass(frozen=True)
class PrefillResult:
    """``tokens [B]``: each row's first generated token; ``logprob [B]``: its raw target
    log-probability."""

    tokens: torch.Tensor
    logprob: torch.Tensor


def prefill_step(
    target: DecoderModel,
    drafter: DecoderModel | None,
    rows: Rows,
    sampling: Sampling,
    uniforms: torch.Tensor,
    faults: Faults | None = None,
) -> PrefillResult:
    """Feed each row's prompt (``seq[b, :s_len[b]]``, empty caches) through the target and the
    drafter, and sample the first token from the target with ``uniforms [B]``."""
    lengths = rows.s_len
    ids = rows.seq[:, : int(lengths.max())]
    if rows.draft_cache is not None and is_mtp(drafter):
        logits, hidden = target(ids, rows.target_cache, lengths, return_hidden=True)
        record_hidden(target, rows, hidden, torch.zeros_like(lengths), lengths, faults or Faults())
        prefill_mtp(drafter, rows)
    else:
        logits = target(ids, rows.target_cache, lengths)
        if rows.draft_cache is not None:
            drafter(ids, rows.draft_cache, lengths)
    last = logits[torch.arange(ids.shape[0], device=logits.device), lengths - 1]
    tokens = sample_from_probs(sampling.probs(last), uniforms.to(logits.device), validate=False)
    logprob = torch.log_softmax(last.double(), dim=-1).gather(1, tokens[:, None]).squeeze(1)
    return PrefillResult(tokens, logprob)


def speculative_step(
    target: DecoderModel,
    drafter: DecoderModel | None,
    rows: Rows,
    n_drafts: torch.Tensor,
    sampling: Sampling,
    uniforms: StepUniforms,
    faults: Faults | None = None,
    proposals: torch.Tensor | None = None,
) -> StepResult:
    """One step for every row; ``n_drafts [B]`` caps each row's drafts (its window).

    ``uniforms`` must be at least ``max(n_drafts)`` wide. ``proposals [B, k]`` are prompt-lookup
    drafts (deterministic drafter; ``n_drafts`` then says how many are real); otherwise
    ``drafter`` samples them.
    """
    faults = faults or Faults()
    mtp = rows.draft_cache is not None and is_mtp(drafter)
    k = int(n_drafts.max()) if n_drafts.numel() else 0
    batch = rows.seq.shape[0]
    device = rows.seq.device
    index = torch.arange(batch, device=device)
    n_drafts = n_drafts.to(device)
    uniforms = uniforms.to(device)
    q = None
    if k == 0:
        drafts = torch.zeros((batch, 0), dtype=torch.long, device=device)
    elif proposals is not None:
        drafts = proposals[:, :k].to(device)
    elif mtp:
        drafts, q = draft_mtp(drafter, rows, n_drafts, k, sampling, uniforms.draft)
    else:
        drafts, q = _draft(drafter, rows, n_drafts, k, sampling, uniforms.draft)

    last = rows.seq[index, rows.s_len - 1]
    fed = torch.cat([last[:, None], drafts], dim=1)
    if mtp:
        logits, hidden = target(fed, rows.target_cache, n_drafts + 1, return_hidden=True)
        record_hidden(target, rows, hidden, rows.s_len - 1, n_drafts + 1, faults)
    else:
        logits = target(fed, rows.target_cache, n_drafts + 1)
    p = sampling.probs(logits)
    randomness = VerifierRandomness(uniforms.accept[:, :k], uniforms.sample)
    verify = VERIFIERS[sampling.verifier]
    result = verify(p, q, drafts, n_drafts, randomness, validate=False)

    # Both caches keep the row's sequence after this step but its last token: the sequence is
    # the truth, so one cache's state never leaks into the other's rollback.
    keep = rows.s_len + result.accepted
    extra = keep + faults.target_rollback_extra
    rows.target_cache.rollback(torch.minimum(extra, rows.target_cache.lengths))
    if mtp and not faults.skip_draft_rollback:
        rows.draft_cache.rollback(mtp_keep(rows, faults))
    elif rows.draft_cache is not None and not faults.skip_draft_rollback:
        rows.draft_cache.rollback(torch.minimum(keep, rows.draft_cache.lengths))

    emitted = result.tokens
    real = emitted >= 0
    logprob = torch.log_softmax(logits.double(), dim=-1).gather(-1, emitted.clamp(min=0)[..., None])
    logprob = logprob.squeeze(-1).masked_fill(~real, 0.0)
    return StepResult(emitted, result.accepted, n_drafts.clone(), logprob)


def _draft(
    drafter: DecoderModel,
    rows: Rows,
    n_drafts: torch.Tensor,
    k: int,
    sampling: Sampling,
    uniforms: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """k drafter passes; returns drafts ``[B, k]`` and their processed q ``[B, k, V]``."""
    cache = rows.draft_cache
    batch = rows.seq.shape[0]
    # The first pass feeds what the drafter has not seen yet: 1 token, 2 after a full accept,
    # more after steps that drafted nothing (a window policy may pick k = 0 for a while).
    missing = torch.clamp(rows.s_len - cache.lengths, min=1)
    width = int(missing.max())
    offsets = cache.lengths[:, None] + torch.arange(width, device=cache.device)[None, :]
    # Clamped to the last token: real inputs never reach it, and a drafter cache that was not
    # rolled back (a planted fault) is then fed just the newest token, as such a bug would.
    tokens = rows.seq.gather(1, torch.minimum(offsets, rows.s_len[:, None] - 1))
    n_new = torch.where(n_drafts > 0, missing, torch.zeros_like(missing))
    drafts, qs = [], []
    for i in range(k):
        logits = drafter(tokens, cache, n_new)
        last = logits[torch.arange(batch, device=logits.device), (n_new - 1).clamp(min=0)]
        q = sampling.probs(last)
        draft = sample_from_probs(q, uniforms[:, i], validate=False)
        drafts.append(draft)
        qs.append(q)
        # Only rows still drafting feed their new draft to the next pass.
        tokens = draft[:, None]
        n_new = (n_drafts > i + 1).long()
    return torch.stack(drafts, dim=1), torch.stack(qs, dim=1)
