"""A profile's latency fits: their file form (``Latency``, ``LatencyFit``, the measured samples
and range) and the answer to "how long does this forward pass take?".

Pure numpy, no torch: the simulator and planner call this once per engine iteration.
"""

from __future__ import annotations

import itertools
import warnings
from typing import Annotated, Literal

import numpy as np
from pydantic import Field, model_validator

from specsim.bounds import (
    MAX_COUNT,
    MAX_TOKENS,
    BatchSize,
    Count,
    NonNegFactor,
    PositiveSeconds,
    Seconds,
    TokenCount,
    Tokens,
)
from specsim.config import StrictModel
from specsim.errors import SpecsimError


class HeldOutError(StrictModel):
    method: str = Field(description="how the error was measured, e.g. 'leave-one-out'")
    points: Count
    median_rel_error: NonNegFactor
    max_rel_error: NonNegFactor


MAX_GRAPH_SIZES = 512  # captured CUDA-graph sizes one fit may list (vLLM's default: 51)


class ExpertRead(StrictModel):
    """A mixture of experts' routed experts, read as a pass's tokens route to them: a pass over
    ``N`` tokens reads, expected, the union of the experts its tokens pick, a share
    ``1 - (1 - experts_per_token / experts)^N`` of them (independent uniform routing): one
    token's ``experts_per_token``, all of them for large N."""

    weights_s: Seconds = Field(
        description="seconds to read every routed expert's weights the device holds, over all "
        "its MoE layers (shared experts, attention and dense layers are in fixed_s)"
    )
    experts: Annotated[int, Field(ge=1, le=MAX_COUNT)] = Field(
        description="routed experts per MoE layer"
    )
    experts_per_token: Annotated[int, Field(ge=1, le=MAX_COUNT)] = Field(
        description="routed experts each token picks (top-k)"
    )

    @model_validator(mode="after")
    def _topk_within(self) -> ExpertRead:
        if self.experts_per_token > self.experts:
            raise ValueError(
                f"experts_per_token {self.experts_per_token} above experts {self.experts}; fix: "
                "give the model's num_experts_per_tok and num_experts"
            )
        return self


class LatencyFit(StrictModel):
    """Seconds for one forward pass over a batch of sequences.

    With ``N`` = new tokens in the batch, ``KV`` = tokens read from the KV cache (sum of the
    sequences' context lengths), ``P`` = sum over decoding sequences of new x (context +
    (new + 1) / 2) (query-key pairs of their new tokens), ``Q`` = the same sum over prompt
    chunks (prefill) and ``B`` = sequences in the batch::

        seconds = fixed_s + per_sequence_s * B + per_batched_token_s * max(0, G(N) - knee_tokens)
                  + per_kv_token_s * KV + per_attention_pair_s * P + per_prefill_pair_s * Q
                  [+ experts.weights_s * (1 - (1 - experts_per_token / experts)^N)]

    ``knee_tokens`` > 0 models a pass that is memory-bound (flat in N) until N reaches the knee;
    with it at 0 the form is the plain linear one, easy to write by hand from a published fit.
    ``G(N)`` is N, or with ``graph_sizes`` the smallest captured size at or above N (a pass up
    to the largest runs as a CUDA graph padded to its size; above it, eager and unpadded).
    The bracketed term is there only with ``experts`` (a mixture of experts).
    ``per_prefill_pair_s`` absent prices prompt chunks' pairs at ``per_attention_pair_s``.
    """

    fixed_s: Seconds
    per_sequence_s: Seconds = 0.0
    per_batched_token_s: Seconds = 0.0
    knee_tokens: Annotated[float, Field(ge=0, le=MAX_TOKENS)] = 0.0
    per_kv_token_s: Seconds = 0.0
    per_attention_pair_s: Seconds = 0.0
    per_prefill_pair_s: Seconds | None = Field(
        default=None,
        description="seconds per query-key pair of a prompt chunk's tokens, where the engine "
        "runs prefill attention in another form than decode (vLLM's latent attention: "
        "decompressed for prefill, absorbed for decode); absent: per_attention_pair_s",
    )
    graph_sizes: Annotated[list[Tokens], Field(min_length=1, max_length=MAX_GRAPH_SIZES)] | None = (
        Field(
            default=None,
            description="token counts the engine captured CUDA graphs for (vLLM's "
            "cudagraph_capture_sizes), ascending: a pass of N tokens up to the largest is padded "
            "to the next one and pays per_batched_token_s on the padded count; absent: no padding",
        )
    )
    experts: ExpertRead | None = Field(
        default=None,
        description="a mixture of experts: its routed experts' read, by the share of them a "
        "pass's tokens route to (absent: fixed_s holds every weight read)",
    )
    held_out: HeldOutError | None = None

    @property
    def prefill_pair_s(self) -> float:
        """Seconds per query-key pair of a prompt chunk (``per_prefill_pair_s`` or the one)."""
        own = self.per_prefill_pair_s
        return self.per_attention_pair_s if own is None else own

    @model_validator(mode="after")
    def _graph_sizes_ascending(self) -> LatencyFit:
        sizes = self.graph_sizes
        if sizes is not None and any(b <= a for a, b in itertools.pairwise(sizes)):
            raise ValueError("graph_sizes must ascend strictly; fix: sort them and drop repeats")
        return self


class LatencySample(StrictModel):
    """One measured grid point: all sequences in the batch share context and new-token counts."""

    batch: BatchSize
    context: TokenCount
    new_tokens: Tokens
    seconds: PositiveSeconds = Field(description="median of the repeats")
    spread_s: Seconds = Field(default=0.0, description="interquartile range of the repeats")
    repeats: Annotated[int, Field(ge=1, le=MAX_COUNT)] = 1
    phase: Literal["prefill", "decode", "verify"] | None = None


class ValidRange(StrictModel):
    """The measured region. Queries outside it follow ``Latency.outside_range``."""

    batch: tuple[BatchSize, BatchSize]
    context: tuple[TokenCount, TokenCount]
    new_tokens: tuple[Tokens, Tokens]

    @model_validator(mode="after")
    def _ordered(self) -> ValidRange:
        for name in ("batch", "context", "new_tokens"):
            low, high = getattr(self, name)
            if high < low:
                raise ValueError(f"{name} range [{low}, {high}] ends below its start")
        return self


class Latency(StrictModel):
    fit: LatencyFit
    valid_range: ValidRange | None = Field(
        default=None, description="absent for hand-written fits: valid everywhere"
    )
    outside_range: Literal["extrapolate", "error"] = Field(
        default="extrapolate",
        description="'extrapolate': use the fit's formula beyond the range and warn once; "
        "'error': refuse the query",
    )
    samples: list[LatencySample] = Field(default_factory=list)


# A latency block: the fit's six coefficients (fixed, per sequence, per batched token past the
# knee, the knee, per KV token read, per attention pair); where its captured CUDA-graph sizes
# start in the vector and how many; the routed experts' read seconds and the share of them one
# token picks; the seconds per prompt chunk's pair.
LATENCY_BLOCK = 11


def latency_s(c, at, batch, new_tokens, kv_tokens, pairs, prefill_pairs):
    """Seconds of one pass of the model whose latency block is ``c[at:at + LATENCY_BLOCK]``:
    ``batch`` sequences feeding ``new_tokens`` positions over ``kv_tokens`` cached tokens with
    ``pairs`` query-key pairs of decoding rows and ``prefill_pairs`` of prompt chunks. Scalar
    arithmetic only: the compiled kernels compile this same source (``costs/formula.py``)."""
    tokens = new_tokens
    count = int(c[at + 7])
    if count > 0 and 0.0 < tokens <= c[int(c[at + 6]) + count - 1]:
        low, high = int(c[at + 6]), int(c[at + 6]) + count - 1
        while low < high:  # the first captured size at or above the tokens: its CUDA graph
            mid = (low + high) // 2
            if c[mid] < tokens:
                low = mid + 1
            else:
                high = mid
        tokens = c[low]
    over = tokens - c[at + 3]
    if not over > 0.0:
        over = 0.0
    # One product where the two pair costs agree: a fit without a prefill cost prices as before,
    # to the bit.
    if c[at + 10] == c[at + 5]:
        attention = c[at + 5] * (pairs + prefill_pairs)
    else:
        attention = c[at + 5] * pairs + c[at + 10] * prefill_pairs
    seconds = c[at] + c[at + 1] * batch + c[at + 2] * over + c[at + 4] * kv_tokens + attention
    if c[at + 8] != 0.0:  # the routed experts its real tokens pick
        seconds += c[at + 8] * (1.0 - (1.0 - c[at + 9]) ** new_tokens)
    return seconds


class OutOfRangeWarning(UserWarning):
    """A latency query left the measured range and was extrapolated (said once per model)."""


class LatencyModel:
    """Pass latency for one model, from its ``Latency`` section.

    ``name`` and ``source`` only label errors and warnings.
    """

    def __init__(self, latency: Latency, name: str, source: str = "profile"):
        self.latency = latency
        self.name = name
        self.source = source
        fit = latency.fit
        self.coef = (
            fit.fixed_s,
            fit.per_sequence_s,
            fit.per_batched_token_s,
            fit.knee_tokens,
            fit.per_kv_token_s,
            fit.per_attention_pair_s,
        )
        # The optional terms (``LatencyFit``): the captured sizes as floats, and the experts'
        # read seconds with the share of them one token picks.
        sizes = fit.graph_sizes
        self.graph_sizes = None if sizes is None else tuple(float(s) for s in sizes)
        experts = fit.experts
        self.experts = (
            None
            if experts is None
            else (experts.weights_s, experts.experts_per_token / experts.experts)
        )
        block, sizes = self.block_at(LATENCY_BLOCK)
        self.block = [*block, *sizes]  # the pass's terms as ``latency_s`` reads them
        self._warned = False

    def seconds_from_totals(
        self,
        batch: int,
        new_tokens: float,
        kv_tokens: float,
        attention_pairs: float,
        prefill_pairs: float = 0.0,
    ) -> float:
        """Seconds for a pass given batch totals, its decoding rows' ``attention_pairs`` and
        its prompt chunks' ``prefill_pairs`` (no range check; the caller has done it)."""
        return latency_s(
            self.block, 0, batch, new_tokens, kv_tokens, attention_pairs, prefill_pairs
        )

    def block_at(self, sizes_at: int) -> tuple[list[float], tuple[float, ...]]:
        """The model's latency block (``latency_s``) with its graph sizes to be placed at
        ``sizes_at`` of a vector, and the sizes."""
        sizes = self.graph_sizes or ()
        weights_s, share = self.experts or (0.0, 0.0)
        at = float(sizes_at if sizes else 0)
        prefill_pair_s = self.latency.fit.prefill_pair_s
        block = [*self.coef, at, float(len(sizes)), weights_s, share, prefill_pair_s]
        return block, sizes

    def pass_seconds(self, context: np.ndarray, new_tokens: np.ndarray | int) -> float:
        """Seconds for one pass: sequence i has ``context[i]`` cached tokens and adds
        ``new_tokens[i]`` (1 = decode, k + 1 = verification, prompt length = prefill)."""
        context = np.asarray(context, dtype=np.float64)
        new = np.broadcast_to(np.asarray(new_tokens, dtype=np.float64), context.shape)
        batch = int(context.shape[0])
        if batch == 0:
            return 0.0
        self.check_range(batch, float(context.max()), float(new.max()), float(new.min()))
        kv = float(context.sum())
        n = float(new.sum())
        pairs = float(np.dot(new, context + (new + 1.0) / 2.0))
        return self.seconds_from_totals(batch, n, kv, pairs)

    def reports_outside_range(self) -> bool:
        """Whether a query outside the measured range would still be reported (raise, or warn
        for the first time): the serving kernel stops before such a query."""
        rng = self.latency.valid_range
        return rng is not None and (self.latency.outside_range == "error" or not self._warned)

    def check_range(
        self, batch: int, max_context: float, max_new: float, min_new: float = 1.0
    ) -> None:
        """Apply the profile's rule for queries outside the measured range."""
        rng = self.latency.valid_range
        if rng is None:
            return
        problems = []
        if not rng.batch[0] <= batch <= rng.batch[1]:
            problems.append(f"batch {batch} outside {list(rng.batch)}")
        if max_context > rng.context[1]:
            problems.append(f"context {int(max_context)} above {rng.context[1]}")
        if max_new > rng.new_tokens[1] or min_new < rng.new_tokens[0]:
            problems.append(
                f"new tokens {int(min_new)}..{int(max_new)} outside {list(rng.new_tokens)}"
            )
        if not problems:
            return
        if self.latency.outside_range == "error":
            raise SpecsimError(
                f"latency query outside the measured range ({'; '.join(problems)})",
                file=self.source,
                key=f"{self.name}.latency.valid_range",
                fix="profile a wider grid, or set outside_range: extrapolate",
            )
        if not self._warned:
            self._warned = True
            warnings.warn(
                f"{self.source}: {self.name}: latency query outside the measured range "
                f"({'; '.join(problems)}); extrapolating the fitted formula (said once)",
                OutOfRangeWarning,
                stacklevel=2,
            )


def graphed_tokens(fit: LatencyFit, tokens: np.ndarray) -> np.ndarray:
    """``tokens`` per pass padded as ``LatencyModel.seconds_from_totals`` pads them (arrays)."""
    tokens = np.asarray(tokens, dtype=np.float64)
    if fit.graph_sizes is None:
        return tokens
    sizes = np.asarray(fit.graph_sizes, dtype=np.float64)
    at = np.minimum(np.searchsorted(sizes, tokens), sizes.size - 1)
    return np.where((tokens > 0.0) & (tokens <= sizes[-1]), sizes[at], tokens)


def experts_seconds(fit: LatencyFit, tokens) -> np.ndarray | float:
    """The routed experts' read of passes over ``tokens`` tokens (0 without experts)."""
    experts = fit.experts
    if experts is None:
        return 0.0
    share = experts.experts_per_token / experts.experts
    return experts.weights_s * (1.0 - (1.0 - share) ** np.asarray(tokens, dtype=np.float64))


def fit_seconds(fit: LatencyFit, rows, tokens, kv, pairs, prefill_pairs=0.0) -> np.ndarray:
    """``LatencyModel.seconds_from_totals`` on arrays of passes (the estimate's mean batches)."""
    past_knee = np.maximum(0.0, graphed_tokens(fit, tokens) - fit.knee_tokens)
    return (
        fit.fixed_s
        + fit.per_sequence_s * rows
        + fit.per_batched_token_s * past_knee
        + fit.per_kv_token_s * kv
        + pairs_seconds(fit, pairs, prefill_pairs)
        + experts_seconds(fit, tokens)
    )


def pairs_seconds(fit: LatencyFit, pairs, prefill_pairs=0.0):
    """Attention seconds of decoding rows' ``pairs`` and prompt chunks' ``prefill_pairs`` (one
    product where the two costs agree, as ``latency_s``)."""
    if fit.prefill_pair_s == fit.per_attention_pair_s:
        return fit.per_attention_pair_s * (pairs + prefill_pairs)
    return fit.per_attention_pair_s * pairs + fit.prefill_pair_s * prefill_pairs
