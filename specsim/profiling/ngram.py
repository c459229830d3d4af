"""The prompt-lookup (n-gram) drafter, as vLLM's ``ngram`` speculative method does it.

At each generated position, take the last ``n`` tokens of the context (prompt plus what has been
generated), find their most recent earlier occurrence, and propose the (up to ``k``) tokens that
followed it. No match, no proposal: that step verifies a single position. It costs no model
pass, and it is bimodal: on open-ended text it rarely finds a match, but where text repeats
(code edits, summaries quoting the input) it proposes long runs that are often right.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def proposals(
    prompt: Sequence[int], generated: Sequence[int], n: int, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """Proposals at every generated position: ``(tokens [L, k], lengths [L])``.

    Row ``t`` is what the drafter proposes when the context is ``prompt + generated[:t]``;
    ``lengths[t]`` is how many of its entries are real (0: no match). O(L) with a hash of the
    n-grams seen so far, mapping each to the end of its latest occurrence.
    """
    if n < 1 or k < 1:
        raise ValueError("n and k must be >= 1")
    context = list(prompt)
    total = len(generated)
    tokens = np.zeros((total, k), dtype=np.int64)
    lengths = np.zeros(total, dtype=np.int64)
    latest: dict[tuple[int, ...], int] = {}
    # Index every n-gram that ends before the last context position (an occurrence must be
    # followed by at least one token to propose anything).
    for end in range(n - 1, len(context) - 1):
        latest[tuple(context[end - n + 1 : end + 1])] = end
    for t in range(total):
        if len(context) >= n:
            key = tuple(context[-n:])
            end = latest.get(key)
            if end is not None:
                follow = context[end + 1 : end + 1 + k]
                tokens[t, : len(follow)] = follow
                lengths[t] = len(follow)
            # The current last n-gram becomes searchable once a token follows it.
            latest[key] = len(context) - 1
        context.append(int(generated[t]))
    return tokens, lengths
