"""Negative controls: known-wrong verifiers that the losslessness checker must flag.

Each is a real-world bug kept on purpose, with a torch implementation (same signature as the
verifiers, run by the Monte Carlo test) and its closed form (run by the exact enumeration):

- ``resample-p``: on a rejection, sample from p instead of the residual norm(max(0, p - q));
- ``argmax-on-reject``: on a rejection, emit argmax p;
- ``residual-0.8q``: a mis-computed residual, norm(max(0, p - 0.8 q));
- ``raw-q``: draft from the processed q (temperature/top-k/top-p) but verify against the raw
  softmax q — the harness plants it by handing the verifier the raw q;
- ``shared-uniform``: one uniform reused for the accept test at every position;
- ``stale-bonus``: when every draft passes, the bonus token is drawn from p at the last draft's
  position instead of the position after it (an off-by-one in the bonus row).

Whether a bug changes the emitted tokens depends on the problem: a shared uniform, for instance,
is invisible where every acceptance probability is 0 or 1 (possible with top-k on a tiny
vocabulary), and a stale bonus shows only in the token after a full window. The checker judges
the whole window (k + 1 tokens), and its default problem (problem seed 0) shows every control.

Importing this module does not import torch; the torch verifiers import it when called.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from specsim.sampling.reference import (
    REJECTION,
    ClosedFormRule,
    exact_accept,
    normalised_or_p,
    one_hot_argmax,
)


def _control_verifier(
    residual_name: str, shared_uniform: bool = False, stale_bonus: bool = False
) -> Callable[..., Any]:
    def verify(p, q, draft_tokens, n_drafts=None, randomness=None, *, validate=True):
        import torch

        from specsim.sampling import verifiers as v

        residual = {
            "exact": v._exact_residual,
            "p": lambda p_rows, q_rows: p_rows,
            "argmax": lambda p_rows, q_rows: torch.zeros_like(p_rows).scatter_(
                -1, p_rows.argmax(dim=-1, keepdim=True), 1.0
            ),
            "0.8q": lambda p_rows, q_rows: p_rows.sub_(q_rows, alpha=0.8).clamp_(min=0),
        }[residual_name]
        return v._speculative_rows(
            p, q, draft_tokens, n_drafts, randomness, validate, residual, shared_uniform,
            stale_bonus,
        )  # fmt: skip

    return verify


@dataclass(frozen=True)
class NegativeControl:
    name: str
    description: str
    verifier: Callable[..., Any]
    rule: ClosedFormRule
    verify_with_raw_q: bool = False


CONTROLS: dict[str, NegativeControl] = {
    c.name: c
    for c in (
        NegativeControl(
            "resample-p",
            "on rejection, resample from p instead of the residual",
            _control_verifier("p"),
            ClosedFormRule("resample-p", exact_accept, lambda p, q: p),
        ),
        NegativeControl(
            "argmax-on-reject",
            "on rejection, take argmax p",
            _control_verifier("argmax"),
            ClosedFormRule("argmax-on-reject", exact_accept, lambda p, q: one_hot_argmax(p)),
        ),
        NegativeControl(
            "residual-0.8q",
            "residual norm(max(0, p - 0.8 q)) instead of norm(max(0, p - q))",
            _control_verifier("0.8q"),
            ClosedFormRule(
                "residual-0.8q",
                exact_accept,
                lambda p, q: normalised_or_p(np.maximum(0.0, p - 0.8 * q), p),
            ),
        ),
        NegativeControl(
            "raw-q",
            "drafts from the processed q, verifies against the raw softmax q",
            _control_verifier("exact"),
            REJECTION,
            verify_with_raw_q=True,
        ),
        NegativeControl(
            "shared-uniform",
            "one uniform reused for the accept test at every position",
            _control_verifier("exact", shared_uniform=True),
            ClosedFormRule("shared-uniform", exact_accept, REJECTION.residual, shared_uniform=True),
        ),
        NegativeControl(
            "stale-bonus",
            "the bonus token drawn at the last draft's position, not the one after it",
            _control_verifier("exact", stale_bonus=True),
            ClosedFormRule("stale-bonus", exact_accept, REJECTION.residual, stale_bonus=True),
        ),
    )
}
