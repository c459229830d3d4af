"""The benchmark clients' per-request latency statistics, computed as vLLM computes them.

vLLM's ``calculate_metrics`` (engine-formats.md sections 1.3-1.4): TPOT per request =
(latency - ttft) / (output_len - 1) over requests with 2 or more output tokens; each metric's
mean, median, standard deviation and percentiles by ``np.percentile`` (linear interpolation) of
the values in seconds; an empty list counts as ``[0]`` (``np.mean(ttfts or 0)``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np


def percentile_word(p: float) -> str:
    """vLLM's spelling of a percentile in a key: 99 -> "99", 99.9 -> "99.9"."""
    return str(int(p)) if int(p) == p else str(p)


def statistics(values: Sequence[float] | np.ndarray, percentiles: Iterable[float]) -> dict:
    """{"mean", "median", "std", "p<word>"...} of ``values`` (seconds), as vLLM computes them."""
    array = np.asarray(values, dtype=np.float64)
    if array.size == 0:
        array = np.zeros(1)
    out = {
        "mean": float(np.mean(array)),
        "median": float(np.median(array)),
        "std": float(np.std(array)),
    }
    for p in percentiles:
        out[f"p{percentile_word(p)}"] = float(np.percentile(array, p))
    return out


def time_per_output_token(
    latencies: np.ndarray, ttfts: np.ndarray, output_lens: np.ndarray
) -> np.ndarray:
    """Per request with 2 or more output tokens: (latency - ttft) / (output_len - 1)."""
    latencies, ttfts = np.asarray(latencies, float), np.asarray(ttfts, float)
    output_lens = np.asarray(output_lens)
    multi = output_lens > 1
    return (latencies[multi] - ttfts[multi]) / (output_lens[multi] - 1)
