"""Window policies with state across iterations, as two engines run them.

Both observe every decode iteration after it runs (``observe``: the rows' drafted and accepted
counts). This is the specification: the serving kernel carries each one's state and
updates it after each decode iteration in the same operations (``compiled_policy_kernel.py``),
and hands it back to the object here (``serving_policy.py``), which the per-iteration path
steps.

- ``AcceptanceGate`` wraps a fixed or k-by-batch policy with TensorRT-LLM's acceptance
  off-switch. Source: NVIDIA/TensorRT-LLM @ 0004396720054fd8e205cbf616f21f0b57c6b412,
  ``tensorrt_llm/_torch/speculative/speculation_gate.py`` (SpeculationGate) and
  ``tensorrt_llm/_torch/pyexecutor/py_executor.py`` (``_update_batch_acceptance_rate``). The
  switch is engine-wide, not per request: after each iteration in which some generation request
  drafted, the executor records one sample, the batch's accepted drafts over its drafted tokens
  (requests that drafted nothing left out); once ``window`` samples have been recorded, it
  compares the mean of the last ``window`` with the threshold after each new one, and below it
  speculation is off for every request for the rest of the server's life. (Earlier TensorRT-LLM
  versions, keys ``acceptance_window`` / ``acceptance_length_threshold``, averaged each finished
  request's accepted drafts per step instead.) TensorRT-LLM's overlap scheduler applies the
  decision one iteration later than here.

  Why a wrapper and not a policy: in TensorRT-LLM the switch, ``max_concurrency`` and
  ``draft_len_schedule`` are all fields of ``DecodingBaseConfig``, which every decoding type
  inherits; the switch stops whatever draft length the schedule (or the static
  ``max_draft_len``) would give, so it composes with the window policy instead of replacing it.
  ``max_concurrency`` is itself a schedule there (``{max_concurrency: max_draft_len}``, the
  validator's translation), so specsim builds it as a k-by-batch table (``policy.build_policy``).

- ``AdaptiveStepsWindow`` (``policy: adaptive_steps``) is SGLang's ``--speculative-adaptive``.
  Source: SGLang 0.5.23 (PyPI wheel), ``sglang/srt/speculative/adaptive_spec_params.py``
  (AdaptiveSpeculativeParams, AdaptiveStepSlot), ``adaptive_runtime_state.py``
  (AdaptiveController), ``eagle_worker_v2.py`` and
  ``managers/scheduler_components/batch_result_processor.py`` (the calls). Before each decode
  batch the worker takes the steps of the tier the batch size falls in (the largest tier key at
  or below it; below the first key, the first tier); after verification the same tier's slot
  takes the per-request accepted draft counts: when its steps are above 0 its EMA moves by
  ``alpha`` towards the batch's mean; every batch counts, and after ``warmup_batches`` every
  ``update_interval``-th one recomputes the steps (``AdaptiveStepSlot._recompute_params``). A
  slot starts at the server's ``--speculative-num-steps`` when that is among its candidates,
  else at its middle candidate, with its EMA at steps - 1. SGLang pads the batch size to a CUDA
  graph size before routing; specsim routes by the batch as it is.
"""

from __future__ import annotations

from collections import deque
from typing import ClassVar

import numpy as np

from specsim.policy_settings import AcceptanceGate as GateSettings
from specsim.policy_settings import AdaptiveSteps
from specsim.profile.latency import fit_seconds
from specsim.simulation.compiled_layout import REPORTED_CHANGES


class AcceptanceGate:
    """A window policy whose speculation TensorRT-LLM's acceptance off-switch may stop."""

    fixed: ClassVar[bool] = False  # k drops to 0 when it trips
    observes: ClassVar[bool] = True

    def __init__(self, inner, settings: GateSettings):
        self.inner = inner
        self.k_max = inner.k_max
        self.name = inner.name
        self.threshold = settings.threshold
        self.window = settings.window
        self._samples: deque[float] = deque()
        self._sum = 0.0
        self.recorded = 0
        self.tripped_at: int | None = None  # the sample (1-based) that tripped it
        self.off_at_s: float | None = None  # when the iteration that tripped it ended

    def choose(self, rows: int, kv_tokens: float) -> int:
        if self.tripped_at is not None:
            return 0
        return self.inner.choose(rows, kv_tokens)

    def observe(self, drafts: np.ndarray, accepted: np.ndarray, now: float) -> None:
        """One iteration's rows (occupied slots only), drafted tokens and accepted drafts, at
        the time it ended."""
        if self.tripped_at is not None:
            return
        drafting = drafts > 0
        drafted = float(drafts[drafting].sum())
        if drafted <= 0.0:
            return  # no request drafted: TensorRT-LLM records no sample
        self.record(float(accepted[drafting].sum()) / drafted)
        if self.tripped_at is not None:
            self.off_at_s = now

    def report(self) -> dict:
        return {
            "acceptance_gate": {
                "samples": self.recorded,
                "tripped_at_sample": self.tripped_at,
                "speculation_off_at_s": self.off_at_s,
            }
        }

    def record(self, rate: float) -> None:
        """SpeculationGate.record_acceptance_rate: a rolling mean of the last ``window``."""
        samples = self._samples
        samples.append(rate)
        self._sum += rate
        if len(samples) > self.window:
            self._sum -= samples.popleft()
        self.recorded += 1
        if self.recorded >= self.window and self._sum / len(samples) < self.threshold:
            self.tripped_at = self.recorded


class StepSlot:
    """One tier's state: SGLang's AdaptiveStepSlot."""

    def __init__(self, initial: int, candidates: list[int], config: AdaptiveSteps, tier):
        self.candidates = sorted(set(candidates))
        self.alpha = config.ema_alpha
        self.interval = config.update_interval
        self.warmup = config.warmup_batches
        self.up = config.up_hysteresis if tier.up_hysteresis is None else tier.up_hysteresis
        self.down = config.down_hysteresis if tier.down_hysteresis is None else tier.down_hysteresis
        middle = self.candidates[len(self.candidates) // 2]
        self.steps = initial if initial in self.candidates else middle
        self.ema = float(self.steps - 1)
        self.batches = 0

    def update(self, accepted: np.ndarray) -> None:
        """After a verified batch: its per-request accepted draft counts."""
        if accepted.shape[0] == 0:
            return
        if self.steps > 0:
            mean = float(accepted.sum()) / accepted.shape[0]
            self.ema = (1.0 - self.alpha) * self.ema + self.alpha * mean
        self.batches += 1
        if self.batches <= self.warmup or (self.batches - self.warmup) % self.interval:
            return
        self.steps = self._recompute()

    def _recompute(self) -> int:
        candidates, ema = self.candidates, self.ema
        index = candidates.index(self.steps)
        if self.steps == 0:
            # Probe the next candidate up; with no history (EMA below 0) start it neutral.
            index = min(index + 1, len(candidates) - 1)
            if candidates[index] > 0 and ema < 0:
                self.ema = float(candidates[index] - 1)
            return candidates[index]
        start = index
        while index > 0:
            lower = candidates[index - 1]
            drop = (0.5 if lower == 0 else lower - 0.5) + self.down
            if ema > drop:
                break
            index -= 1
        if index == start:
            while index < len(candidates) - 1 and ema > candidates[index] - 0.5 + self.up:
                index += 1
        return candidates[index]


class AdaptiveStepsWindow:
    """SGLang's adaptive steps: each batch-size tier's slot picks its steps from acceptance."""

    name: ClassVar[str] = "adaptive_steps"
    fixed: ClassVar[bool] = False
    observes: ClassVar[bool] = True

    def __init__(self, initial: int, config: AdaptiveSteps):
        self.k_max = max(config.candidate_steps)
        self.starts = [tier.min_batch for tier in config.tiers]
        self.slots = [StepSlot(initial, t.candidate_steps, config, t) for t in config.tiers]
        self._current: StepSlot | None = None
        # The first REPORTED_CHANGES changes (time, tier's min_batch, new steps), and how many.
        self.changes: list[tuple[float, int, int]] = []
        self.changed = 0

    @classmethod
    def build(cls, speculation, max_batch: int) -> AdaptiveStepsWindow:
        return cls(speculation.k, speculation.steps_config)

    def slot(self, rows: int) -> StepSlot:
        """The tier of a batch of ``rows``: the last whose min_batch is at most rows."""
        index = int(np.searchsorted(self.starts, rows, side="right")) - 1
        return self.slots[max(index, 0)]

    def choose(self, rows: int, kv_tokens: float) -> int:
        self._current = self.slot(rows)
        return self._current.steps

    def observe(self, drafts: np.ndarray, accepted: np.ndarray, now: float) -> None:
        # The slot that chose this batch's steps (SGLang routes by the same batch size).
        slot = self._current if self._current is not None else self.slot(drafts.shape[0])
        before = slot.steps
        slot.update(accepted)
        if slot.steps != before:
            if self.changed < REPORTED_CHANGES:
                self.changes.append((now, self.starts[self.slots.index(slot)], slot.steps))
            self.changed += 1

    def report(self) -> dict:
        """The tiers' steps at the end and the first changes (time, tier, steps)."""
        return {
            "adaptive_steps": {
                "steps": {str(b): s.steps for b, s in zip(self.starts, self.slots, strict=True)},
                "changes": self.changed,
                "first_changes": [list(c) for c in self.changes],
            }
        }


class AdaptiveVerification:
    """vLLM's adaptive verification (``enable_adaptive_verification``, policy
    ``adaptive_verification``): the drafter proposes k for every row, and before the target's
    pass the engine picks how many of those drafts to verify, and whose.

    Source: vllm-project/vllm @ 8eadfc2c4c29812fba0dfe8a547b4ef29bdafec9,
    ``vllm/v1/worker/gpu/spec_decode/adaptive_verification.py`` (AdaptiveVerificationManager:
    ``_compute_budget``, ``_assign_draft_token_budget_kernel``; PR #47808). Each scheduled draft
    scores its survival, the running product of its request's per-position confidences. The
    budget B* maximises (requests sampling + the B highest survivals) / (the drafter's cost at
    the batch's request count + the verify cost at the batch's non-draft tokens + B), the
    first maximum on ties; then the B* highest survivals are admitted (survival falls along a
    request, so each keeps a prefix; ties go to the shallower step, then the earlier request).

    Here the confidences are the expected conditional acceptance rates of each row's
    acceptance level (times the drafter's proposal rate): DSpark's confidence head scores each
    draft, which tells it more than an expectation does, so this prices the policy on the
    cautious side. vLLM's cost tables are step times profiled at start-up by token count; here
    the engine's own cost model prices each budget on the batch as it stands (the verified
    drafts attend to the batch's mean context). Prompt chunks are scheduled with every draft
    counted, as vLLM's scheduler counts them before the budget trims.
    """

    name: ClassVar[str] = "adaptive_verification"
    fixed: ClassVar[bool] = False
    trims: ClassVar[bool] = True  # hands each row its verified drafts: per-iteration path

    def __init__(self, k: int):
        self.k = self.k_max = k
        self.costs = None
        self._scores = np.zeros((1, k))
        self.scheduled = 0.0  # drafts proposed over the run, and verified
        self.verified = 0.0

    @classmethod
    def build(cls, speculation, max_batch: int) -> AdaptiveVerification:
        return cls(speculation.k)

    def attach(self, costs, acceptance) -> None:
        """The engine's cost model, and each acceptance level's survivals (a rate model's:
        the scenario refuses the policy with replayed sequences)."""
        self.costs = costs
        self._fit = costs.target.latency.fit
        self._scores = acceptance.survival[:, : self.k] * acceptance.proposal_rate

    def choose(self, rows: int, kv_tokens: float) -> int:
        return self.k

    def admit(self, drafts: np.ndarray, levels: np.ndarray, decode, prefill, sampling) -> None:
        """Trim ``drafts`` (each occupied row's scheduled drafts; -1 in empty slots) in place
        to the drafts verified. ``levels``: the rows' acceptance levels; ``decode``: the rows'
        totals with no draft verified; ``prefill``: the prompt chunks in the pass;
        ``sampling``: the rows and finishing prompts that sample a token."""
        rows = np.flatnonzero(drafts > 0.0)
        scheduled = drafts[rows]
        total = int(scheduled.sum())
        self.scheduled += total
        if total == 0:
            return
        k = self.k
        scores = self._scores[levels[rows]]
        scores = np.where(np.arange(k)[None, :] < scheduled[:, None], scores, -np.inf)
        flat = scores.T.ravel()  # step-major: a stable sort breaks ties by step, then row
        order = np.argsort(-flat, kind="stable")[:total]
        expected = sampling + np.concatenate(([0.0], np.cumsum(flat[order])))
        budget = int(np.argmax(expected / self._seconds(total, decode, prefill)))
        self.verified += budget
        if budget < total:
            admitted = np.zeros(flat.shape[0], dtype=bool)
            admitted[order[:budget]] = True
            drafts[rows] = admitted.reshape(k, -1).sum(axis=0)

    def _seconds(self, total: int, decode, prefill) -> np.ndarray:
        """The iteration's seconds with 0..total drafts verified."""
        added = np.arange(total + 1, dtype=np.float64)
        mean_context = decode.kv / decode.rows
        # A prompt chunk's pairs at their own cost where the fit has one (the formula's rule);
        # else summed in the order that prices them as before, to the bit.
        apart = prefill.pairs if self._fit.per_prefill_pair_s is not None else 0.0
        target = fit_seconds(
            self._fit,
            decode.rows + prefill.rows,
            decode.tokens + prefill.tokens + added,
            decode.kv + prefill.kv,
            decode.pairs + (prefill.pairs - apart) + added * mean_context,
            apart,
        )
        _, draft, host = self.costs.iteration_parts(self.k, decode, prefill)
        return target + draft + host

    def report(self) -> dict:
        share = self.verified / self.scheduled if self.scheduled else None
        return {
            "adaptive_verification": {
                "drafts_proposed": self.scheduled,
                "drafts_verified": self.verified,
                "verified_share": share,
            }
        }
