"""Prompt lookup (n-gram), as vLLM's ``ngram`` speculative method does it.

At each generated position, take the last ``n`` tokens of the context (prompt plus what has been
generated), find their most recent earlier occurrence, and propose the (up to ``k``) tokens that
followed it. No match, no proposal: that step verifies a single position. It costs no model
pass, and it is bimodal: on open-ended text it rarely finds a match, but where text repeats
(code edits, summaries quoting the input) it proposes long runs that are often right.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from specsim.errors import SpecsimError

if TYPE_CHECKING:
    import numpy as np

DEFAULT_NGRAM = 3
MAX_NGRAM = 16


class PromptLookup:
    """One request's n-gram index over its context (prompt plus emitted tokens): each n-gram
    maps to the end of its latest occurrence that is followed by at least one token, and the
    index grows as tokens are appended, so a lookup is O(n + k)."""

    def __init__(self, n: int, context: Sequence[int]):
        if n < 1:
            raise ValueError("n must be >= 1")
        self.n = n
        self.context: list[int] = []
        self.latest: dict[tuple[int, ...], int] = {}
        self.extend(context)

    def extend(self, tokens: Sequence[int]) -> None:
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


def proposals(
    prompt: Sequence[int], generated: Sequence[int], n: int, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """What prompt lookup proposes at every generated position: ``(tokens [L, k], lengths [L])``.

    Row ``t`` is the proposal when the context is ``prompt + generated[:t]``; ``lengths[t]`` is
    how many of its entries are real (0: no match).
    """
    import numpy as np  # here, so that parsing a drafter spec (the CLI's) stays free of numpy

    if n < 1 or k < 1:
        raise ValueError("n and k must be >= 1")
    tokens = np.zeros((len(generated), k), dtype=np.int64)
    lengths = np.zeros(len(generated), dtype=np.int64)
    lookup = PromptLookup(n, prompt)
    for t, token in enumerate(generated):
        follow = lookup.propose(k)
        tokens[t, : len(follow)] = follow
        lengths[t] = len(follow)
        lookup.extend((token,))
    return tokens, lengths


def parse_ngram(spec: str) -> int | None:
    """``ngram`` -> 3, ``ngram:N`` -> N, anything else (a model) -> None."""
    if spec == "ngram":
        return DEFAULT_NGRAM
    if spec.startswith("ngram:"):
        tail = spec.split(":", 1)[1]
        if not tail.isdigit() or not 1 <= int(tail) <= MAX_NGRAM:
            raise SpecsimError(
                f"bad n-gram size in {spec!r}",
                file="--drafter",
                fix=f"write ngram:N with N between 1 and {MAX_NGRAM}",
            )
        return int(tail)
    return None
