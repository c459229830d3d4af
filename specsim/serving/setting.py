"""The serving setting a plan recommends, in no engine's keys: what each engine's writer renders.

``EngineSetting`` is one replica's configuration: the target, the scheduler's limits and the
speculation (``None``: speculation off, which every engine writes as its plain configuration,
with no drafter deployed). ``Rendered`` is what a writer gives back: the files, what it wrote
(for summary.json) and what the engine could not express, with what it wrote instead.
"""

from __future__ import annotations

import json
import math
import shlex
import textwrap
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from specsim.errors import SpecsimError
from specsim.tree import TreeShape

# Where a model's path came from: given with --model, read from the profile, or unknown.
GIVEN, FROM_PROFILE, PLACEHOLDER = "given", "profile", "placeholder"
PLACEHOLDER_PREFIX = "REPLACE-ME"


@dataclass(frozen=True)
class ModelRef:
    """A model as the engine loads it: a Hugging Face id or a local folder."""

    name: str  # ``target`` or the profile's drafter name
    path: str
    source: str  # GIVEN, FROM_PROFILE or PLACEHOLDER

    @property
    def placeholder(self) -> bool:
        return self.source == PLACEHOLDER

    def describe(self) -> str:
        """``target: meta-llama/X (from the profile)``, or the placeholder's instruction."""
        if self.placeholder:
            return (
                f"{self.name}: {self.path} is a PLACEHOLDER (no path is known): replace it, or "
                f"give --model {self.name}=HF_ID_OR_FOLDER"
            )
        origin = "given with --model" if self.source == GIVEN else "the profile's description"
        return f"{self.name}: {self.path} ({origin})"


def placeholder(name: str) -> ModelRef:
    return ModelRef(name, f"{PLACEHOLDER_PREFIX}/{name}", PLACEHOLDER)


@dataclass(frozen=True)
class BatchRow:
    """Window ``k`` while the running batch is at most ``max_batch`` (specsim's by_batch row)."""

    max_batch: int
    k: int


@dataclass(frozen=True)
class Speculative:
    """The speculation to deploy: a drafter of one of specsim's kinds and its window.

    ``k`` is the window (the table's largest k when ``by_batch`` is set). ``by_batch`` rows cover
    batch sizes 1..their last ``max_batch`` in order; none means a static k. ``static_k`` is the
    static window the plan found best at its chosen load, what an engine that cannot take a
    table runs instead (0: speculation off). ``unconditional_rates[i]`` is the chance that a
    step's first i + 1 drafts are all accepted (vLLM's per-position definition), for the
    engines' forced-acceptance knobs (for a tree: the chance its accepted path reaches depth
    i + 1). ``tree``: the step drafts this tree instead of a chain (k is its depth), its
    children drafted ``tree_drafts``; ``sglang_knobs``: the (num_steps, topk,
    num_draft_tokens) it came from, when the plan searched SGLang's space. ``method``: the
    profile's drafter method (``mtp``: the target's own MTP layers, no model of its own).
    ``passes``: a heads drafter's stated ``passes`` (parallel: Medusa heads; autoregressive:
    EAGLE-style); None when the profile does not say, written as EAGLE as before.
    ``max_concurrency``: speculation off above this many running sequences (a static k's
    cut-off; a table ends its own rows); ``acceptance_gate``: (threshold, window) of
    TensorRT-LLM's acceptance off-switch; ``adaptive_steps``: SGLang's adaptive config (the
    JSON of --speculative-adaptive-config), k its initial steps; ``adaptive_verification``:
    vLLM's per-step verify budget (k drafted, fewer verified).
    """

    drafter: str
    kind: str  # specsim's drafter kind: draft_model, ngram or heads
    k: int
    model: ModelRef | None  # None for prompt lookup, which has no model
    unconditional_rates: tuple[float, ...]
    by_batch: tuple[BatchRow, ...] = ()
    static_k: int | None = None
    ngram_size: int | None = None
    tree: TreeShape | None = None
    tree_drafts: str | None = None
    sglang_knobs: tuple[int, int, int] | None = None
    method: str | None = None
    passes: str | None = None
    max_concurrency: int | None = None
    acceptance_gate: tuple[float, int] | None = None
    adaptive_steps: dict | None = None
    adaptive_verification: bool = False

    @property
    def schedule_rows(self) -> tuple[BatchRow, ...]:
        """The k-by-batch rows an engine's table takes: the table, or a static k's cut-off
        as {max_concurrency: k} (TensorRT-LLM's own translation of max_concurrency)."""
        if self.by_batch or self.max_concurrency is None:
            return self.by_batch
        return (BatchRow(self.max_concurrency, self.k),)

    @property
    def is_medusa(self) -> bool:
        return self.kind == "heads" and self.passes == "parallel"

    @property
    def is_mtp(self) -> bool:
        return self.method == "mtp"

    @property
    def deployed_kind(self) -> str:
        """The kind as each engine's method table keys it: ``mtp`` for the target's own MTP
        layers, ``heads-eagle3`` for heads whose checkpoint path says eagle3 (the engines sniff
        the draft model's name the same way, engine-formats.md §3.5), else the kind."""
        if self.is_mtp:
            return "mtp"
        if self.kind == "block":  # the profile names which parallel drafter it is
            return self.method
        if self.kind == "heads" and self.model and "eagle3" in self.model.path.lower():
            return "heads-eagle3"
        return self.kind

    @property
    def fallback_k(self) -> int:
        return self.k if self.static_k is None else self.static_k

    def mean_acceptance_length(self, k: int) -> float:
        """1 + the expected accepted drafts per step (bonus token included) at window ``k``."""
        return 1.0 + math.fsum(self.unconditional_rates[:k])


@dataclass(frozen=True)
class EngineSetting:
    """One replica of the recommended deployment."""

    target: ModelRef
    max_batch: int
    max_batched_tokens: int
    speculation: Speculative | None
    verifier: str = "rejection"
    temperature: float = 1.0
    tensor_parallel_size: int = 1  # the profile's hardware.tensor_parallel_size
    draft_tensor_parallel_size: int | None = None  # None: the target's (vLLM's default)
    weights_dtype: str | None = None  # the target's precision.weights; None: 16-bit
    kv_cache_dtype: str | None = None  # None: the model's dtype
    expert_parallel: bool = False  # the target's experts dealt out whole (sharding's EP size)
    block_size: int | None = None  # the scenario's engine.block_size (KV block, tokens)
    prefix_caching: bool = False  # the scenario has workload.prefix (cached prompt prefixes)
    # A split fleet's pool this replica serves ("prefill" or "decode"; None: co-located): the
    # writers add their engine's disaggregation options and name the files after it.
    role: str | None = None
    # Engine-neutral: what the plan chose that no engine can run, and what stands in for it.
    unexpressed: tuple[str, ...] = ()

    @property
    def draft_tp(self) -> int:
        if self.draft_tensor_parallel_size is None:
            return self.tensor_parallel_size
        return self.draft_tensor_parallel_size

    @property
    def quantised(self) -> bool:
        return self.weights_dtype in QUANTISED or self.kv_cache_dtype in QUANTISED

    @property
    def models(self) -> list[ModelRef]:
        spec = self.speculation
        return [self.target, *([spec.model] if spec and spec.model else [])]


# Formats an engine must be told of or serve a checkpoint in (16-bit ones are the default).
QUANTISED = ("fp8", "int4", "nvfp4", "mxfp4")


def deployment(profile: Any, drafter: str | None) -> dict[str, Any]:
    """``EngineSetting``'s split and formats from a ``Profile`` (its hardware's devices, the
    drafter's sharding, the target's precision)."""
    target = profile.target
    draft = profile.drafters.get(drafter) if drafter else None
    out: dict[str, Any] = {"tensor_parallel_size": profile.hardware.devices}
    if draft is not None and draft.sharding is not None:
        out["draft_tensor_parallel_size"] = draft.sharding.tensor_parallel_size
    if target.sharding is not None and target.sharding.expert_parallel_size is not None:
        out["expert_parallel"] = True
    if target.precision is not None:
        out["weights_dtype"] = target.precision.weights
        out["kv_cache_dtype"] = target.precision.kv_cache
    return out


ROLES = ("prefill", "decode")


def role_file(name: str, role: str | None) -> str:
    """``vllm.args`` for a co-located replica, ``vllm-prefill.args`` for a prefill one."""
    if role is None:
        return name
    stem, dot, suffix = name.partition(".")
    return f"{stem}-{role}{dot}{suffix}"


def engine_method(methods: Mapping[str, str], spec: Speculative, engine: str) -> str:
    """The engine's method name for the drafter, from its table of specsim's kinds."""
    kind = spec.deployed_kind
    if kind not in methods:
        raise SpecsimError(
            f"drafter {spec.drafter!r} is of kind {kind!r}, which {engine} has no method for",
            key="speculation.drafter",
            fix=f"choose a drafter of a kind {engine} runs: {', '.join(methods)}",
        )
    return methods[kind]


def method_refusal(setting: EngineSetting, methods: Mapping[str, str], engine: str) -> str:
    """Why the engine cannot run the setting's drafter: it has no method for its kind (empty
    when it has one, or speculation is off)."""
    spec = setting.speculation
    if spec is None or spec.deployed_kind in methods:
        return ""
    return f"{engine} has no speculative method for a {spec.deployed_kind} drafter"


def medusa_refusal(setting: EngineSetting, engine: str, where: str) -> str | None:
    """An engine without Medusa refuses heads the profile states are parallel (Medusa), rather
    than running them as EAGLE heads, which they are not."""
    spec = setting.speculation
    if spec is None or not spec.is_medusa:
        return None
    return (
        f"the profile's heads drafter has passes: parallel (Medusa), and {engine} has no Medusa "
        f"method ({where}); an EAGLE-style drafter states passes: autoregressive"
    )


def unknown_formats(setting: EngineSetting, engine: str) -> list[str]:
    """A note where the engine-formats note documents no flag for the setting's formats: the
    operator sets them (specsim does not guess an engine's keys)."""
    formats = [
        f"{what} {dtype}"
        for what, dtype in (
            ("weights", setting.weights_dtype),
            ("KV cache", setting.kv_cache_dtype),
        )
        if dtype in QUANTISED
    ]
    if not formats:
        return []
    return [
        f"the profile assumes {' and '.join(formats)}; docs/reference/engine-formats.md "
        f"documents no {engine} option for them, so none is written: serve a checkpoint in "
        "that format or set the engine's quantisation options yourself"
    ]


def draft_tp_unexpressed(setting: EngineSetting, engine: str, where: str) -> list[str]:
    """An engine without a draft TP option runs a draft model over the target's devices."""
    spec = setting.speculation
    if spec is None or spec.model is None or setting.draft_tp == setting.tensor_parallel_size:
        return []
    return [
        f"draft tensor parallelism {setting.draft_tp}: {engine} documents no draft TP option "
        f"({where}); its draft model runs over the target's {setting.tensor_parallel_size} "
        "devices, so the drafter's passes will differ from the profile's"
    ]


@dataclass
class Rendered:
    """One engine's files (name -> text), what they set, what the engine cannot express (and
    what was written instead), and notes on assumptions the files rest on."""

    engine: str
    files: dict[str, str]
    written: dict[str, Any]
    not_expressible: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    start: str = ""  # the command that starts the server, from the files' folder

    def summary(self, folder: str) -> dict[str, Any]:
        """summary.json's entry: as JSON reads it back (a YAML schedule's keys become text)."""
        return {
            "files": [f"{folder}/{name}" for name in self.files],
            "written": json.loads(json.dumps(self.written)),
            "not_expressible": list(self.not_expressible),
            "notes": list(self.notes),
        }


def header_lines(
    common: list[str], not_expressible: list[str], notes: list[str], usage: list[str]
) -> list[str]:
    """A file's header: the common lines, what the engine cannot express, notes, usage."""
    return [
        *common,
        *[f"Not expressible: {note}." for note in not_expressible],
        *[f"Note: {note}." for note in notes],
        *usage,
    ]


def comment_block(lines: Iterable[str], width: int = 96) -> str:
    """Lines as ``#`` comments, prose wrapped to ``width``; a line that starts with two spaces
    (a command to copy) is kept whole."""
    out = []
    for line in lines:
        if not line or line.startswith("  "):
            out.append(f"# {line}".rstrip())
            continue
        wrapped = textwrap.wrap(
            line, width - 2, subsequent_indent="  ", break_long_words=False, break_on_hyphens=False
        )
        out += [f"# {part}" for part in wrapped]
    return "\n".join(out) + "\n"


def args_text(header: str, arguments: list[tuple[str, str | None]]) -> str:
    """An arguments file: the comment header, then one option (and its value, shell-quoted) per
    line, so that ``shlex.split(text, comments=True)`` gives the argument list, and so does a
    shell's ``eval "cmd $(grep -v '^#' FILE | tr '\\n' ' ')"`` (``USE``)."""
    lines = [flag if value is None else f"{flag} {shlex.quote(value)}" for flag, value in arguments]
    return header + "".join(f"{line}\n" for line in lines)


def use(command: str, file: str) -> str:
    """The shell line that runs ``command`` with the options of the arguments file ``file``."""
    return f"eval \"{command} $(grep -v '^#' {file} | tr '\\n' ' ')\""


def violation(file: str, key: str, message: str, where: str) -> SpecsimError:
    """A setting that breaks an engine's documented constraint (``where``: the section of
    engine-formats.md that states it); nothing is written."""
    return SpecsimError(
        f"{message} ({where}), so it is not written",
        file=f"engine/{file}",
        key=key,
        fix="the recommended setting cannot run on this engine as derived: report the command "
        "line to specsim's maintainers, and emit the other engines meanwhile",
    )
