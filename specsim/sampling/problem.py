"""The checker's test problem: a seeded toy target and drafter whose p and q depend on the prefix.

In a speculative step the target's p at position i+1 is conditional on the drafted prefix, so a
faithful check needs p and q as functions of the context. Here both are order-2 context models:
logit tables ``[V, V, V]`` indexed by the last two context tokens, the drafter's being a noisy
copy of the target's (so acceptance is realistic: neither ~0 nor ~1). numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specsim.sampling.reference import Tables, one_hot_argmax, process_logits_np

DRAFTERS = ("sample", "greedy")


@dataclass(frozen=True)
class Processing:
    """Logits processing shared by target and drafter (``logits.process_logits``)."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    @property
    def is_identity(self) -> bool:
        return self.temperature == 1.0 and self.top_k == 0 and self.top_p == 1.0


@dataclass(frozen=True)
class ToyModels:
    """Seeded logit tables for a target and a drafter, and a two-token prompt."""

    target_logits: np.ndarray  # [V, V, V]
    drafter_logits: np.ndarray  # [V, V, V]
    prompt: tuple[int, int]

    @classmethod
    def make(cls, vocab: int, seed: int = 0) -> ToyModels:
        rng = np.random.default_rng(seed)
        shape = (vocab, vocab, vocab)
        # Spread 2 gives peaked but not one-hot rows; the drafter shares most of the signal.
        target = rng.normal(0.0, 2.0, size=shape)
        drafter = 0.8 * target + rng.normal(0.0, 1.0, size=shape)
        prompt = tuple(int(t) for t in rng.integers(vocab, size=2))
        return cls(target, drafter, prompt)

    @property
    def vocab(self) -> int:
        return self.target_logits.shape[-1]

    def tables(
        self, processing: Processing, drafter: str = "sample", verify_with_raw_q: bool = False
    ) -> Tables:
        """Processed p and q tables (float64) as the verifier and the drafter see them.

        ``drafter="greedy"`` drafts argmax q (one-hot q, a deterministic drafter).
        ``verify_with_raw_q`` plants the known bug: the verifier gets softmax(raw logits) while
        the drafter samples from the processed q.
        """
        args = (processing.temperature, processing.top_k, processing.top_p)
        p = process_logits_np(self.target_logits, *args)
        q = process_logits_np(self.drafter_logits, *args)
        if drafter == "greedy":
            q = one_hot_argmax(q)
        q_verify = process_logits_np(self.drafter_logits) if verify_with_raw_q else q
        return Tables(p=p, q_draft=q, q_verify=q_verify)
