"""Which window policy wins at each load: the best static k, the k-by-batch table (vLLM's
``num_speculative_tokens_per_batch_size``, TensorRT-LLM's ``draft_len_schedule``), specsim's
goodput policy and, with ``--policies``, SGLang's adaptive steps at its default tiers and vLLM's
adaptive verification at the sweep's largest k; each against speculation off.

Judged as the plan judges k: goodput under the SLO when the scenario has one, else mean
end-to-end latency. A policy a load did not simulate (or whose run failed) is left out there.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from operator import itemgetter
from typing import Any

from specsim.errors import SpecsimError
from specsim.planning.common import GOODPUT_TIE, metric
from specsim.planning.report import Column, Table, column_table
from specsim.planning.window.window_table import E2E_TIE

ADAPTIVE_STEPS = "adaptive_steps"
ADAPTIVE_VERIFICATION = "adaptive_verification"
# The policies ``--policies`` may add beside the static k (the goodput policy and the table
# run by default).
EXTRA_POLICIES = (ADAPTIVE_STEPS, ADAPTIVE_VERIFICATION)
LABELS = {
    "static": "best static k",
    "by_batch": "k-by-batch table",
    "adaptive": "goodput policy",
    ADAPTIVE_STEPS: "SGLang adaptive steps",
    ADAPTIVE_VERIFICATION: "vLLM adaptive verification",
}


def parse_policies(given: str | list[str] | tuple[str, ...] | None) -> tuple[str, ...]:
    """``--policies``' comma-separated names (or a list of them), in order, once each."""
    if given is None:
        return ()
    items = [str(n).strip() for n in (given.split(",") if isinstance(given, str) else given)]
    if not all(items):
        raise SpecsimError(
            f"an empty policy name in {given!r}",
            key="--policies",
            fix=f"give comma-separated names: {', '.join(EXTRA_POLICIES)}",
        )
    return tuple(dict.fromkeys(items))


def initial_steps(candidates: list[int], top: int) -> int:
    """SGLang's starting --speculative-num-steps: the largest candidate within the sweep's k
    (it must be a candidate)."""
    within = [c for c in candidates if 0 < c <= top]
    return max(within) if within else min(candidates)


def score(summary: dict[str, Any] | None, use_slo: bool) -> float | None:
    """Higher is better: goodput under the SLO, else minus the mean end-to-end latency."""
    if summary is None:
        return None
    if use_slo:
        return metric(summary, "goodput_requests_per_s")
    value = metric(summary, "e2e_s", "mean")
    return None if value is None else -value


def choices(loads, use_slo: bool) -> list[dict[str, Any]]:
    """Per load: each policy's figure, the winner, its margin over the best other policy and
    whether it beats speculation off (``loads``: the plan's ``LoadResult``s).

    Policies within the plan's tie band of the best (``GOODPUT_TIE`` of goodput, ``E2E_TIE`` of
    mean E2E) are equal, and the first of them in ``LABELS``' order, the simplest, wins: a
    lead inside the band is noise of one run, not a reason to deploy a policy."""
    band = GOODPUT_TIE if use_slo else E2E_TIE
    out = []
    for entry in loads:
        summaries = {
            "static": entry.best,
            **{name: entry.summary(name) for name in ("by_batch", "adaptive", *EXTRA_POLICIES)},
        }
        scored = ((n, score(v, use_slo)) for n, v in summaries.items())
        scores = {n: s for n, s in scored if s is not None}
        off = score(entry.summary("k=0"), use_slo)
        winner, tied, margin = banded(scores, band)
        out.append(
            {
                "load": entry.load,
                "best_static_k": entry.best_k,
                "figures": {n: abs(s) for n, s in scores.items()},
                "winner": winner,
                "margin": margin,
                "tied_with": tied,
                "winner_beats_off": None if winner is None or off is None else scores[winner] > off,
            }
        )
    return out


def deployable_winner(figures: dict[str, float], use_slo: bool) -> str | None:
    """The best of a verdict row's ``figures`` (by policy) among the policies an engine can
    run (the goodput policy left out: no engine's configuration picks k that way), by the
    same tie band."""
    sign = 1.0 if use_slo else -1.0  # figures: goodput (higher is better) or mean E2E
    scores = {n: sign * v for n, v in figures.items() if n != "adaptive"}
    return banded(scores, GOODPUT_TIE if use_slo else E2E_TIE)[0]


def banded(scores: Mapping[Hashable, float], band: float) -> tuple[Any, list, float | None]:
    """(winner, tied, margin) of ``scores`` (higher is better; given in tie-break order).

    Those within ``band`` x |best| of the best are equal and the first of them wins; the margin
    is its lead over the best other, as a fraction of that (negative: a tied one was ahead)."""
    if not scores:
        return None, [], None
    best = max(scores.values())
    within = [n for n in scores if scores[n] >= best - band * abs(best)]
    winner = within[0]
    others = [scores[n] for n in scores if n != winner]
    margin = None
    if others and max(others) != 0:
        margin = (scores[winner] - max(others)) / abs(max(others))
    return winner, within[1:], margin


def table(plan, rows: list[dict[str, Any]]) -> Table:
    figure = "goodput (req/s)" if plan.use_slo else "e2e mean (s)"
    names = [n for n in LABELS if any(n in r["figures"] for r in rows)]
    columns: list[Column] = [
        (plan.axis.label, itemgetter("load")),
        ("best static k", itemgetter("best_static_k")),
        *((f"{LABELS[n]} {figure}", lambda r, n=n: r["figures"].get(n)) for n in names),
        ("winner", lambda r: LABELS.get(r["winner"], "")),
        ("margin over the best other", itemgetter("margin")),
        ("tied within the band", lambda r: ", ".join(LABELS[n] for n in r["tied_with"])),
        ("winner beats k = 0", itemgetter("winner_beats_off")),
    ]
    return column_table(
        "policies",
        columns,
        rows,
        "Each window policy per load, judged as the plan judges k; policies within its tie band "
        "are equal and the simplest wins; the margin is the winner's lead over the best other "
        "policy, as a fraction of it (negative: a tied policy was nominally ahead)",
    )
