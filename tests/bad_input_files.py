"""Bad-input cases of the files specsim reads beside the schema files: their structure
(missing, a folder, empty, not UTF-8, malformed), a model's config.json, traces, an engine run's
requests.csv, acceptance sequences, Prometheus counters and prompt sets."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bad_input_bases import (
    BASE_COMMANDS,
    HARDWARE,
    OUT,
    PROFILE,
    SCENARIO,
    TARGET_CONFIG,
    TRACE_COLUMNS,
    TRACE_ROWS,
    VALIDATE_SCENARIO,
    D,
    dump,
)
from bad_input_corpus import FOLDER, Bounds, Case, bad_numbers, cli_text

NOT_UTF8 = b"\xff\xfe\x00bad"


def structure_cases(label: str, file: str, argv: list[str], kind: str) -> Iterator[Case]:
    """Missing, a folder, empty, not UTF-8, malformed: for a file of ``kind``
    (yaml, json, text, csv)."""
    spoilt: list[tuple[str, Any]] = [
        ("missing", None),
        ("folder", FOLDER),
        ("empty", ""),
        ("not-utf8", NOT_UTF8),
    ]
    spoilt += {
        "yaml": [("malformed", "a: [1, 2\n"), ("list", "- 1\n- 2\n"), ("scalar", "42\n")],
        "json": [("malformed", '{"hidden_size": 1024,'), ("list", "[1, 2]"), ("scalar", "7")],
        "text": [("malformed", "\x00\x01 not { what it should be\n")],
        "csv": [("header-only", "a,b,c\n"), ("malformed", '"unclosed,1,2\n1,2\n')],
    }[kind]
    for name, content in spoilt:
        yield Case(f"{label}:file={name}", tuple(argv), ((file, content),), ((file,),))


def unknown_key_case(label: str, file: str, argv: list[str], doc: dict) -> Case:
    return Case(
        f"{label}:unknown-key",
        tuple(argv),
        ((file, dump({**doc, "bogus_key": 1})),),
        ((file,), ("bogus_key",)),
    )


def model_config_cases() -> Iterator[Case]:
    """A Hugging Face config.json (``profile --roofline --target``): each dimension key."""
    from specsim.profiling.flops import DIMENSION_KEYS, OPTIONAL_DIMENSION_KEYS

    argv = BASE_COMMANDS["profile roofline"]
    required = {k for keys in DIMENSION_KEYS.values() for k in keys}
    for key in [k for k in TARGET_CONFIG if k in required or k in OPTIONAL_DIMENSION_KEYS]:
        for name, value in bad_numbers(Bounds(int, 1, high=None)):
            doc = {**TARGET_CONFIG, key: value}
            text = json.dumps(doc)
            yield Case(
                f"model-json:{key}={name}",
                tuple(argv),
                (("target.json", text),),
                (("target.json",), (key,)),
            )
        if key not in required:
            continue
        doc = {k: v for k, v in TARGET_CONFIG.items() if k != key}
        yield Case(
            f"model-json:{key}=absent",
            tuple(argv),
            (("target.json", json.dumps(doc)),),
            (("target.json",),),
        )


def csv_text(columns: tuple[str, ...], rows: list[tuple[Any, ...]]) -> str:
    return ",".join(columns) + "\n" + "".join(",".join(map(str, r)) + "\n" for r in rows)


def column_cases(
    label: str,
    file: str,
    argv: list[str],
    columns: tuple[str, ...],
    rows: list[tuple[Any, ...]],
    bounds: dict[str, Bounds],
) -> Iterator[Case]:
    """Each numeric column's bad values in the second row, a row short of a field, a column
    missing."""
    for col, b in bounds.items():
        i = columns.index(col)
        for name, value in bad_numbers(b):
            spoilt = [list(r) for r in rows]
            spoilt[1][i] = value
            yield Case(
                f"{label}:{col}={name}",
                tuple(argv),
                ((file, csv_text(columns, spoilt)),),
                ((file,), (col, "line 3")),
            )
    short = [list(r) for r in rows]
    short[1] = short[1][:-1]
    yield Case(f"{label}:short-row", tuple(argv), ((file, csv_text(columns, short)),), ((file,),))
    kept = columns[1:]
    yield Case(
        f"{label}:column-missing",
        tuple(argv),
        ((file, csv_text(kept, [r[1:] for r in rows])),),
        ((file,),),
    )


TRACE_BOUNDS = {
    # Arrival times are read relative to the first row: any sign will do.
    "arrived_at": Bounds(float),
    "num_prefill_tokens": Bounds(int, 0, high=None),
    "num_decode_tokens": Bounds(int, 0, high=None),
}


def set_cell(column: str, value: Any) -> Callable[[Path], None]:
    """An edit: ``value`` in ``column`` of a CSV file's second row."""

    def edit(path: Path) -> None:
        lines = path.read_text(encoding="utf-8").splitlines()
        header = lines[0].split(",")
        cells = lines[2].split(",")
        cells[header.index(column)] = cli_text(value)
        lines[2] = ",".join(cells)
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")

    return edit


def header_only(path: Path) -> None:
    path.write_text(path.read_text(encoding="utf-8").splitlines()[0] + "\n", encoding="utf-8")


def engine_record_cases() -> Iterator[Case]:
    """``check rollout``'s requests.csv: every column of an engine run."""
    from specsim.engine import records

    base = "baseline/requests.csv"
    argv = BASE_COMMANDS["check rollout"]
    for col, (kind, low, high) in records.COLUMN_BOUNDS.items():
        for name, value in bad_numbers(Bounds(kind, low, high=high)):
            yield Case(
                f"rollout-csv:{col}={name}",
                tuple(argv),
                ((base, set_cell(col, value)),),
                ((base,), (col,)),
            )
    for name, content in (("empty", ""), ("header-only", header_only), ("missing", None)):
        yield Case(f"rollout-csv:file={name}", tuple(argv), ((base, content),), (("baseline",),))
    yield Case(
        "rollout:baseline=missing", (*argv, "--baseline", f"{D}/nowhere"), (), (("nowhere",),)
    )


def sequences_cases() -> Iterator[Case]:
    argv = ["simulate", f"{D}/sequences_scenario.yaml", "--out", OUT]
    for name, value in bad_numbers(Bounds(int, 1, high=None)):
        text = f"3 1 2 4\n1 {value} 3\n2 2 2 1\n"
        yield Case(
            f"sequences:{name}",
            tuple(argv),
            (("sequences.txt", text),),
            (("sequences.txt",), ("line 2",)),
        )
    yield from structure_cases("sequences", "sequences.txt", argv, "text")


def metrics_cases() -> Iterator[Case]:
    """``profile --calibrate``'s Prometheus counters: each counter's value, the position."""
    from bad_input_bases import METRICS

    argv = BASE_COMMANDS["profile calibrate"]
    lines = METRICS.splitlines()
    for i, line in enumerate(lines):
        counter = line.split("{")[0]
        for name, value in bad_numbers(Bounds(float, 0.0, high=None)):
            if name == "text":
                continue  # not a number at all: a malformed line, covered below
            spoilt = [*lines[:i], line.rsplit(" ", 1)[0] + f" {value}", *lines[i + 1 :]]
            yield Case(
                f"metrics:{counter.split('_spec_decode_')[-1]}[{i}]={name}",
                tuple(argv),
                (("metrics.txt", "\n".join(spoilt) + "\n"),),
                (("metrics.txt",),),
            )
    for position in ("-1", "99999999999", "x"):
        text = METRICS + (
            f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",position="{position}"}}'
            " 100.0\n"
        )
        yield Case(
            f"metrics:position={position}",
            tuple(argv),
            (("metrics.txt", text),),
            (("metrics.txt",),),
        )
    yield Case(
        "metrics:accepted>drafted",
        tuple(argv),
        (("metrics.txt", METRICS.replace("1800.0", "9000.0")),),
        (("metrics.txt",),),
    )
    yield from structure_cases("metrics", "metrics.txt", argv, "text")


def prompt_cases() -> Iterator[Case]:
    """``--prompts`` of the measured profile and of validate: each must fail before a model
    loads."""
    for label, argv in (
        ("profile measure", BASE_COMMANDS["profile measure"]),
        ("validate", [*BASE_COMMANDS["validate"], "--prompts", f"{D}/prompts.jsonl"]),
    ):
        bad = {
            "no-prompt-key": '{"question": "what?"}\n',
            "empty-prompt": '{"prompt": ""}\n',
            "not-json": "{prompt: what}\n",
            "number": '{"prompt": 5}\n',
        }
        for name, text in bad.items():
            yield Case(
                f"{label}:prompts={name}",
                tuple(argv),
                (("prompts.jsonl", text),),
                (("prompts.jsonl",),),
            )
        yield from structure_cases(f"{label}:prompts", "prompts.jsonl", argv, "text")


def file_cases() -> Iterator[Case]:
    """Structural cases of every input file each command reads."""
    yaml_inputs = {
        "simulate": ["scenario.yaml", "profile.yaml"],
        "plan window": ["scenario.yaml", "profile.yaml"],
        "plan capacity": ["scenario.yaml", "profile.yaml"],
        "report drafter-swap": ["scenario.yaml", "profile.yaml"],
        "validate": ["validate.yaml", "profile.yaml"],
        "profile roofline": ["hardware.yaml", "acceptance.yaml"],
        "profile calibrate": ["profile.yaml"],
    }
    for command, files in yaml_inputs.items():
        for file in files:
            yield from structure_cases(f"{command}:{file}", file, BASE_COMMANDS[command], "yaml")
    for file in ("target.json", "draft.json"):
        yield from structure_cases(
            f"profile roofline:{file}", file, BASE_COMMANDS["profile roofline"], "json"
        )
    trace_argv = ["simulate", f"{D}/trace_scenario.yaml", "--out", OUT]
    yield from structure_cases("trace", "trace.csv", trace_argv, "csv")
    yield from column_cases(
        "trace", "trace.csv", trace_argv, TRACE_COLUMNS, TRACE_ROWS, TRACE_BOUNDS
    )
    yield unknown_key_case("simulate", "scenario.yaml", BASE_COMMANDS["simulate"], SCENARIO)
    yield unknown_key_case(
        "validate", "validate.yaml", BASE_COMMANDS["validate"], VALIDATE_SCENARIO
    )
    yield unknown_key_case("profile", "profile.yaml", BASE_COMMANDS["simulate"], PROFILE)
    yield unknown_key_case("hardware", "hardware.yaml", BASE_COMMANDS["profile roofline"], HARDWARE)
    yield from engine_record_cases()
    yield from sequences_cases()
    yield from metrics_cases()
    yield from prompt_cases()
    yield from model_config_cases()
    from bad_input_models import family_config_cases  # it builds on this module's imports

    yield from family_config_cases()
