"""``--emit vllm,sglang,trtllm``: the recommended setting in each engine's own configuration.

A finished plan's recommendation (``emit_choice``) becomes an engine-neutral ``EngineSetting``
(``serving.setting``): the scenario's scheduler limits, the drafter and its window or k-by-batch
table, the models' paths and the profile's acceptance as unconditional per-position rates (for
the forced-acceptance test). Each engine's writer, found by name in the engine registry
(``serving.registry``), checks it against that engine's documented constraints and renders it;
``bench.sh`` holds the load tests (``serving.bench_commands``). The files join the report's
attachments under ``engine/``, so they are written atomically with the rest, and summary.json
gets an ``engine`` block. Model paths: ``--model NAME=PATH`` first, then a profile description
that reads as a Hugging Face id (``owner/name``, which ``profile roofline`` copies from the
model's config.json), else a placeholder the header tells the user to replace.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from specsim.errors import SpecsimError
from specsim.planning.emit.emit_choice import Choice
from specsim.planning.emit.emit_workload import bench_header, bench_plan, bench_summary
from specsim.planning.window.window_trees import chain_survival
from specsim.serving import bench_commands, registry
from specsim.serving.registry import NAMES
from specsim.serving.setting import (
    FROM_PROFILE,
    GIVEN,
    BatchRow,
    EngineSetting,
    ModelRef,
    Rendered,
    Speculative,
    deployment,
    placeholder,
)
from specsim.version import __version__

FOLDER = "engine"
# Every file an emit may write: a rerun removes the ones it no longer writes.
FILES = (*(name for e in registry.ENGINES for name in e.files), bench_commands.SCRIPT)
HF_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
UNSAFE_PATH = re.compile(r"[\x00-\x1f\x7f\"$`\\]")


@dataclass(frozen=True)
class EmitRequest:
    """The engines asked for (in the registry's order) and the model paths given."""

    engines: tuple[str, ...]
    models: tuple[tuple[str, str], ...] = ()


def parse_engines(value: str | Iterable[str], option: str = "--emit") -> tuple[str, ...]:
    """``vllm,sglang`` (or a list of names) -> the engines in the registry's order."""
    names = value.split(",") if isinstance(value, str) else [str(v) for v in value]
    names = [n.strip() for n in names]
    for name in names:
        registry.engine(name, option)
    if len(set(names)) != len(names):
        fix = f"give a comma-separated subset of {','.join(NAMES)}"
        raise SpecsimError("an engine is named twice", key=option, fix=fix)
    return tuple(e.name for e in registry.entries(names))


def parse_model(text: str, option: str = "--model") -> tuple[str, str]:
    """``NAME=PATH``: ``target`` or a drafter of the profile, and its Hugging Face id or folder."""
    name, _, path = text.partition("=")
    name, path = name.strip(), path.strip()
    if not name or not path:
        raise SpecsimError(
            f"{text!r} is not NAME=PATH",
            key=option,
            fix="write e.g. target=meta-llama/Llama-3.1-8B-Instruct or DRAFTER=HF_ID_OR_FOLDER",
        )
    if UNSAFE_PATH.search(path):
        raise SpecsimError(
            f"the path for {name!r} holds a quote, '$', '`', '\\' or a control character",
            key=option,
            fix="give a Hugging Face id or a folder without them (the path is pasted into shells)",
        )
    return name, path


def emit_request(
    emit: str | Iterable[str] | None,
    models: Iterable[str] | dict[str, str] | None,
    options: tuple[str, str] = ("--emit", "--model"),
) -> EmitRequest | None:
    """The request from ``--emit`` and ``--model`` texts (or the API's ``emit`` and a
    ``models`` dict; ``options`` names them in errors)."""
    emit_option, model_option = options
    if isinstance(models, dict):
        texts = [f"{name}={path}" for name, path in models.items()]
    else:
        texts = list(models or [])
    pairs = [parse_model(text, model_option) for text in texts]
    if emit is None:
        if pairs:
            raise SpecsimError(
                "model paths are for the engine configuration, which nothing asks for",
                key=model_option,
                fix=f"add {emit_option} {','.join(NAMES)} (or a subset), or drop {model_option}",
            )
        return None
    names = [name for name, _ in pairs]
    if len(set(names)) != len(names):
        raise SpecsimError("a model is named twice", key=model_option, fix="give each name once")
    return EmitRequest(parse_engines(emit, emit_option), tuple(pairs))


def check_models(request: EmitRequest | None, profiles: Iterable[Any]) -> None:
    """Every ``--model`` name is the target or a drafter with a model, before any simulation."""
    if request is None:
        return
    profiles = list(profiles)
    drafters = {name: spec for p in profiles for name, spec in p.profile.drafters.items()}
    for name, _ in request.models:
        spec, drop = drafters.get(name), f"drop --model {name}=..."
        if name == "target":
            continue
        if spec is None:
            why = "is neither the target nor a drafter of the profile"
            fix = "name one of: " + ", ".join(["target", *sorted(drafters)])
        elif spec.kind == "ngram":
            why, fix = "is prompt lookup, which has no model", drop
        elif spec.method == "mtp":
            why = "is the target's MTP module, which loads from the target's checkpoint"
            fix = f"{drop} (give --model target=... instead)"
        else:
            continue
        raise SpecsimError(f"{name!r} {why}", key="--model", fix=fix)


def model_ref(name: str, description: str, given: dict[str, str]) -> ModelRef:
    if name in given:
        return ModelRef(name, given[name], GIVEN)
    if HF_ID.match(description.strip()):
        return ModelRef(name, description.strip(), FROM_PROFILE)
    return placeholder(name)


def unconditional_rates(choice: Choice, k: int) -> tuple[float, ...]:
    """P(the first i drafts of a step are all accepted), i = 1..k, from the conditional rates
    the simulator chains for the scenario's acceptance model; for a tree, P(its accepted path
    reaches depth i), from the profile's tree entry (measured, else derived)."""
    spec = choice.scenario.speculation
    if choice.tree is not None:
        entry = choice.profile.profile.tree_acceptance_for(
            choice.drafter, spec.verifier, spec.temperature, choice.tree.shape, choice.tree_drafts
        )
        survival = np.cumsum(np.asarray(entry.accepted_length)[::-1])[::-1][1:]
        return tuple(float(min(1.0, p)) for p in survival)
    return tuple(float(p) for p in chain_survival(choice.profile, spec, k, choice.drafter))


def cut_rows(rows: list, cut: int | None, scenario) -> tuple[BatchRow, ...]:
    """A chosen table's rows, ended at the scenario's max_concurrency when it has one (then
    k = 0 up to the largest batch, so that every engine's table says so)."""
    table = tuple(BatchRow(r["max_batch"], r["k"]) for r in rows)
    if not table or cut is None:
        return table
    at_cut = next((row.k for row in table if row.max_batch >= cut), 0)
    kept = (*(row for row in table if row.max_batch < cut), BatchRow(cut, at_cut))
    largest = scenario.engine.max_batch
    return kept + ((BatchRow(largest, 0),) if cut < largest else ())


def engine_switches(speculation, rows: list, policy: str | None = None) -> dict:
    """The scenario's engine switches as ``Speculative`` holds them, for its policy or the
    engine policy the plan chose (``policy``). A table chosen with a max_concurrency ends its
    rows there instead (TensorRT-LLM refuses both at once)."""
    out: dict = {}
    policy = policy or speculation.policy
    gate = speculation.acceptance_gate
    if gate is not None and policy in ("fixed", "by_batch"):
        out["acceptance_gate"] = (gate.threshold, gate.window)
    if policy == "adaptive_steps":
        out["adaptive_steps"] = speculation.steps_config.engine_config()
    if policy == "adaptive_verification":
        out["adaptive_verification"] = True
    if speculation.max_concurrency is not None and not rows:
        out["max_concurrency"] = speculation.max_concurrency
    return out


def setting_for(choice: Choice, request: EmitRequest) -> EngineSetting:
    """The engine-neutral setting of a recommendation."""
    from specsim.drafters import DEFAULT_NGRAM

    given = dict(request.models)
    profile = choice.profile.profile
    target = model_ref("target", profile.target.description, given)
    scenario = choice.scenario
    spec = None
    if choice.drafter is not None:
        drafter = profile.drafters[choice.drafter]
        kind = drafter.kind
        # Prompt lookup has no model; an MTP drafter is the target's own layers.
        own_model = kind != "ngram" and drafter.method != "mtp"
        model = model_ref(choice.drafter, drafter.description, given) if own_model else None
        spec = Speculative(
            drafter=choice.drafter,
            kind=kind,
            k=choice.k,
            model=model,
            unconditional_rates=unconditional_rates(choice, choice.k),
            by_batch=cut_rows(choice.rows, scenario.speculation.max_concurrency, scenario),
            static_k=choice.static_k,
            ngram_size=DEFAULT_NGRAM if kind == "ngram" else None,
            tree=None if choice.tree is None else choice.tree.shape,
            tree_drafts=None if choice.tree is None else choice.tree_drafts,
            sglang_knobs=None if choice.tree is None else choice.tree.sglang,
            method=drafter.method,
            passes=drafter.passes,
            **engine_switches(scenario.speculation, choice.rows, choice.policy),
        )
    return EngineSetting(
        target=target,
        max_batch=scenario.engine.max_batch,
        max_batched_tokens=scenario.engine.max_batched_tokens,
        speculation=spec,
        verifier=scenario.speculation.verifier,
        temperature=scenario.speculation.temperature,
        unexpressed=tuple(choice.unexpressed),
        block_size=scenario.engine.block_size,
        prefix_caching=scenario.workload.prefix is not None,
        **deployment(profile, choice.drafter),
    )


def common_header(choice: Choice, setting: EngineSetting) -> list[str]:
    """The lines every file opens with: version, scenario, profile, the choice, the models."""
    scenario, spec = choice.scenario, setting.speculation
    lines = [
        f"specsim {__version__}: `{choice.command}` of scenario {scenario.name!r} "
        f"({choice.scenario_path}) with profile {choice.profile.name!r} ({choice.profile.path}).",
        f"Recommended: {choice.reason}.",
        f"Scheduler (the scenario's engine section): at most {setting.max_batch} running "
        f"sequences and {setting.max_batched_tokens} batched tokens per iteration.",
        "Models: " + "; ".join(m.describe() for m in setting.models) + ".",
    ]
    if spec is not None:
        lines.append(
            f"The profile's acceptance is the {setting.verifier} verifier's at temperature "
            f"{setting.temperature:g}: send requests at that temperature (the engines verify "
            "greedily at temperature 0)."
        )
    if spec is not None and spec.kind == "ngram":
        lines.append(
            f"Prompt lookup matches the last n = {spec.ngram_size} tokens, as specsim's does "
            "(profile measure --drafter ngram); a profile measured with ngram:N needs N instead."
        )
    if not scenario.engine.chunked_prefill:
        lines.append(
            "The scenario runs prefills whole (chunked_prefill: false); engine-formats.md names "
            "no option for it, so the engines' default chunking is left as it is."
        )
    return lines


def attach(planned, choice: Choice | None, request: EmitRequest) -> None:
    """Render the engines' files into the report's attachments and the summary's block."""
    if choice is None:
        planned.summary["engine"] = {
            "recommended": None,
            "reason": "no recommendation: the plan's simulations failed",
        }
        return
    setting = setting_for(choice, request)
    header = common_header(choice, setting)
    # An engine that cannot express the setting (a tree it has no keys for) writes nothing.
    refused = {e: reason for e in request.engines if (reason := refusal(e, setting))}
    rendered: dict[str, Rendered] = {
        e: registry.engine(e).writer.render(setting, header)
        for e in request.engines
        if e not in refused
    }
    plan, notes = bench_plan(choice.scenario, choice.loads)
    recommended: dict[str, Any] = {
        "drafter": choice.drafter,
        "k": choice.k,
        "k_by_batch": choice.rows or None,
        "reason": choice.reason,
        "not_expressible": list(setting.unexpressed),
    }
    if choice.tree is not None:
        recommended["tree"] = {**choice.tree.json(), "drafts": choice.tree_drafts}
    block: dict[str, Any] = {
        "recommended": recommended,
        "models": {m.name: {"path": m.path, "source": m.source} for m in setting.models},
    }
    for engine, reason in refused.items():
        block[engine] = {"files": [], "refused": reason}
    for engine, item in rendered.items():
        for name, text in item.files.items():
            planned.report.attachments[f"{FOLDER}/{name}"] = text
        block[engine] = item.summary(FOLDER)
    clients = registry.bench_clients(rendered)
    lines = bench_header(header[:2], choice, setting, rendered, plan, notes)
    script = bench_commands.script(plan, lines, clients)
    planned.report.attachments[f"{FOLDER}/{bench_commands.SCRIPT}"] = script
    block["bench"] = bench_summary(plan, clients, notes, FOLDER)
    planned.summary["engine"] = block


def refusal(engine: str, setting: EngineSetting) -> str | None:
    """The engine's one-line refusal of the setting (None: it writes it)."""
    return registry.engine(engine).writer.refuses(setting)


def remove_stale(out: str | Path, summary: dict[str, Any], files: tuple[str, ...] = FILES) -> None:
    """After a plan is written: the engine files (of ``files``) an earlier run wrote and this
    one did not."""
    folder = Path(out) / FOLDER
    block = summary.get("engine") or {}
    kept = {Path(f).name for e in NAMES for f in (block.get(e) or {}).get("files", [])}
    if block.get("bench"):
        kept.add(bench_commands.SCRIPT)
    for name in files:
        if name not in kept:
            (folder / name).unlink(missing_ok=True)


def human(summary: dict[str, Any]) -> str | None:
    """One line for the terminal: the files written (a split layout's files, named by the
    layout), and any placeholder path."""
    block = summary.get("engine")
    if block is None:
        return None
    if block.get("recommended") is None:
        return f"engine: nothing written ({block['reason']})"
    files = [f for e in NAMES for f in (block.get(e) or {}).get("files", [])]
    if block.get("bench"):
        files.append(block["bench"]["file"])
    layout = block["recommended"].get("layout")
    head = "engine" if layout is None else f"engine ({layout})"
    return files_line(block, f"{head}: {', '.join(files) or 'no files'}")


def files_line(block: dict[str, Any], line: str) -> str:
    """``line`` with the placeholder model paths and each engine's refusal added."""
    placeholders = [n for n, m in block["models"].items() if m["source"] == "placeholder"]
    if placeholders:
        line += (
            f" (placeholder model paths, replace them or give --model: {', '.join(placeholders)})"
        )
    for engine in NAMES:
        reason = (block.get(engine) or {}).get("refused")
        if reason:
            line += f"\nengine: {engine} refused: {reason}"
    return line
