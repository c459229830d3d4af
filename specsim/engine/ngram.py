"""Prompt lookup for the real engine: propose what followed the last n-gram's latest occurrence.

The same rule as the profiler's ``specsim.profiling.ngram`` (and vLLM's ``ngram`` method), kept
incrementally per request: an index maps each n-gram to the end of its latest occurrence that is
followed by at least one token, and grows as tokens are appended, so a lookup is O(n + k).
"""

from __future__ import annotations


class PromptLookup:
    """One request's n-gram index over its context (prompt plus emitted tokens)."""

    def __init__(self, n: int, context: list[int]):
        if n < 1:
            raise ValueError("n must be >= 1")
        self.n = n
        self.context: list[int] = []
        self.latest: dict[tuple[int, ...], int] = {}
        self.extend(context)

    def extend(self, tokens: list[int]) -> None:
        n, context, latest = self.n, self.context, self.latest
        for token in tokens:
            # The n-gram ending at the current last token becomes searchable once a token
            # follows it.
            if len(context) >= n:
                latest[tuple(context[-n:])] = len(context) - 1
            context.append(int(token))

    def propose(self, k: int) -> list[int]:
        """Up to ``k`` tokens (none when the last n-gram has no earlier occurrence)."""
        if k < 1 or len(self.context) < self.n:
            return []
        end = self.latest.get(tuple(self.context[-self.n :]))
        if end is None:
            return []
        return self.context[end + 1 : end + 1 + k]
