"""Window policies: which k the engine uses for the next iteration.

- ``FixedWindow``: always k.
- ``BatchTableWindow``: k from a table by running batch size (above the table: k = 0).
- ``GoodputWindow``: before each iteration, the k in 0..k_max that maximises expected emitted
  tokens per second of step time, using the profile's latency model and the acceptance model's
  expected tokens per step. Choices are cached per batch size and KV bucket.
"""

from __future__ import annotations

from collections.abc import Callable

from specsim.scenario import Speculation

KV_BUCKET_TOKENS = 2048


class FixedWindow:
    def __init__(self, k: int):
        self.k = k
        self.k_max = k

    def choose(self, rows: int, kv_tokens: float) -> int:
        return self.k


class BatchTableWindow:
    def __init__(self, table: list[tuple[int, int]], max_batch: int):
        self.k_max = max(k for _, k in table)
        by_size = []
        for size in range(max_batch + 1):
            k = next((k for limit, k in table if size <= limit), 0)
            by_size.append(k)
        self._by_size = by_size

    def choose(self, rows: int, kv_tokens: float) -> int:
        return self._by_size[min(rows, len(self._by_size) - 1)]


class GoodputWindow:
    """argmax over k of rows x E[tokens per step](k) / step_seconds(k, rows, kv)."""

    def __init__(
        self,
        k_max: int,
        expected_emitted: Callable[[int], float],
        step_seconds: Callable[[int, int, float], float],
    ):
        self.k_max = k_max
        self._tokens = [expected_emitted(k) for k in range(k_max + 1)]
        self._step_seconds = step_seconds
        self._cache: dict[tuple[int, int], int] = {}

    def best(self, rows: int, kv_tokens: float) -> int:
        rates = [
            self._tokens[k] / self._step_seconds(rows, k, kv_tokens) for k in range(self.k_max + 1)
        ]
        return max(range(self.k_max + 1), key=lambda k: (rates[k], -k))

    def choose(self, rows: int, kv_tokens: float) -> int:
        if rows == 0:
            return 0
        bucket = int(kv_tokens // KV_BUCKET_TOKENS)
        key = (rows, bucket)
        k = self._cache.get(key)
        if k is None:
            # Evaluate at the bucket's midpoint so the choice does not depend on cache order.
            k = self._cache[key] = self.best(rows, (bucket + 0.5) * KV_BUCKET_TOKENS)
        return k


def build_policy(
    speculation: Speculation,
    max_batch: int,
    expected_emitted: Callable[[int], float],
    step_seconds: Callable[[int, int, float], float],
):
    if not speculation.enabled:
        return FixedWindow(0)
    if speculation.policy == "by_batch":
        table = [(row.max_batch, row.k) for row in speculation.k_by_batch]
        return BatchTableWindow(table, max_batch)
    if speculation.policy == "adaptive":
        return GoodputWindow(speculation.k, expected_emitted, step_seconds)
    return FixedWindow(speculation.k)
