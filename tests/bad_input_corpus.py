"""The bad-input corpus: cases generated from the schemas and the command-line parsers.

Each ``Case`` is one command line over a copy of the base inputs (``bad_input_bases``) with one
thing spoiled: a value in a schema file, a command-line option, a file's structure or a row of
a data file (``bad_input_files``). Values follow what the schema or the option declares (a key
with a lower bound gets a value below it, one with an upper bound a value above it, every
number nan, inf, -inf and an absurd magnitude), so a key or option added later is covered
without editing this module; a text option must be classified in ``STRING_OPTIONS`` (a test
fails until it is). A key that legitimately takes one of these values would be the exception:
its description would say so, and its case would be left out here with that reason (no key
takes one today).

A clean outcome (``test_bad_inputs``): exit code 2, exactly one line on stderr that names the
spoiled key, option or file and says ``fix:``, no traceback, nothing written.
"""

from __future__ import annotations

import argparse
import copy
import types
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import annotated_types
import pydantic
from bad_input_bases import (
    ACCEPTANCE_FILE,
    BASE_COMMANDS,
    HARDWARE,
    OUT,
    PROFILE,
    SCENARIO,
    TRACE_SCENARIO,
    D,
    dump,
)


@dataclass(frozen=True)
class Case:
    """``argv`` (with ``{d}``) run after ``files`` (name -> text, or None: remove it, or
    ``FOLDER``: make it a folder) are written over the base. ``names``: what the error line
    must mention (each is a list of alternatives)."""

    id: str
    argv: tuple[str, ...]
    files: tuple[tuple[str, Any], ...] = ()
    names: tuple[tuple[str, ...], ...] = ()


FOLDER = object()


# -- values ----------------------------------------------------------------------------------------

NAN, INF = float("nan"), float("inf")


@dataclass(frozen=True)
class Bounds:
    kind: type  # int or float
    low: float | None = None
    low_open: bool = False
    high: float | None = None
    high_open: bool = False


def bad_numbers(b: Bounds) -> list[tuple[str, Any]]:
    """(label, value) pairs no key or option with bounds ``b`` may accept."""
    values: list[tuple[str, Any]] = [("nan", NAN), ("inf", INF), ("-inf", -INF)]
    values.append(("huge", 10**30 if b.kind is int else 1e300))
    values.append(("text", "fast"))
    if b.kind is int:
        values.append(("fraction", 1.5))
    if b.low is not None:
        below = (
            b.low if b.low_open else (b.low - 1 if b.kind is int else b.low - max(1, abs(b.low)))
        )
        values.append(("below", below))
    else:
        values.append(("-huge", -(10**30) if b.kind is int else -1e300))
    if b.high is not None:
        above = b.high if b.high_open else (b.high + 1 if b.kind is int else 2 * b.high + 1)
        values.append(("above", above))
    return values


def _bounds_of(kind: type, metadata: list[Any]) -> Bounds:
    low = high = None
    low_open = high_open = False
    for item in metadata:
        if isinstance(item, pydantic.fields.FieldInfo):
            inner = _bounds_of(kind, item.metadata)
            low, low_open = (
                (inner.low, inner.low_open) if inner.low is not None else (low, low_open)
            )
            high, high_open = (
                (inner.high, inner.high_open) if inner.high is not None else (high, high_open)
            )
        elif isinstance(item, annotated_types.Ge):
            low, low_open = item.ge, False
        elif isinstance(item, annotated_types.Gt):
            low, low_open = item.gt, True
        elif isinstance(item, annotated_types.Le):
            high, high_open = item.le, False
        elif isinstance(item, annotated_types.Lt):
            high, high_open = item.lt, True
    return Bounds(kind, low, low_open, high, high_open)


# -- walking a schema ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Leaf:
    """A key of a schema file: its path in the document and what it takes."""

    path: tuple[Any, ...]  # dict keys and list indices
    bounds: Bounds | None  # None: not a number
    dict_key: bool = False  # the path's last part is a mapping's (numeric) key, not a value


@dataclass
class Walk:
    leaves: list[Leaf] = field(default_factory=list)
    uncovered: list[str] = field(default_factory=list)  # sections the base document lacks


def _unwrap(tp: Any) -> tuple[Any, list[Any]]:
    """An annotation without ``Optional`` and ``Annotated``, and the constraints it carried."""
    metadata: list[Any] = []
    while True:
        origin = typing.get_origin(tp)
        if origin is typing.Annotated:
            metadata += list(typing.get_args(tp)[1:])
            tp = typing.get_args(tp)[0]
        elif origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            if len(args) != 1:
                return tp, metadata
            tp = args[0]
        else:
            return tp, metadata


def dotted(path: tuple[Any, ...]) -> str:
    """A document path as specsim's errors write it: ``fleet.pools[0].replicas``."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def walk_schema(model: type[pydantic.BaseModel], doc: Any) -> Walk:
    """Every key of ``model`` that ``doc`` (a valid document) has room for."""
    result = Walk()

    def annotation(tp: Any, metadata: list[Any], value: Any, path: tuple[Any, ...]) -> None:
        tp, more = _unwrap(tp)
        metadata = [*metadata, *more]
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if tp in (int, float):
            result.leaves.append(Leaf(path, _bounds_of(tp, metadata)))
        elif isinstance(tp, type) and issubclass(tp, pydantic.BaseModel):
            if isinstance(value, dict):
                model_fields(tp, value, path)
            else:
                result.uncovered.append(dotted(path))
        elif origin is list:
            if isinstance(value, list) and value:
                annotation(args[0], [], value[0], (*path, 0))
            elif _unwrap(args[0])[0] in (int, float):
                annotation(args[0], [], None, (*path, 0))
            else:
                result.uncovered.append(dotted(path) + "[]")
        elif origin is tuple:
            for i, arg in enumerate(args):
                annotation(
                    arg, [], value[i] if isinstance(value, list | tuple) else None, (*path, i)
                )
        elif origin is dict:
            if isinstance(value, dict) and value:
                key = next(iter(value))
                key_tp, key_meta = _unwrap(args[0])
                if key_tp in (int, float):
                    result.leaves.append(
                        Leaf((*path, key), _bounds_of(key_tp, key_meta), dict_key=True)
                    )
                annotation(args[1], [], value[key], (*path, key))
            else:
                result.uncovered.append(dotted(path) + ".<name>")
        else:
            result.leaves.append(Leaf(path, None))

    def model_fields(model: type[pydantic.BaseModel], doc: dict, path: tuple[Any, ...]) -> None:
        for name, info in model.model_fields.items():
            annotation(info.annotation, list(info.metadata), doc.get(name), (*path, name))

    model_fields(model, doc, ())
    return result


def spoil(doc: Any, leaf: Leaf, value: Any) -> Any:
    """A copy of ``doc`` with ``value`` at ``leaf`` (or, for a mapping key, as that key)."""
    doc = copy.deepcopy(doc)
    node = doc
    for part in leaf.path[:-1]:
        node = node.setdefault(part, {}) if isinstance(node, dict) else node[part]
    last = leaf.path[-1]
    if leaf.dict_key:
        node[value if isinstance(value, int | float | str) else str(value)] = node.pop(last)
    elif isinstance(node, list) and last >= len(node):
        node.append(value)
    else:
        node[last] = value
    return doc


def schema_cases(
    label: str,
    model: type[pydantic.BaseModel],
    doc: dict,
    file: str,
    argv: list[str],
    render: Callable[[Any], str] = dump,
    where: Callable[[tuple[Any, ...]], tuple[Any, ...]] = lambda path: path,
) -> Iterator[Case]:
    """A case per bad value of every key of ``model`` in ``doc``, written to ``file``.

    ``where`` maps a path inside the model to the path inside the file (a model nested in
    the file), so the error line can be checked for the key."""
    for leaf in walk_schema(model, doc).leaves:
        values = bad_numbers(leaf.bounds) if leaf.bounds else [("mapping", {"a": 1})]
        if leaf.bounds and leaf.dict_key:
            values = [v for v in values if isinstance(v[1], int) and not isinstance(v[1], bool)]
        for name, value in values:
            full = Leaf(where(leaf.path), leaf.bounds, leaf.dict_key)
            key = dotted(full.path[:-1]) if leaf.dict_key else dotted(full.path)
            names = ((file,), (key, dotted(full.path[:-1]) or key))
            yield Case(
                f"{label}:{dotted(leaf.path)}{'.<key>' if leaf.dict_key else ''}={name}",
                tuple(argv),
                ((file, render(spoil(doc, leaf, value))),),
                names,
            )


# Options that take text, and the bad values of each kind. A new string option must be listed.
STRING_OPTIONS = {
    "--out": "out",  # where outputs go: its own cases live with the atomic-output tests
    "--set": "set",
    "--k": "k-list",
    "--loads": "loads",
    "--grid": "grid",
    "--drafter": "drafter",
    "--target": "model",
    "--label": "label",
    "--name": "name",
    "--device": "device",
    "--dtype": "dtype",
    "--cluster": "address",  # connecting is the sweep's concern (a timeout, not a parse)
    "--cluster-tls-ca-file": "file",
    "--cluster-tls-cert": "file",
    "--cluster-tls-key": "file",
    "--verifier": "verifier",
    "--step": "verifier",  # check rollout: a step function, named as a verifier is
    "--profile": "file",
    "--hardware": "file",
    "--acceptance-from": "file",
    "--into": "file",
    "--server-args": "file",
    "results": "file",  # profile from-bench's result files
    "scrape": "file",  # profile calibrate's /metrics scrape
    "--acceptance-length": "acceptance-scalar",
    "--acceptance-rate": "acceptance-scalar",
    "--metrics": "scrape-pair",
    "--prefix-hit": "share-pair",
    "--prompts": "file",
    "--emit": "engines",
    "--model": "model-path",
    "--tree": "tree",
    "--tree-drafts": "tree-drafts",
    "--trees": "plan-trees",
    "--tree-steps": "tree-counts",
    "--tree-topk": "tree-counts",
    "--tree-tokens": "tree-counts",
    "--tree-drafter": "tree-drafter",
    "--baseline": "folder",
    "--candidate": "folder",
    "--bench": "folder",
    "scenario": "file",
    "--tp": "tp-list",  # plan capacity's (profile's --tp is a bounded number)
    "--precision": "precision",
    "--target-model": "model",
    "--draft-model": "drafter",
    "--policies": "policies",
    "--check-runs": "file",
    "--runs-source": "text",  # free text written into provenance as given: no value is wrong
}


BAD_STRINGS = {
    "k-list": ["", "x", "4..1", "-1", "0..99999999999", "0..33", "nan"],
    "loads": ["", "x", "0", "-1", "nan", "inf", "1e300", "1e9"],
    "grid": ["batch=0", "batch=x", "context=-1", "new=1e30", "bogus=1", "batch=99999999999"],
    "label": ["novalue", "=x"],
    "device": ["tpu"],
    "dtype": ["int3"],
    "verifier": ["nonsense", "no_such_module_xyz:verify", "specsim.errors:no_such", "x:1y"],
    "engines": ["", "x", "vllm,x", "vllm,vllm", "VLLM", "vllm,,sglang"],
    "model-path": ["novalue", "=x", "target=", "target=a$b", "d1=x`y"],
    # Malformed shapes, and well-formed ones the tree check cannot enumerate exactly.
    "tree": [
        "",
        "x",
        "0",
        "2,,1",
        "2,-1",
        "[[1]]",
        "[[0],[0]]",
        "[[0,0]]",
        "[[0]",
        "[0]",
        "[[0.5]]",
        "9",
        "9,9,9",
        "2,1,1,1,1,1",
        "99999999999",
    ],
    "scrape-pair": ["", "x", "=x", "x=", "nosuch.json=metrics.txt"],
    "share-pair": ["", "x", "=0.5", "r.json=2", "r.json=nan", "nosuch.json=0.5"],
    "acceptance-scalar": ["", "d1", "d1:3", "d1:x=2", "nosuch:3=2", "d1:0=1", "d1:3=nan", "d1:3=9"],
}
BAD_STRINGS["tp-list"] = ["", "x", "0", "-1", "2,,4", "4.5", "65", "99999999999", "nan"]
BAD_STRINGS["precision"] = ["", "x", "fp9", "bf16/", "fp8/int4", "/fp8", "fp8,x"]
BAD_STRINGS["tree-drafts"] = ["", "sideways", "top_k", "IID"]
# Not names (or "fixed", speculation.policy's, which --policies calls "static"), in any case.
BAD_STRINGS["policies"] = ["", "x", "adaptive_steps,x", "adaptive_steps,,", "ADAPTIVE_STEPS"]
BAD_STRINGS["policies"] += ["fixed", "by_batch,static,k"]
# plan window's trees: malformed shapes, a chain (that is k), one past the size limits.
BAD_STRINGS["plan-trees"] = [*BAD_STRINGS["tree"][:11], "1,1,1", "99999999999"]
BAD_STRINGS["tree-drafter"] = ["", "small", "=2,2,1", "d1=", "d1=1,1", "d1=x", "nosuch=2,2"]
BAD_STRINGS["tree-counts"] = ["", "x", "0", "-1", "4..1", "1.5", "nan", "99999999999"]
# The profiler measures any well-formed tree (the checker's size limits are not its own).
BAD_STRINGS["profile-tree"] = [*BAD_STRINGS["tree"][:11], "99999999999", "64,64"]
COMMAND_STRINGS = {("profile measure", "--tree"): "profile-tree"}


def commands() -> dict[str, argparse.ArgumentParser]:
    """Every subcommand's parser by its name (``plan window``...)."""
    from specsim.cli import build_parser

    found: dict[str, argparse.ArgumentParser] = {}

    def walk(parser: argparse.ArgumentParser, prog: str) -> None:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            found[prog] = parser
        for action in subs:
            for name, sub in action.choices.items():
                walk(sub, f"{prog} {name}".strip())

    walk(build_parser(), "")
    return found


def option_bounds(action: argparse.Action) -> Bounds | None:
    """The bounds a numeric option declares (``specsim.cli.common.Number``); raw int/float
    options have none to read, only their kind."""
    from specsim.cli.common import Number

    kind = action.type
    if isinstance(kind, Number):
        return Bounds(kind.kind, kind.low, kind.low_open, kind.high, kind.high_open)
    if kind in (int, float):
        return Bounds(kind)
    return None


def option_name(action: argparse.Action) -> str:
    return max(action.option_strings, key=len) if action.option_strings else action.dest


def option_cases() -> Iterator[Case]:
    """Bad values of every numeric and every choice option of every command."""
    for command, parser in commands().items():
        for action in parser._actions:
            if not action.option_strings or action.nargs == 0:
                continue
            name = option_name(action)
            argv = BASE_COMMANDS[command]
            bounds = option_bounds(action)
            values: list[tuple[str, Any]] = []
            if bounds is not None:
                values = bad_numbers(bounds)
            elif action.choices:
                values = [("choice", "bogus")]
            elif (kind := COMMAND_STRINGS.get((command, name), STRING_OPTIONS.get(name))) in (
                BAD_STRINGS
            ):
                values = [(v or "empty", v) for v in BAD_STRINGS[kind]]
            for label, value in values:
                yield Case(
                    f"{command}:{name}={label}", (*argv, name, cli_text(value)), (), ((name,),)
                )


def cli_text(value: Any) -> str:
    if isinstance(value, float):
        return repr(value) if value == value and abs(value) != INF else str(value)
    return str(value)


def set_cases() -> Iterator[Case]:
    """``--set``: malformed overrides, then every scenario number as override text."""
    argv = BASE_COMMANDS["simulate"]
    malformed = {
        "no-equals": ("speculation.k", ("--set",)),
        "empty-part": ("speculation..k=2", ("--set",)),
        "bad-index": ("fleet.pools.5.replicas=1", ("fleet.pools",)),
        "into-value": ("seed.x=1", ("seed",)),
        "unknown": ("bogus=1", ("bogus",)),
        "wrong-type": ("engine=3", ("engine",)),
    }
    for name, (text, names) in malformed.items():
        yield Case(f"--set:{name}", (*argv, "--set", text), (), (names,))
    from specsim.scenario import Scenario

    for leaf in walk_schema(Scenario, SCENARIO).leaves:
        if leaf.bounds is None or leaf.dict_key:
            continue
        key = ".".join(str(p) for p in leaf.path)
        for text in ("inf", "-.inf", ".nan", "1e30", "1.0e+300"):
            yield Case(
                f"--set:{key}={text}",
                (*argv, "--set", f"{key}={text}"),
                (),
                ((dotted(leaf.path),),),
            )


def hand_cases() -> Iterator[Case]:
    """What no single value spoils: a combination that no deployment has, and inputs that
    need a look inside (a model's positions) but must still fail before any work."""
    sim, cap = BASE_COMMANDS["simulate"], BASE_COMMANDS["plan capacity"]
    reversed_range = copy.deepcopy(PROFILE)
    reversed_range["target"]["latency"]["valid_range"]["batch"] = [8, 2]
    yield Case(
        "profile:valid_range.batch=reversed",
        tuple(sim),
        (("profile.yaml", dump(reversed_range)),),
        (("profile.yaml",), ("target.latency.valid_range",)),
    )
    too_long = copy.deepcopy(PROFILE)
    too_long["acceptance"][0]["mean_acceptance_length"] = {1: 2.5}  # at most k + 1 = 2
    yield Case(
        "profile:mean_acceptance_length>k+1",
        tuple(sim),
        (("profile.yaml", dump(too_long)),),
        (("profile.yaml",), ("acceptance[0]",)),
    )
    pools = copy.deepcopy(SCENARIO)
    pools["fleet"] = {"pools": [{"name": f"p{i}", "replicas": 6000} for i in range(2)]}
    yield Case(
        "scenario:pools.replicas=total-too-many",
        tuple(sim),
        (("scenario.yaml", dump(pools)),),
        (("scenario.yaml",), ("fleet",)),
    )
    # A TP the (measured) profile does not describe, scaling asked for: refused, not scaled.
    yield Case(
        "scenario:tensor_parallel_scaling=measured-profile",
        (*sim, "--set", "engine.tensor_parallel_size=4"),
        (),
        (("engine.tensor_parallel_scaling",),),
    )
    # Targets the bounds refuse only with the scenario: one replica cannot run at the target's
    # load (rate x duration_s requests), or no fleet within MAX_REPLICAS reaches it.
    longer = ("--set", "workload.requests=null", "--set", "workload.duration_s=1000")
    yield Case(
        "plan capacity:--target-rps=too-many-requests",
        (*cap, *longer, "--target-rps", "50000"),
        (),
        (("--target-rps",),),
    )
    slow = ("--set", "workload.rate=0.001")
    yield Case(
        "plan capacity:--target-rps=beyond-max-replicas",
        (*cap, *slow, "--target-rps", "20000"),
        (),
        (("--target-rps",),),
    )
    # Without --profile, validate profiles this machine first (minutes): its prompts are read
    # before that.
    profiling = ["validate", f"{D}/validate.yaml", "--out", OUT, "--prompts", f"{D}/prompts.jsonl"]
    yield Case(
        "validate:--prompts=no-prompt-key-before-profiling",
        tuple(profiling),
        (("prompts.jsonl", '{"question": "what?"}\n'),),
        (("prompts.jsonl",),),
    )
    misplaced_threshold = copy.deepcopy(SCENARIO)
    misplaced_threshold["fleet"]["router"] = "round_robin"
    yield Case(
        "scenario:fleet.balance_abs_threshold=without-cache_aware",
        tuple(sim),
        (("scenario.yaml", dump(misplaced_threshold)),),
        (("fleet.balance_abs_threshold",), ("cache_aware",)),
    )
    # Prefix caching: a trace column asked of a workload without a trace, a cell that is not a
    # token count, and a session column the trace lacks.
    column_prefix = copy.deepcopy(SCENARIO)
    column_prefix["workload"]["prefix"] = {"source": "column"}
    yield Case(
        "scenario:workload.prefix.source=column-without-a-trace",
        tuple(sim),
        (("scenario.yaml", dump(column_prefix)),),
        (("workload",), ("trace",)),
    )
    yield Case(
        "scenario:engine.block_size=larger-than-the-cache",
        (*sim, "--set", "engine.kv_capacity_tokens=8"),
        (),
        (("engine.block_size",),),
    )
    trace_argv = ("simulate", f"{D}/trace_scenario.yaml", "--out", OUT)
    for source, header, cell, names in (
        ("column", "cached_tokens", "x", ("workload.prefix.column",)),
        ("session", "user", "u1", ("SessionID",)),
    ):
        scenario = copy.deepcopy(TRACE_SCENARIO)
        scenario["workload"]["prefix"] = {"source": source}
        rows = [f"{0.1 * i},{10 + i},5,{cell if i == 3 else i}" for i in range(6)]
        text = f"arrived_at,num_prefill_tokens,num_decode_tokens,{header}\n" + "\n".join(rows)
        yield Case(
            f"trace:workload.prefix.source={source}-bad-column",
            trace_argv,
            (("trace_scenario.yaml", dump(scenario)), ("trace.csv", text + "\n")),
            (("trace.csv",), names),
        )
    # Tensor parallelism: a scenario asking for another split than the profile's, splits no
    # engine runs, and a roofline deployment given to a measurement.
    yield Case(
        "scenario:engine.tensor_parallel_size=not-the-profile's",
        (
            *sim,
            "--set",
            "engine.tensor_parallel_size=4",
            "--set",
            "engine.tensor_parallel_scaling=null",
        ),
        (),
        (("engine.tensor_parallel_size",),),
    )
    for key, spoil in (
        ("target.sharding", lambda doc: doc["target"]["sharding"].update(tensor_parallel_size=1)),
        (
            "drafters.d1",
            lambda doc: doc["drafters"]["d1"]["sharding"].update(tensor_parallel_size=4),
        ),
    ):
        split = copy.deepcopy(PROFILE)
        spoil(split)
        yield Case(
            f"profile:{key}.tensor_parallel_size=not-1-or-the-replica's",
            tuple(sim),
            (("profile.yaml", dump(split)),),
            (("profile.yaml",),),
        )
    split = copy.deepcopy(PROFILE)
    split["target"]["sharding"]["expert_parallel_size"] = 4  # the replica has 2 devices
    yield Case(
        "profile:target.sharding.expert_parallel_size=not-the-tp",
        tuple(sim),
        (("profile.yaml", dump(split)),),
        (("profile.yaml",), ("expert_parallel_size",)),
    )
    # A heads drafter's passes: a value that is not a pass structure, and the key on a model
    # that is not heads (the schema walk reaches only the first drafter, d1).
    for drafter, label, value, key in (
        ("h1", "sequential", "sequential", "drafters.h1.passes"),
        ("h1", "number", 3, "drafters.h1.passes"),
        ("h1", "mapping", {"a": 1}, "drafters.h1.passes"),
        ("d1", "not-heads", "parallel", "drafters.d1"),
    ):
        passes = copy.deepcopy(PROFILE)
        passes["drafters"][drafter]["passes"] = value
        yield Case(
            f"profile:drafters.{drafter}.passes={label}",
            tuple(sim),
            (("profile.yaml", dump(passes)),),
            (("profile.yaml",), (key,)),
        )
    roof = BASE_COMMANDS["profile roofline"]
    yield Case(
        "profile:--draft-tp=not-1-or-tp",
        (*roof, "--tp", "2", "--draft-tp", "4"),
        (),
        (("--draft-tp",),),
    )
    yield Case("profile:--tp=heads-not-divisible", (*roof, "--tp", "3"), (), (("--tp",),))
    no_link = {k: v for k, v in HARDWARE.items() if k not in ("nvlink", "pcie")}
    yield Case(
        "profile:--tp=no-interconnect",
        (*roof, "--tp", "2"),
        (("hardware.yaml", dump(no_link)),),
        (("hardware.yaml",), ("nvlink",)),
    )
    yield Case(
        "profile:--tp=measured", (*BASE_COMMANDS["profile measure"], "--tp", "2"), (), (("--tp",),)
    )
    yield Case(
        "profile:--weights-dtype=measured",
        (*BASE_COMMANDS["profile measure"], "--weights-dtype", "fp8"),
        (),
        (("--weights-dtype",),),
    )
    measure = BASE_COMMANDS["profile measure"]
    for label, extra, option in (
        ("drafts-without-tree", ("--tree-drafts", "iid"), "--tree-drafts"),
        ("no-acceptance", ("--tree", "2,1", "--no-acceptance"), "--tree"),
    ):
        yield Case(f"profile:--tree={label}", (*measure, *extra), (), ((option,),))
    yield Case(
        "profile:--tree=roofline",
        (*BASE_COMMANDS["profile roofline"], "--tree", "2,1"),
        (),
        (("--tree",),),
    )
    # MTP: a target without MTP layers, a measurement, a prompt-lookup entry marked mtp.
    yield Case(
        "profile:--drafter=mtp-target-without-mtp",
        (*BASE_COMMANDS["profile roofline"], "--drafter", "m=mtp"),
        (),
        (("num_nextn_predict_layers",),),
    )
    yield Case(  # measured: the built-in target has no MTP module, refused before it loads
        "profile:--drafter=mtp-measured-target-without-one",
        (*measure, "--drafter", "m=mtp"),
        (),
        (("num_nextn_predict_layers",),),
    )
    marked = copy.deepcopy(PROFILE)
    marked["drafters"]["ngram"]["method"] = "mtp"
    yield Case(
        "profile:drafters.ngram.method=mtp-not-a-draft-model",
        tuple(sim),
        (("profile.yaml", dump(marked)),),
        (("profile.yaml",),),
    )
    yield Case(
        "profile:--max-new-tokens=past-positions",
        (*measure, "--max-new-tokens", "1000000"),
        (),
        (("--max-new-tokens",), ("positions",)),
    )


def tree_cases() -> Iterator[Case]:
    """speculation.tree and tree_drafts: not in the base scenario (whose k_by_batch table a
    tree refuses), so each spoiled tree is a scenario of its own."""
    sim = BASE_COMMANDS["simulate"]
    plain = {k: v for k, v in SCENARIO.items() if k != "fleet"}
    chain = {k: v for k, v in plain["speculation"].items() if k not in ("k", "k_by_batch")}
    spoilt = {
        "unparsable": {"tree": "2,x"},
        "width-0": {"tree": "2,0"},
        "skipped-rank": {"tree": [[0], [2]]},
        "orphan": {"tree": [[0], [1, 0]]},
        "too-big": {"tree": "64,64"},
        "k-not-depth": {"tree": "2,2,1", "k": 2},
        "adaptive": {"tree": "2,1", "policy": "adaptive"},
        "by-batch": {"tree": "2,1", "k_by_batch": [{"max_batch": 4, "k": 2}]},
        "iid-acceptance": {"tree": "2,1", "acceptance": "iid"},
        "drafts-without-tree": {"tree_drafts": "iid"},
        "drafts-unknown": {"tree": "2,1", "tree_drafts": "sideways"},
        "prompt-lookup": {"tree": "2,1", "drafter": "ngram"},
        "no-acceptance-to-derive": {"tree": "2,1", "verifier": "greedy", "temperature": 0.0},
    }
    for name, changes in spoilt.items():
        scenario = {**copy.deepcopy(plain), "speculation": {**chain, **changes}}
        yield Case(
            f"scenario:speculation.tree={name}",
            tuple(sim),
            (("scenario.yaml", dump(scenario)),),
            (("scenario.yaml",), ("speculation",)),
        )
    yield Case(
        "simulate:--set=speculation.tree=width-0",
        (*sim, "--set", "speculation.tree=2,0"),
        (),
        (("speculation",),),
    )


def adaptive_steps_cases() -> Iterator[Case]:
    """speculation.adaptive_steps: every key spoiled, in a scenario of policy adaptive_steps
    (the base scenario's fixed k refuses the section)."""
    from bad_input_bases import ADAPTIVE_STEPS

    from specsim.policy_settings import AdaptiveSteps

    def render(steps: Any) -> str:
        speculation = {"drafter": "d1", "k": 1, "policy": "adaptive_steps", "adaptive_steps": steps}
        return dump({**SCENARIO, "fleet": {"replicas": 1}, "speculation": speculation})

    yield from schema_cases(
        "scenario:speculation.adaptive_steps",
        AdaptiveSteps,
        ADAPTIVE_STEPS,
        "scenario.yaml",
        BASE_COMMANDS["simulate"],
        render=render,
        where=lambda path: ("speculation", "adaptive_steps", *path),
    )


def disagg_cases() -> Iterator[Case]:
    """fleet.disaggregation: every key of the 1P1D base spoiled (the base scenario has pools,
    which a split fleet refuses), and the combinations no single value spoils."""
    from bad_input_bases import DISAGG_SCENARIO, DISAGGREGATION

    from specsim.fleet_settings import Disaggregation

    def render(split: Any) -> str:
        return dump({**DISAGG_SCENARIO, "fleet": {"disaggregation": split}})

    sim = BASE_COMMANDS["simulate"]
    yield from schema_cases(
        "scenario:fleet.disaggregation",
        Disaggregation,
        DISAGGREGATION,
        "scenario.yaml",
        sim,
        render=render,
        where=lambda path: ("fleet", "disaggregation", *path),
    )
    key = "fleet.disaggregation"
    spoiled = {
        "with-pools": {**DISAGG_SCENARIO["fleet"], "pools": [{"name": "a"}]},
        "replicas-not-x+y": {**DISAGG_SCENARIO["fleet"], "replicas": 3},
    }
    for name, fleet in spoiled.items():
        yield Case(
            f"scenario:{key}={name}",
            tuple(sim),
            (("scenario.yaml", dump({**DISAGG_SCENARIO, "fleet": fleet})),),
            (("scenario.yaml",), ("fleet",)),
        )
    transfers = {
        "figures-and-link": {"bandwidth_bytes_per_s": 5.0e10, "link": "nvlink"},
        "latency-only": {"latency_s": 1.0e-5},
        "link-without-file": {"link": "pcie"},
    }
    for name, transfer in transfers.items():
        split = {**copy.deepcopy(DISAGGREGATION), "kv_transfer": transfer}
        yield Case(
            f"scenario:{key}.kv_transfer={name}",
            tuple(sim),
            (("scenario.yaml", render(split)),),
            (("scenario.yaml",), (f"{key}.kv_transfer",)),
        )
    no_link = {k: v for k, v in HARDWARE.items() if k != "nvlink"}
    from_file = {"hardware": "hardware.yaml", "link": "nvlink"}
    split = {**copy.deepcopy(DISAGGREGATION), "kv_transfer": from_file}
    yield Case(
        f"scenario:{key}.kv_transfer.link=not-in-the-hardware-file",
        tuple(sim),
        (("scenario.yaml", render(split)), ("hardware.yaml", dump(no_link))),
        (("hardware.yaml",), ("nvlink",)),
    )
    slow = {**HARDWARE, "nvlink": {"bandwidth_bytes_per_s": -1.0, "latency_s": 1.0e-6}}
    yield Case(
        f"scenario:{key}.kv_transfer.link=negative-bandwidth",
        tuple(sim),
        (("scenario.yaml", render(split)), ("hardware.yaml", dump(slow))),
        (("hardware.yaml",), ("bandwidth_bytes_per_s",)),
    )
    split = copy.deepcopy(DISAGGREGATION)
    split["decode"]["tensor_parallel_size"] = 4
    yield Case(
        f"scenario:{key}.decode.tensor_parallel_size=not-the-profile's",
        tuple(sim),
        (("scenario.yaml", render(split)),),
        (("engine.tensor_parallel_size",),),
    )
    # plan capacity --disaggregated over roofline deployments that cannot serve the pools: a
    # TP the model's heads do not split over, weights the device's memory cannot hold.
    plan = ("plan", "capacity", f"{D}/scenario.yaml", "--disaggregated", "--target-rps", "20")
    plan += ("--tolerance", "0.3", "--workers", "1", "--no-progress", "--out", OUT)
    plan += ("--hardware", f"{D}/hardware.yaml", "--target-model", f"{D}/target.json")
    plan += ("--draft-model", f"d1={D}/draft.json", "--acceptance-from", f"{D}/acceptance.yaml")
    split_file = (("scenario.yaml", render(copy.deepcopy(DISAGGREGATION))),)
    yield Case(
        "plan capacity:--disaggregated --tp=heads-not-divisible",
        (*plan, "--tp", "3"),
        split_file,
        (("--tp",), ("cannot be split",)),
    )
    tiny = {**HARDWARE, "memory_bytes": 1.0e6}
    yield Case(
        "plan capacity:--disaggregated --tp=weights-over-memory",
        (*plan, "--tp", "1,2"),
        (*split_file, ("hardware.yaml", dump(tiny))),
        (("--tp",),),
    )
    other = copy.deepcopy(PROFILE)
    other["target"]["params"] = PROFILE["target"]["params"] * 2
    split = copy.deepcopy(DISAGGREGATION)
    split["decode"]["profile"] = "other.yaml"
    yield Case(
        f"scenario:{key}.decode.profile=another-target",
        tuple(sim),
        (("scenario.yaml", render(split)), ("other.yaml", dump(other))),
        (("scenario.yaml",), (f"{key}.decode.profile",)),
    )


def all_cases() -> list[Case]:
    from specsim.hardware import HardwareSpec
    from specsim.profile.acceptance import Acceptance
    from specsim.profile.schema import Profile
    from specsim.scenario import Scenario

    cases: list[Case] = []
    cases += schema_cases(
        "scenario", Scenario, SCENARIO, "scenario.yaml", BASE_COMMANDS["simulate"]
    )
    cases += schema_cases("profile", Profile, PROFILE, "profile.yaml", BASE_COMMANDS["simulate"])
    cases += schema_cases(
        "hardware", HardwareSpec, HARDWARE, "hardware.yaml", BASE_COMMANDS["profile roofline"]
    )
    entry = ACCEPTANCE_FILE["acceptance"][0]
    cases += schema_cases(
        "acceptance-file",
        Acceptance,
        entry,
        "acceptance.yaml",
        BASE_COMMANDS["profile roofline"],
        render=lambda e: dump({**ACCEPTANCE_FILE, "acceptance": [e]}),
        where=lambda path: ("acceptance", 0, *path),
    )
    cases += option_cases()
    cases += set_cases()
    cases += hand_cases()
    cases += tree_cases()
    cases += disagg_cases()
    cases += adaptive_steps_cases()
    from bad_input_files import file_cases  # it builds on this module

    cases += file_cases()
    return cases
