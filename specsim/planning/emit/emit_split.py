"""``--emit`` for ``plan capacity --disaggregated``: each pool's engine configuration.

The layout written is the cheapest disaggregated choice (with speculation when it costs no
more than without). Each pool becomes an ``EngineSetting`` with its ``role`` (the prefill pool
with speculation off, the decode pool with the setting searched, each on its own deployment's
TP and formats), rendered by the engines' own writers, which add their disaggregation options:
vLLM's ``--kv-transfer-config``, SGLang's ``--disaggregation-mode`` and transfer backend,
TensorRT-LLM's ``cache_transceiver_config`` per server and ``trtllm-disagg.yaml`` for
``trtllm-serve disaggregated`` (engine-formats.md §3.8, §4.8, §5.7). An engine that cannot
express either pool's setting is refused in one line and writes nothing. A split fleet's load
test goes through its router, so no bench.sh is written.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from specsim.planning.capacity.disagg import DISAGGREGATED, SPEC_OFF, DisaggregatedPlan, Search
from specsim.planning.common import plural
from specsim.planning.emit import emit
from specsim.planning.emit.emit import FOLDER, EmitRequest, common_header, setting_for
from specsim.planning.emit.emit_choice import Choice
from specsim.serving import registry
from specsim.serving.setting import ROLES

# Every file a split emit may write: a rerun removes the ones it no longer writes.
FILES = tuple(name for e in registry.ENGINES for name in e.split_files)

DRAFTER_HANDOVER = (
    "The decode pool's drafter needs the prompt's KV cache or hidden states, which specsim's "
    "split fleet costs as specsim.simulation.disagg states per drafter kind: check that your "
    "engine version runs this drafter behind its KV transfer"
)


def split_choice(searches: list[Search], pricing) -> Search | None:
    """The cheapest disaggregated choice (ties: the first search, the speculating one)."""
    found = [s for s in searches if s.kind == DISAGGREGATED and s.chosen is not None]
    return min(found, key=lambda s: s.chosen.price(pricing), default=None)


def pool_choice(plan: DisaggregatedPlan, search: Search, role: str) -> Choice:
    """One pool of the chosen layout as the emitter's ``Choice``."""
    from specsim.simulation.run import cached_profile

    layout, scenario = search.chosen, plan.scenario
    on = layout.prefill_on if role == "prefill" else layout.decode_on
    if on is not None:
        profile = plan.deployment(on).profile
    else:
        pool = getattr(scenario.fleet.disaggregation, role)
        profile = cached_profile(scenario.resolve(pool.profile or scenario.profile))
    spec = scenario.speculation
    speculating = role == "decode" and search.setting != SPEC_OFF and spec.enabled
    replicas = layout.prefill if role == "prefill" else layout.decode
    reason = (
        f"{layout.label} for {plan.target_rps:g} req/s, {search.setting}: the {role} pool's "
        f"{plural(replicas, 'replica')} each run this file"
    )
    unexpressed = []
    if speculating and spec.policy != "fixed":
        unexpressed.append(
            f"the scenario's {spec.policy} policy picks k per step, which no engine's "
            f"configuration can; written instead: k = {spec.k}"
        )
    return Choice(
        command="plan capacity --disaggregated",
        scenario=scenario,
        scenario_path=plan.scenario_path,
        profile=profile,
        drafter=spec.drafter if speculating else None,
        k=spec.k if speculating else 0,
        reason=reason,
        loads=[],
        unexpressed=unexpressed,
    )


def attach(
    plan: DisaggregatedPlan, searches: list[Search], summary, attachments, request: EmitRequest
) -> None:
    """The engines' files for the chosen split layout into ``attachments`` (name -> text,
    under ``engine/``) and summary.json's ``engine`` block."""
    search = split_choice(searches, plan.pricing)
    if search is None:
        summary["engine"] = {
            "recommended": None,
            "reason": "no disaggregated layout holds the SLO within the replicas searched",
        }
        return
    layout = search.chosen
    choices = {role: pool_choice(plan, search, role) for role in ROLES}
    settings = {role: replace(setting_for(c, request), role=role) for role, c in choices.items()}
    block: dict[str, Any] = {
        "recommended": {
            "layout": layout.label,
            "setting": search.setting,
            "prefill_replicas": layout.prefill,
            "decode_replicas": layout.decode,
            "drafter": choices["decode"].drafter,
            "k": choices["decode"].k,
        },
        "models": {
            m.name: {"path": m.path, "source": m.source}
            for s in settings.values()
            for m in s.models
        },
        "bench": None,
        "bench_note": "a split fleet is load-tested through its router: no bench.sh",
    }
    for engine in request.engines:
        block[engine] = _engine_files(engine, choices, settings, layout, attachments)
    summary["engine"] = block


def _engine_files(name, choices, settings, layout, attachments) -> dict[str, Any]:
    engine = registry.engine(name)
    for role in ROLES:
        reason = engine.writer.refuses(settings[role])
        if reason:
            return {"files": [], "refused": f"the {role} pool: {reason}"}
    files, written, missing, remarks = [], {}, [], []
    for role in ROLES:
        setting = settings[role]
        header = [*common_header(choices[role], setting), f"Router: {engine.router}."]
        if setting.speculation is not None:
            header.append(DRAFTER_HANDOVER)
        item = engine.writer.render(setting, header)
        for file, text in item.files.items():
            attachments[f"{FOLDER}/{file}"] = text
            files.append(f"{FOLDER}/{file}")
        written[role] = item.summary(FOLDER)["written"]
        missing += [f"{role}: {note}" for note in item.not_expressible]
        remarks += [f"{role}: {note}" for note in item.notes]
    if engine.router_file is not None:
        file, router_file = engine.router_file
        text, config = router_file(layout.label, layout.prefill, layout.decode)
        attachments[f"{FOLDER}/{file}"] = text
        files.append(f"{FOLDER}/{file}")
        written["disaggregated"] = config
    return {
        "files": files,
        "written": written,
        "router": engine.router,
        "not_expressible": missing,
        "notes": remarks,
    }


def remove_stale(out: str | Path, summary: dict[str, Any]) -> None:
    """After a split plan is written: the engine files an earlier run wrote and this one did
    not."""
    emit.remove_stale(out, summary, FILES)
