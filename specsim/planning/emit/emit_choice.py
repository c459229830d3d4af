"""Which setting a finished plan recommends to deploy, per command, and at which loads to test it.

- ``plan window``: with ``--policies``, an engine's own policy (SGLang's adaptive steps, vLLM's
  adaptive verification) where it wins the policy verdict at the swept load nearest the
  scenario's own and beats speculation off there; otherwise the k-by-batch table when its
  verdict is "recommended"; otherwise the best static k at that load (k = 0 there:
  speculation off). A table still needs a static k for the engines without one: the best
  static k at that load.
- ``plan capacity``: the candidate the fleet is planned with. The goodput-adaptive policy
  picks k every step from the running batch and acceptance, which no engine's configuration
  can: the same drafter's best static candidate stands in, said so in every file. With
  ``--policies``, the engine's policy or k-by-batch table that wins the comparison among what
  an engine runs, where it needs fewer replicas than speculation off.
- ``report drafter-swap``: the recommended drafter at its best k at the load nearest the
  scenario's own; with ``--policies``, with an engine's own policy or its k-by-batch table
  where that is the drafter's best among what an engine runs there and beats speculation off.

One rule picks an emitted policy (``_engine_policy``; ``capacity_policies.deployable`` for
replicas): the best of what an engine runs, the goodput policy left out, when it is not the
static k and beats speculation off.

The bench runs every load the plan swept (``plan capacity``: each replica's share of the target
rate, and the candidate's capacity).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specsim.planning.capacity.capacity import choose_candidate
from specsim.planning.common import metric, plural
from specsim.planning.emit.emit_workload import PlannedLoad, open_loop_requests
from specsim.planning.policy_compare import start_k
from specsim.planning.window.window_policies import (
    EXTRA_POLICIES,
    LABELS,
    deployable_winner,
    score,
)
from specsim.planning.window.window_table import BY_BATCH, RECOMMENDED
from specsim.serving.bench_commands import number


@dataclass
class Choice:
    """The recommendation as the emitter needs it. ``drafter`` None: speculation off."""

    command: str
    scenario: Any  # the scenario the plan ran (its speculation, engine and workload sections)
    scenario_path: str
    profile: Any  # the LoadedProfile the drafter comes from
    drafter: str | None
    k: int
    reason: str
    loads: list[PlannedLoad]
    rows: list[dict[str, int]] = field(default_factory=list)  # the k-by-batch table, if chosen
    static_k: int | None = None  # with a table: the best static k at the chosen load
    unexpressed: list[str] = field(default_factory=list)
    tree: Any = None  # a TreeCandidate when a tree is recommended (k is its depth)
    tree_drafts: str | None = None
    policy: str | None = None  # an engine policy the plan chose (None: the scenario's own)


def nearest(entries: list, base: float):
    """The entry whose load is nearest the scenario's own (the lower one on a tie)."""
    return min(entries, key=lambda e: (abs(e.load - base), e.load))


def _swept_loads(plan, entries, config: str) -> list[PlannedLoad]:
    """Every swept load as the bench sends it; a closed loop's request count is the one its
    simulation at that load completed (its clients' pace and the duration set it)."""
    axis, scenario = plan.axis, plan.scenario
    out = []
    for entry in entries:
        name, text = f"{axis.kind}-{number(entry.load)}", axis.fmt(entry.load)
        if axis.kind == "concurrency":
            clients = round(entry.load)
            # What its simulation completed within the workload's limits (duration, requests).
            done = metric(entry.summary(config) or entry.best, "requests")
            requests = int(done) if done else scenario.workload.requests or 10 * clients
            out.append(PlannedLoad(name, text, None, clients, requests))
            continue
        rate = plan.offered_rps(entry.load)
        requests = open_loop_requests(scenario, rate, plan.scale, entry.load)
        out.append(PlannedLoad(name, text, rate, None, requests))
    return out


def _off_above(outcome: dict[str, Any], axis, speculating: bool) -> list[str]:
    above = outcome["verdict"]["speculation_off_above_load"]  # None without a crossover
    if not speculating or above is None:
        return []
    return [
        f"the plan turns speculation off above {axis.fmt(above)} (k = 0 with no drafter "
        f"deployed is best from {axis.fmt(outcome['crossover']['load'])} on); no engine "
        "setting undeploys the drafter by load: serve the plain configuration there"
    ]


def window_choice(plan, outcome: dict[str, Any]) -> Choice | None:
    """``plan window``'s recommendation (None when no load has a result)."""
    known = [e for e in outcome["loads"] if e.best_k is not None]
    if not known:
        return None
    chosen = nearest(known, plan.axis.base)
    where = f"{plan.axis.fmt(chosen.load)}, the swept load nearest the scenario's own"
    drafter = plan.scenario.speculation.drafter
    table = outcome["verdict"]["verdict"] == RECOMMENDED and outcome["rows"]

    loads = _swept_loads(plan, outcome["loads"], BY_BATCH if table else f"k={chosen.best_k}")
    common = {"scenario": plan.scenario, "scenario_path": plan.scenario_path}
    common.update(command="plan window", profile=plan.profile, loads=loads)
    rows = outcome["rows"]
    tree = plan.tree_by_config.get(chosen.best_config or "")
    row = _verdict_row(outcome, chosen.load)
    engine_policy = _engine_policy(row and row["figures"], chosen, plan.use_slo)
    if engine_policy in EXTRA_POLICIES and tree is None:
        k = start_k(engine_policy, plan.scenario.speculation, max(plan.ks))
        reason = (
            f"{LABELS[engine_policy]} (k = {k}), the window policy that wins at {where} and "
            "beats speculation off there"
        )
        choice = Choice(drafter=drafter, k=k, reason=reason, **common)
        choice.policy = engine_policy
        choice.loads = _swept_loads(plan, outcome["loads"], engine_policy)
    elif tree is not None:
        # A tree beats every chain here: it is what to run (no engine takes a tree table).
        reason = f"tree {tree.config} ({tree.shape.describe()}), the best setting at {where}"
        choice = Choice(drafter=drafter, k=tree.shape.depth, reason=reason, **common)
        choice.tree, choice.tree_drafts = tree, plan.tree_drafts
        choice.loads = _swept_loads(plan, outcome["loads"], tree.config)
    elif table:
        reason = f"the k-by-batch table, which the plan recommends: {outcome['verdict']['reason']}"
        choice = Choice(drafter=drafter, k=0, reason=reason, **common)
        table_choice(choice, rows, chosen.best_k, "the recommended k-by-batch table")
    elif chosen.best_k == 0:
        reason = f"speculation off: k = 0 with no drafter is best at {where}"
        choice = Choice(drafter=None, k=0, reason=reason, **common)
    else:
        reason = f"k = {chosen.best_k}, the best static k at {where}"
        choice = Choice(drafter=drafter, k=chosen.best_k, reason=reason, **common)
    choice.unexpressed += _off_above(outcome, plan.axis, choice.drafter is not None)
    return choice


def _verdict_row(outcome: dict[str, Any], load: float) -> dict[str, Any] | None:
    """The policy verdict's row at ``load`` (None without ``--policies`` results there)."""
    return next((r for r in outcome.get("policies", ()) if r["load"] == load), None)


def _engine_policy(figures: dict[str, float] | None, chosen, use_slo: bool) -> str | None:
    """The one rule for an emitted policy: the best of ``figures`` (a verdict row's, by policy)
    among what an engine runs (``deployable_winner``), when that is not the static k and it
    beats speculation off at the chosen load (``by_batch`` or an ``EXTRA_POLICIES`` name; None
    otherwise: the static rule stands)."""
    if not figures:
        return None
    winner = deployable_winner(figures, use_slo)
    off = score(chosen.summary("k=0"), use_slo)
    if winner not in (BY_BATCH, *EXTRA_POLICIES) or off is None:
        return None
    mine = score(chosen.summary(winner), use_slo)
    return winner if mine is not None and mine > off else None


def table_choice(choice: Choice, rows: list[dict[str, int]], static_k: int | None, name: str):
    """``choice`` (its drafter, command and loads set) running the k-by-batch table ``rows``
    (``name``: the table in words), with ``static_k`` for the engines without a table; one k
    at every batch size is a static k, which every engine runs as such."""
    if len({r["k"] for r in rows}) == 1:
        choice.k, choice.reason = rows[0]["k"], f"k = {rows[0]['k']}, {name}'s only window"
        return choice
    choice.k = max(r["k"] for r in rows)
    choice.rows, choice.static_k = rows, static_k
    return choice


def swap_choice(plan, outcome: dict[str, Any]) -> Choice | None:
    """``report drafter-swap``'s: the recommended drafter at its best k near the own load."""
    name = outcome["recommended"]
    drafter = next(d for d in plan.drafters if d.name == name)
    entries = outcome["per_drafter"][name]
    known = [e for e in entries if e.best_k is not None]
    if not known:
        return None
    own = drafter.plan
    chosen = nearest(known, own.axis.base)
    where = f"{own.axis.fmt(chosen.load)}, the swept load nearest the scenario's own"
    loads = _swept_loads(own, entries, f"k={chosen.best_k}")
    common = {"scenario": own.scenario, "scenario_path": plan.scenario_path, "loads": loads}
    common.update(command="report drafter-swap", profile=own.profile)
    tree = drafter.tree
    if tree is not None and chosen.best_config == tree.config:
        common["loads"] = _swept_loads(own, entries, tree.config)
        reason = (
            f"drafter {drafter.drafter_name} drafting the tree {tree.text} (recommended), its "
            f"best setting at {where}"
        )
        choice = Choice(drafter=drafter.drafter_name, k=tree.shape.depth, reason=reason, **common)
        choice.tree, choice.tree_drafts = tree, own.tree_drafts
        return choice
    row = _verdict_row(outcome, chosen.load)
    policy = _engine_policy(row and row["figures"].get(name), chosen, plan.first.use_slo)
    if policy == BY_BATCH:
        common["loads"] = _swept_loads(own, entries, BY_BATCH)
        reason = (
            f"drafter {name} (recommended) with its k-by-batch table, its best window policy "
            f"an engine runs at {where}, ahead of speculation off"
        )
        choice = Choice(drafter=drafter.drafter_name, k=0, reason=reason, **common)
        rows = outcome["tables"][name]
        return table_choice(choice, rows, chosen.best_k, f"drafter {name}'s k-by-batch table")
    if policy is not None:
        k = start_k(policy, own.scenario.speculation, max(own.ks))
        common["loads"] = _swept_loads(own, entries, policy)
        reason = (
            f"drafter {name} (recommended) with {LABELS[policy]} (k = {k}), its best window "
            f"policy an engine runs at {where}, ahead of speculation off"
        )
        choice = Choice(drafter=drafter.drafter_name, k=k, reason=reason, **common)
        choice.policy = policy
        return choice
    if chosen.best_k == 0:
        reason = f"speculation off: the recommended {name}'s best k is 0 at {where}"
        return Choice(drafter=None, k=0, reason=reason, **common)
    reason = f"drafter {name} (recommended) at k = {chosen.best_k}, its best k at {where}"
    return Choice(drafter=drafter.drafter_name, k=chosen.best_k, reason=reason, **common)


def capacity_choice(plan, outcome: dict[str, Any]) -> Choice | None:
    """``plan capacity``'s: with ``--policies``, the best policy an engine runs where it is not
    the static k and needs fewer replicas than speculation off (``capacity_policies.
    deployable``); else the chosen candidate (an adaptive one replaced by the same drafter's
    best static candidate)."""
    from specsim.planning.capacity.capacity_policies import deployable

    policy = deployable(plan, outcome)
    if policy is not None:
        return _capacity_policy_choice(plan, outcome, policy)
    chosen = outcome["chosen"]
    if chosen is None:
        return None
    fleet = outcome["fleet"]
    replicas = fleet[-1][0] if fleet else chosen.replicas
    common = _capacity_common(plan, chosen, replicas)
    candidate = chosen.candidate
    fleet_text = f"{plural(replicas, 'replica')} for {plan.target_rps:g} req/s"
    if candidate.drafter is None:
        return Choice(drafter=None, k=0, reason=f"speculation off ({fleet_text})", **common)
    if candidate.policy != "adaptive":
        reason = f"{candidate.label} ({fleet_text})"
        return Choice(drafter=candidate.drafter, k=candidate.k, reason=reason, **common)
    stand_in = choose_candidate(_static_of(outcome, candidate))
    note = (
        f"the goodput-adaptive policy the plan chose ({candidate.label}, {fleet_text}) picks k "
        "at every step from the running batch and acceptance, which no engine's configuration "
        "can; written instead: "
    )
    if stand_in is None:
        choice = Choice(drafter=None, k=0, reason="speculation off", **common)
        choice.unexpressed.append(note + "speculation off (no static candidate sustained a rate)")
        return choice
    label = stand_in.candidate.label
    reason = f"{label}, standing in for {candidate.label} ({fleet_text})"
    choice = Choice(drafter=candidate.drafter, k=stand_in.candidate.k, reason=reason, **common)
    replicas_text = plural(stand_in.replicas, "replica")
    choice.unexpressed.append(
        note + f"{label}, the drafter's best static candidate ({replicas_text}, "
        f"{stand_in.capacity:.4g} req/s per replica)"
    )
    return choice


def _capacity_common(plan, chosen, replicas: int) -> dict[str, Any]:
    """A capacity choice's fields but its setting: the loads the bench runs (each replica's
    share of the target, and the candidate's capacity) and where it comes from."""
    share = plan.target_rps / replicas
    loads = []
    rates = [("share", share)]
    if chosen.capacity != share:
        rates.append(("capacity", chosen.capacity))
    for name, rate in rates:
        knob = plan.scale.knob(rate)
        requests = open_loop_requests(plan.scenario, rate, plan.scale, knob)
        text = f"{rate:.4g} req/s ({'each replica' if name == 'share' else 'one replica'}'s "
        text += "share of the target)" if name == "share" else "capacity)"
        loads.append(PlannedLoad(f"{name}-{rate:.4g}", text, rate, None, requests))
    common = {"scenario": plan.scenario, "scenario_path": plan.scenario_path, "loads": loads}
    common.update(command="plan capacity", profile=chosen.candidate.profile(plan))
    return common


def _static_of(outcome: dict[str, Any], candidate) -> list:
    """The plan's fixed-k results of ``candidate``'s drafter on its deployment (TP, precision)."""
    return [
        r
        for r in outcome["candidates"]
        if r.candidate.drafter == candidate.drafter
        and r.candidate.policy == "fixed"
        and r.candidate.deployment is candidate.deployment
    ]


def _capacity_policy_choice(plan, outcome: dict[str, Any], result) -> Choice:
    """The engine policy (or k-by-batch table) that wins the policy comparison at the target;
    its fleet is the one its capacity calls for (the fleet check ran the plan's own)."""
    candidate = result.candidate
    common = _capacity_common(plan, result, result.replicas)
    reason = (
        f"{candidate.label} ({plural(result.replicas, 'replica')} for {plan.target_rps:g} "
        "req/s by capacity), the window policy an engine runs that wins the comparison at the "
        "target and needs fewer replicas than speculation off"
    )
    choice = Choice(drafter=candidate.drafter, k=candidate.k, reason=reason, **common)
    if candidate.policy != BY_BATCH:
        choice.policy = candidate.policy
        return choice
    best = choose_candidate(_static_of(outcome, candidate))
    static_k = None if best is None else best.candidate.k
    rows = outcome["tables"][candidate.label]
    return table_choice(choice, rows, static_k, candidate.label)
