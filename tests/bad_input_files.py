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
    """A Hugging Face config.json (``profile roofline --target``): each dimension key."""
    from specsim.profiling.model_configs import DIMENSION_KEYS, OPTIONAL_DIMENSION_KEYS

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
    """``profile calibrate``'s Prometheus counters: each counter's value, the position."""
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


def _bench(**changes: Any) -> str:
    """The base benchmark run (``BENCH``) with keys changed (None: removed), as JSON."""
    from bad_input_bases import BENCH

    data = {**BENCH, **changes}
    return json.dumps({k: v for k, v in data.items() if v is not None})


# A speculative run's counters that agree with one another (vLLM 0.33's keys, k = 2).
SPEC_COUNTERS = {
    "spec_decode_num_drafts": 30,
    "spec_decode_draft_tokens": 60,
    "spec_decode_accepted_tokens": 30,
    "spec_decode_acceptance_length": 2.0,
    "spec_decode_acceptance_rate": 50.0,
    "spec_decode_per_position_acceptance_rates": [0.6, 0.4],
}


def bench_cases() -> Iterator[Case]:
    """The benchmark results that profile from-bench and validate --bench read: the file's
    structure, and the bad inputs issue 19 lists (a file of unknown format, missing keys, a
    rate and duration that disagree, two models or two engines in one call, a speculative
    run without its counters), for both commands."""
    from bad_input_bases import METRICS

    # 40 requests at 2/s cannot all be sent within 2 s (their throughputs agree with 2 s).
    hurried = {"num_prompts": 40, "completed": 40, "total_input_tokens": 2560}
    hurried |= {"total_output_tokens": 640, "request_throughput": 20.0, "output_throughput": 320.0}
    from_bench = BASE_COMMANDS["profile from-bench"]
    second = from_bench.index(f"{D}/bench.json") + 1
    commands = {
        # (the result file, its command line, the command line with a second file)
        "profile from-bench": (
            "bench.json",
            from_bench,
            [*from_bench[:second], f"{D}/bench2.json", *from_bench[second:]],
        ),
        "validate bench": ("bench/bench.json", BASE_COMMANDS["validate bench"], None),
    }
    for command, (file, argv, with_second) in commands.items():
        label = f"{command}:{file}"
        kinds = structure_cases(label, file, argv, "json")
        if command == "validate bench":  # a missing file leaves a folder without results
            kinds = (c for c in kinds if not c.id.endswith(("=missing", "=folder")))
        yield from kinds
        yield Case(f"{label}=scrape", tuple(argv), ((file, METRICS),), ((file,), ("/metrics",)))
        yield Case(
            f"{label}=unknown-format",
            tuple(argv),
            ((file, "date,rps\n2026-12-01,4\n"),),
            ((file,), ("not a benchmark result of a known format",)),
        )
        for key in ("model_id", "duration", "completed", "total_output_tokens", "request_rate"):
            yield Case(
                f"{label}:{key}=absent",
                tuple(argv),
                ((file, _bench(**{key: None})),),
                ((file,), (key, "neither a vLLM result")),
            )
        yield Case(
            f"{label}=rate-and-duration-disagree",
            tuple(argv),
            ((file, _bench(**hurried)),),
            ((file,), ("request_rate/duration",)),
        )
        yield Case(
            f"{label}=spec-run-without-counters",
            tuple(argv),
            ((file, _bench(spec_decode_num_drafts=30)),),
            ((file,), ("without its counters",)),
        )
        other = f"{file.rsplit('/', 1)[0]}/bench2.json" if "/" in file else "bench2.json"
        for what, change in (
            ("models", {"model_id": "other/model"}),
            ("engines", {"backend": "sglang"}),
        ):
            yield Case(
                f"{command}:two-{what}",
                tuple(with_second or argv),
                ((other, _bench(**change)),),
                ((other,), (f"runs of two {what}",)),
            )
    argv = BASE_COMMANDS["validate bench"]
    yield Case(
        "validate bench:--bench=no-results",
        tuple(argv),
        (("bench/bench.json", None),),
        (("--bench",), ("holds no benchmark result files",)),
    )
    speculating = ("--set", "speculation.drafter=d1", "--set", "speculation.k=2")
    yield Case(
        "validate bench:plain-run-for-a-speculating-scenario",
        (*argv, *speculating),
        (),
        (("bench/bench.json",), ("spec_decode_acceptance_length",)),
    )
    yield Case(
        "validate bench:speculative-run-for-a-plain-scenario",
        tuple(argv),
        (("bench/bench.json", _bench(**SPEC_COUNTERS)),),
        (("bench/bench.json",), ("the scenario does not speculate",)),
    )
    yield Case(
        "validate bench:another-k",
        (*argv, "--set", "speculation.drafter=d1", "--set", "speculation.k=3"),
        (("bench/bench.json", _bench(**SPEC_COUNTERS)),),
        (("bench/bench.json",), ("speculation.k=2",)),
    )
    yield Case(
        "validate bench:--target-with-bench",
        (*argv, "--target", "specsim-draft-tiny"),
        (),
        (("--target",),),
    )


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
    yield from bench_cases()
    from bad_input_models import family_config_cases  # it builds on this module's imports

    yield from family_config_cases()
