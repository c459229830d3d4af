"""``report drafter-swap --policies``: the drafters and the window policies together, per load:
which drafter with which policy wins, by how much, and which lose to speculation off.

Each chain drafter's ``plan window`` grid gains the policies named: the goodput policy
(``adaptive``), the engines' own (``window_policies.EXTRA_POLICIES``, as ``plan window`` runs
them) and, with ``by_batch``, the drafter's k-by-batch table, derived and run as ``plan window``
does (``window_table.k_by_batch``). A tree drafter runs its tree and is not among them. The static k
is always compared: each drafter's best k above 0 at the load (k = 0 is speculation off, what
every pair is set against).

Judged as ``plan window`` judges its policies (goodput under the SLO, else mean end-to-end
latency; the plan's tie bands): (drafter, policy) pairs within the band of the best are equal
and the simplest policy wins, then the drafter given first (the current one). A pair loses to
speculation off where it is worse than its drafter's k = 0 run by more than the band. The
recommendation keeps its own rule (drafters at their best static k).
"""

from __future__ import annotations

from operator import itemgetter
from typing import Any

from specsim.planning.common import GOODPUT_TIE, answerable_k, choose
from specsim.planning.policy_compare import ADAPTIVE, BY_BATCH, STATIC
from specsim.planning.report import Column, Paragraph, Section, Table, column_table
from specsim.planning.swap import swap, swap_report
from specsim.planning.swap.swap import SwapPlan
from specsim.planning.window import window, window_table
from specsim.planning.window.window_policies import EXTRA_POLICIES, LABELS, banded, score
from specsim.planning.window.window_table import E2E_TIE


def add(plan: SwapPlan, names: tuple[str, ...]) -> None:
    """The policies to compare, set on every chain drafter's grid (one-line error for one its
    profile cannot run)."""
    if not names:
        return
    plan.policies = names
    for d in _chains(plan):
        limit = answerable_k(d.plan.profile, d.plan.scenario.speculation)
        window.add_policies(d.plan, [n for n in names if n in EXTRA_POLICIES], limit)
        d.plan.adaptive = ADAPTIVE in names


def _chains(plan: SwapPlan):
    return [d for d in plan.drafters if d.tree is None]


def compared(plan: SwapPlan) -> list[str]:
    """The static k and the policies named, in ``LABELS``' order."""
    return [n for n in LABELS if n in (STATIC, *plan.policies)]


def run(plan: SwapPlan, sweeper) -> dict[str, Any]:
    """The swap's sweep, then each drafter's k-by-batch table at every load when asked."""
    outcome = swap.run(plan, sweeper)
    outcome["tables"] = {}  # each drafter's derived table (what --emit writes where it wins)
    if BY_BATCH in plan.policies:
        for d in _chains(plan):
            loads = outcome["per_drafter"][d.name]
            rows, _ = window_table.k_by_batch(d.plan, loads)
            outcome["tables"][d.name] = rows
            points = [
                type(p)(p.scenario, p.overrides, {**p.tags, "drafter": d.name})
                for p in window_table.by_batch_points(d.plan, rows)
            ]
            for result in sweeper.run(points, desc=f"k-by-batch check, {d.name}"):
                entry = next(e for e in loads if e.load == result.tags["load"])
                entry.by_config[window_table.BY_BATCH] = result
    outcome["policies"] = choices(plan, outcome["per_drafter"])
    return outcome


def choices(plan: SwapPlan, per_drafter) -> list[dict[str, Any]]:
    """Per load: every (drafter, policy) figure, the winner, its margin over the best other
    pair, the pairs tied with it, whether it beats speculation off, and the pairs that lose
    to it. A pair without a result at a load is left out there."""
    use_slo = plan.first.use_slo
    band = GOODPUT_TIE if use_slo else E2E_TIE
    out = []
    for i, load in enumerate(plan.loads):
        scores: dict[tuple[str, str], float] = {}
        offs: dict[str, float | None] = {}
        static_k = {d.name: drafting_k(d, per_drafter[d.name][i], use_slo) for d in _chains(plan)}
        for name in compared(plan):
            for d in _chains(plan):
                entry = per_drafter[d.name][i]
                config = name if name != STATIC else f"k={static_k[d.name]}"
                value = score(entry.summary(config), use_slo)
                if value is not None:
                    scores[(d.name, name)] = value
                offs[d.name] = score(entry.summary("k=0"), use_slo)
        winner, tied, margin = banded(scores, band)
        off = None if winner is None else offs[winner[0]]
        losing = [
            pair
            for pair, value in scores.items()
            if offs[pair[0]] is not None and value < offs[pair[0]] - band * abs(offs[pair[0]])
        ]
        figures: dict[str, dict[str, float]] = {}
        for (drafter, name), value in scores.items():
            figures.setdefault(drafter, {})[name] = abs(value)
        out.append(
            {
                "load": load,
                "static_k": static_k,
                "figures": figures,
                "speculation_off": {d: None if v is None else abs(v) for d, v in offs.items()},
                "winner": None if winner is None else _pair(winner),
                "margin": margin,
                "tied_with": [_pair(p) for p in tied],
                "winner_beats_off": None if off is None else scores[winner] > off,
                "lose_to_off": [_pair(p) for p in losing],
            }
        )
    return out


def drafting_k(d, entry, use_slo: bool) -> int | None:
    """The drafter's best static k above 0 at a load (``common.choose``): the static policy
    speculates, so that it can lose to speculation off as the other policies can."""
    return choose([(k, entry.summary(f"k={k}")) for k in d.plan.ks if k > 0], use_slo)


def _pair(pair: tuple[str, str]) -> dict[str, str]:
    return {"drafter": pair[0], "policy": pair[1]}


def json_summary(plan: SwapPlan, outcome: dict[str, Any], sweeper) -> dict[str, Any]:
    summary = swap.json_summary(plan, outcome, sweeper)
    summary["policies"] = outcome["policies"]
    return summary


# -- the report -----------------------------------------------------------------------------


def build(plan: SwapPlan, outcome: dict[str, Any], summary: dict[str, Any]):
    """The swap report with "Drafter and window policy per load" after its side-by-side."""
    report = swap_report.build(plan, outcome, summary)
    blocks = [Paragraph(words(plan, c)) for c in outcome["policies"]]
    section = Section("Drafter and window policy per load", [*blocks, table(plan, outcome)])
    report.sections.insert(2, section)
    return report


def _who(pair: dict[str, str]) -> str:
    return f"{pair['drafter']} with the {LABELS[pair['policy']]}"


def words(plan: SwapPlan, choice: dict[str, Any]) -> str:
    """One load's verdict in a sentence or two."""
    at = f"At {plan.first.axis.fmt(choice['load'])}"
    if choice["winner"] is None:
        return f"{at} no run has a result."
    text = f"{at} {_who(choice['winner'])} wins"
    if choice["tied_with"]:
        text += ", tied within the band with " + ", ".join(_who(p) for p in choice["tied_with"])
        text += " (the simplest policy wins a tie"
        if choice["margin"] is not None:
            text += f"; its margin {choice['margin']:+.1%}"
        text += ")"
    elif choice["margin"] is not None:
        text += f" by {choice['margin']:.1%} over the best other"
    beats = choice["winner_beats_off"]
    text += "." if beats is None else (" and beats k = 0." if beats else " but not k = 0.")
    if choice["lose_to_off"]:
        text += " Lose to k = 0: " + ", ".join(_who(p) for p in choice["lose_to_off"]) + "."
    return text


def table(plan: SwapPlan, outcome: dict[str, Any]) -> Table:
    figure = "goodput (req/s)" if plan.first.use_slo else "e2e mean (s)"
    chains = [d.name for d in _chains(plan)]

    def who(pairs: list[dict[str, str]]) -> str:
        return ", ".join(_who(p) for p in pairs)

    columns: list[Column] = [
        (plan.first.axis.label, itemgetter("load")),
        *((f"{d}: static k", lambda c, d=d: c["static_k"][d]) for d in chains),
        *(
            (f"{d}, {LABELS[n]}: {figure}", lambda c, d=d, n=n: c["figures"].get(d, {}).get(n))
            for d in chains
            for n in compared(plan)
        ),
        *((f"{d}, k = 0: {figure}", lambda c, d=d: c["speculation_off"].get(d)) for d in chains),
        ("winner", lambda c: "" if c["winner"] is None else _who(c["winner"])),
        ("margin over the best other", itemgetter("margin")),
        ("tied within the band", lambda c: who(c["tied_with"])),
        ("winner beats k = 0", itemgetter("winner_beats_off")),
        ("lose to k = 0", lambda c: who(c["lose_to_off"])),
    ]
    return column_table(
        "policies",
        columns,
        outcome["policies"],
        "Each drafter with each window policy per load (the static k: its best above 0), "
        "judged as the plan judges k; pairs "
        "within its tie band are equal and the simplest policy wins, then the drafter given "
        "first; the margin is the winner's lead over the best other pair, as a fraction of it "
        "(negative: a tied pair was nominally ahead); a pair loses to k = 0 beyond the band",
    )


def human(summary: dict[str, Any]) -> str:
    lines = []
    for c in summary["policies"]:
        winner = c["winner"]
        lines.append(
            f"  policies at {c['load']:g}: "
            + ("no result" if winner is None else _who(winner))
            + (
                f"; lose to k = 0: {', '.join(_who(p) for p in c['lose_to_off'])}"
                if c["lose_to_off"]
                else ""
            )
        )
    return "\n".join(lines)
