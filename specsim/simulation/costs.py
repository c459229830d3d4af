"""Step costs, FLOPs and KV-cache capacity for one replica, from the profile.

A speculative step = k draft passes + one target pass over k + 1 positions per row + per-step
overhead. Chunked prefill rides in the same target pass. All costs are scalar arithmetic on batch
totals (tokens, KV tokens read, query-key pairs), so the engine pays a handful of float
operations per iteration.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specsim.errors import SpecsimError
from specsim.profile import LatencyModel, LoadedProfile, ModelSpec
from specsim.scenario import Engine


class StepCosts:
    """Seconds and FLOPs of engine iterations for one target (+ drafter) on one device."""

    def __init__(self, profile: LoadedProfile, drafter: str | None):
        self.profile = profile
        self.target_spec: ModelSpec = profile.profile.target
        self.target: LatencyModel = profile.latency_model("target")
        self.drafter_name = drafter
        self.drafter_spec: ModelSpec | None = profile.drafter(drafter) if drafter else None
        spec = self.drafter_spec
        self.draft_kind = None if spec is None else spec.kind
        self.draft_latency: LatencyModel | None = None
        if spec is not None and spec.latency is not None:
            self.draft_latency = profile.latency_model(drafter)
        self.draft_step_s = 0.0 if spec is None else (spec.draft_step_s or 0.0)
        overhead = profile.profile.overhead
        self.overhead_step_s = overhead.per_step_s
        self.overhead_seq_s = overhead.per_sequence_s
        own = spec.overhead if spec is not None else None
        draft_terms = own if own is not None else overhead
        self.overhead_draft_step_s = draft_terms.per_draft_step_s
        self.overhead_draft_token_s = draft_terms.per_draft_token_s
        self.overhead_prefill_s = draft_terms.per_prefill_s
        self.overhead_prefill_token_s = draft_terms.per_prefill_token_s
        self.overhead_spec_step_s = own.per_speculative_step_s if own is not None else 0.0
        self.overhead_spec_seq_s = own.per_speculative_sequence_s if own is not None else 0.0
        self._check_target = self.target.latency.valid_range is not None
        self._check_draft = (
            self.draft_latency is not None and self.draft_latency.latency.valid_range is not None
        )
        self.checks_ranges = self._check_target or self._check_draft
        t = self.target_spec
        self.target_flops_per_token = t.flops_per_token
        self.target_attn_flops = t.attention_flops_per_context_token
        self.draft_flops_per_token = 0.0 if spec is None else spec.flops_per_token
        self.draft_attn_flops = 0.0 if spec is None else spec.attention_flops_per_context_token

    # ---- seconds -------------------------------------------------------------------------
    def target_pass_s(self, batch: int, new: float, kv: float, pairs: float) -> float:
        return self.target.seconds_from_totals(batch, new, kv, pairs)

    def draft_s(self, rows: int, k: int, kv: float) -> float:
        """Drafting cost of one step for ``rows`` decoding sequences with ``kv`` context in all.

        A draft model runs k sequential one-token passes (context grows by one per pass; the sum
        is exact because the fit is linear in context). At k = 0 a deployed draft model still
        runs one pass over the step's token so its KV cache stays in step with the target's
        (as vLLM does when it turns speculation off; without it the drafter could not resume).
        N-gram lookup and heads cost their ``draft_step_s`` per step, or one pass of their own
        fit when they have one, and nothing at k = 0.
        """
        if rows == 0 or self.drafter_spec is None:
            return 0.0
        latency = self.draft_latency
        if k == 0:
            if self.draft_kind != "draft_model":
                return 0.0
            return latency.seconds_from_totals(rows, rows, kv, kv + rows)
        if self.draft_kind == "draft_model":
            mean_kv = kv + rows * (k - 1) / 2.0
            return k * latency.seconds_from_totals(rows, rows, mean_kv, mean_kv + rows)
        if latency is not None:
            return latency.seconds_from_totals(rows, rows, kv, kv + rows)
        return self.draft_step_s

    def draft_prefill_s(self, rows: int, tokens: float, kv: float, pairs: float) -> float:
        """A draft model also builds its own KV cache for prompt chunks."""
        if rows == 0 or self.draft_kind != "draft_model":
            return 0.0
        return self.draft_latency.seconds_from_totals(rows, tokens, kv, pairs)

    def overhead_s(self, sequences: int, k: int = 0, drafting: int = 0) -> float:
        """The profile's overhead formula (see ``Overhead``): ``sequences`` in the iteration,
        ``drafting`` of them through ``k`` draft passes (the drafter's own draft terms when its
        spec has them, and its terms per speculative step)."""
        seconds = self.overhead_step_s + self.overhead_seq_s * sequences
        if k and drafting:
            seconds += self.overhead_spec_step_s + self.overhead_spec_seq_s * drafting
            seconds += k * (self.overhead_draft_step_s + self.overhead_draft_token_s * drafting)
        return seconds

    def check_ranges(self, batch: int, max_context: float, max_new: float, min_new: float) -> None:
        """The profile's rule for queries outside the measured range (no-op without a range)."""
        if self._check_target:
            self.target.check_range(batch, max_context, max_new, min_new)
        if self._check_draft and self.draft_kind == "draft_model":
            self.draft_latency.check_range(batch, max_context, 1, 1)

    def iteration_s(self, *shape) -> float:
        """Seconds of one engine iteration of ``shape`` (see ``iteration_parts``): the cost the
        engine charges and the adaptive window policy maximises against (one function, so the
        two cannot drift apart)."""
        target, draft, host = self.iteration_parts(*shape)
        return target + draft + host

    def iteration_parts(
        self,
        k: int,
        rows: int,
        new: float,
        kv: float,
        pairs: float,
        p_rows: int = 0,
        p_tokens: float = 0.0,
        p_kv: float = 0.0,
        p_pairs: float = 0.0,
    ) -> tuple[float, float, float]:
        """One engine iteration's seconds in parts: the target's pass, the drafter's passes,
        and the engine's own work (the overhead terms).

        ``rows`` decoding sequences verify ``new`` positions in all over ``kv`` cached tokens
        (``pairs`` query-key pairs) after k draft passes; ``p_rows`` prompt chunks of
        ``p_tokens`` tokens ride in the same target pass (and a draft model builds its own cache
        for them, and the prefill overhead terms apply).
        """
        batch = rows + p_rows
        target = self.target.seconds_from_totals(batch, new + p_tokens, kv + p_kv, pairs + p_pairs)
        host = self.overhead_s(batch, k, rows)
        draft = self.draft_s(rows, k, kv) if rows else 0.0
        if p_rows:
            host += self.overhead_prefill_s + self.overhead_prefill_token_s * p_tokens
            if self.draft_kind == "draft_model":
                draft += self.draft_latency.seconds_from_totals(p_rows, p_tokens, p_kv, p_pairs)
        return target, draft, host

    # ---- FLOPs ---------------------------------------------------------------------------
    def target_flops(self, new: float, pairs: float) -> float:
        return self.target_flops_per_token * new + self.target_attn_flops * pairs

    def draft_flops(self, rows: int, k: int, kv: float) -> float:
        if rows == 0 or self.drafter_spec is None or self.draft_kind == "ngram":
            return 0.0
        if k == 0:
            if self.draft_kind != "draft_model":
                return 0.0
            # The KV-sync pass (see draft_s).
            return self.draft_flops_per_token * rows + self.draft_attn_flops * (kv + rows)
        if self.draft_kind == "heads":
            return self.draft_flops_per_token * rows * k
        mean_kv = kv + rows * (k - 1) / 2.0
        return k * (self.draft_flops_per_token * rows + self.draft_attn_flops * (mean_kv + rows))

    def draft_prefill_flops(self, tokens: float, pairs: float) -> float:
        if self.draft_kind != "draft_model":
            return 0.0
        return self.draft_flops_per_token * tokens + self.draft_attn_flops * pairs

    def wasted_flops_per_position(self, mean_context: float) -> float:
        """FLOPs of one rejected position: the target's verification plus the draft's pass."""
        target = self.target_flops_per_token + self.target_attn_flops * mean_context
        if self.draft_kind in (None, "ngram"):
            return target
        draft = self.draft_flops_per_token
        if self.draft_kind == "draft_model":
            draft += self.draft_attn_flops * mean_context
        return target + draft


@dataclass(frozen=True)
class LogGroup:
    """One (kind, k, batch) group of the real engine's iterations: per iteration the measured
    seconds, what ``StepCosts.iteration_s`` charges for it, the tokens fed, and both split into
    (target pass, drafter passes, the engine's own work): ``predicted_parts`` always,
    ``measured_parts`` when the engine's clock kept the split (None otherwise). ``full``: the
    iteration ran the whole window, k drafter passes (False on a step whose every row was so
    near its end that it drafted fewer, while the cost model charges k)."""

    measured: np.ndarray
    predicted: np.ndarray
    new: np.ndarray
    predicted_parts: np.ndarray  # [iterations, 3]
    measured_parts: np.ndarray | None  # [iterations, 3]
    full: np.ndarray  # [iterations] bool


def engine_log_groups(log, costs: StepCosts) -> dict[tuple[str, int, int], LogGroup]:
    """The real engine's iteration log (``specsim.engine``) against the cost model, grouped by
    (kind, k, batch): a prefill of whole prompts, or a decode step with window k."""
    rows: dict[tuple[str, int, int], list] = {}
    split = bool(log.target_s)
    passes = zip(log.target_s, log.drafter_s, strict=True) if split else [None] * len(log.dt)
    drafted = iter(getattr(log, "drafted", None) or [])  # per decode iteration, when logged
    for kind, k, batch, new, context, pairs, dt, measured in zip(
        log.kind,
        log.window,
        log.batch,
        log.new_tokens,
        log.context,
        log.pairs,
        log.dt,
        passes,
        strict=True,
    ):
        full = True
        if kind == "prefill":
            parts = costs.iteration_parts(0, 0, 0.0, 0.0, 0.0, batch, new, context, pairs)
        else:
            parts = costs.iteration_parts(k, batch, new, context, pairs)
            rows_drafted = next(drafted, None)
            full = rows_drafted is None or k == 0 or int(np.max(rows_drafted)) >= k
        own = None if measured is None else (*measured, dt - sum(measured))
        rows.setdefault((kind, k, batch), []).append((dt, sum(parts), new, parts, own, full))
    groups = {}
    for key, values in sorted(rows.items()):
        dt, predicted, new, parts, own, full = zip(*values, strict=True)
        groups[key] = LogGroup(
            np.asarray(dt, dtype=float),
            np.asarray(predicted, dtype=float),
            np.asarray(new, dtype=float),
            np.asarray(parts, dtype=float),
            np.asarray(own, dtype=float) if split else None,
            np.asarray(full, dtype=bool),
        )
    return groups


def kv_capacity_tokens(
    profile: LoadedProfile, drafter: str | None, drafter_loaded: bool, engine: Engine
) -> int:
    """KV-cache tokens: memory left after the weights, over the KV bytes per token of both.

    ``drafter_loaded`` is false for k = 0 (the drafter is not deployed).
    """
    if engine.kv_capacity_tokens is not None:
        return engine.kv_capacity_tokens
    target = profile.profile.target
    draft = profile.drafter(drafter) if (drafter and drafter_loaded) else None
    weights = target.weight_bytes + (draft.weight_bytes if draft else 0)
    per_token = target.kv_bytes_per_token + (draft.kv_bytes_per_token if draft else 0)
    memory = profile.profile.hardware.memory_bytes * engine.memory_utilisation
    if per_token <= 0:
        raise SpecsimError(
            "profile has no target.kv_bytes_per_token, so the KV-cache size is unknown",
            file=str(profile.path),
            key="target.kv_bytes_per_token",
            fix="add it to the profile or set engine.kv_capacity_tokens in the scenario",
        )
    free = memory - weights
    if free < per_token:
        raise SpecsimError(
            f"the weights ({weights / 1e9:.1f} GB) leave no room for a KV cache in "
            f"{memory / 1e9:.1f} GB",
            file=str(profile.path),
            key="hardware.memory_bytes",
            fix="use a larger device, a smaller drafter or raise engine.memory_utilisation",
        )
    return int(free // per_token)
