"""The prefix-cache hits an estimate expects (``workload.prefix``), by the simulator's rules.

A hit is capped as the admission caps it (``specsim.simulation.admission``): at most the prompt
less one token and, with ``engine.block_size``, whole blocks. A 'system_prompt' or 'fraction'
prefix hits with probability ``hit_rate``: the latency sample takes each request's own draw
from the simulator's prefix stream (by request number), and the mean prompt mixes a hit and a
miss. A system prompt's blocks are one copy per replica, shared by the rows that hit it.
'column' and 'session' hits depend on the trace's rows or on what a replica remembers: the
estimate expects none of them (it overstates their prefill).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from specsim.workload.prefix import prefix_rng


@dataclass(frozen=True)
class PrefixHits:
    """Expected hits: ``cached`` tokens of a prompt when it hits, with probability
    ``hit_rate``; ``sample``: the hit of each of the traffic's first requests, as drawn."""

    hit_rate: float
    shared: bool  # one sequence for every request (a system prompt): its blocks held once
    block_size: int | None
    length: int | None
    fraction: float | None
    sample: np.ndarray

    def cached(self, prompt: np.ndarray) -> np.ndarray:
        """Tokens a hit of each prompt skips (the admission's cap: prompt - 1, whole blocks)."""
        wanted = np.full_like(prompt, float(self.length)) if self.length is not None else None
        if wanted is None:
            wanted = np.floor(self.fraction * prompt)
        hit = np.minimum(wanted, prompt - 1.0)
        if self.block_size is not None:
            hit -= np.mod(hit, float(self.block_size))
        return hit

    def shared_units(self, prompt: np.ndarray) -> tuple[float, float]:
        """For a shared prefix: a hitting row's mean share of it and the one copy a replica
        holds (the longest hit), in the cache's units (tokens, or blocks); else 0 and 0."""
        if not self.shared:
            return 0.0, 0.0
        units = self.cached(prompt) / float(self.block_size or 1)
        return float(units.mean()), float(units.max())


def expected_hits(scenario, prompt: np.ndarray) -> PrefixHits | None:
    """The scenario's expected hits over the traffic's prompts (None: no prefix the estimate
    can expect)."""
    prefix = scenario.workload.prefix
    if prefix is None or prefix.source not in ("fraction", "system_prompt"):
        return None
    hits = PrefixHits(
        hit_rate=prefix.hit_rate,
        shared=prefix.length is not None,
        block_size=scenario.engine.block_size,
        length=prefix.length,
        fraction=prefix.fraction,
        sample=np.zeros(0),
    )
    drawn = prefix_rng(scenario.seed).random(prompt.shape[0]) < prefix.hit_rate
    sample = np.where(drawn, hits.cached(prompt), 0.0)
    return replace(hits, sample=sample)
