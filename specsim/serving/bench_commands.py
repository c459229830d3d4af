"""``bench.sh``: the engines' own load tests of the planned workload, one run per planned load.

``vllm bench serve`` (vLLM 0.33, engine-formats.md §1.7) and ``python -m sglang.bench_serving``
(SGLang 0.5.23, §4.3; a shim for ``sglang.benchmark.serving``) with the ``random`` dataset:
request lengths uniform over the ``LengthRange`` the plan asks for, whose bounds each tool
takes differently. vLLM draws from ``[floor(L(1-r)), ceil(L(1+r))]`` around ``--random-input-len
L`` (one ratio per column as ``{"input": r, "output": r}``), SGLang from ``[max(int(L r), 1),
L]`` with one ``--random-range-ratio`` for both columns. Arrivals: ``--request-rate`` with
vLLM's ``--burstiness`` (gamma shape; SGLang is Poisson only), or ``--max-concurrency`` for a
closed loop. vLLM writes ``bench/vllm/LABEL.json`` with the per-request arrays and the
percentiles ``validate --bench`` compares; SGLang appends one line per run to
``bench/sglang/LABEL.jsonl`` (removed first, so a rerun leaves one line).
"""

from __future__ import annotations

import json
import math
import re
import shlex
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from specsim.serving import sglang_config, trtllm_config, vllm_config
from specsim.serving.setting import EngineSetting, comment_block, role_file

SCRIPT = "bench.sh"
FOLDER = "bench"  # the clients' result folders, beside the script
# What validate --bench compares: these percentiles of these metrics (§1.3; e2el only on request).
PERCENTILE_METRICS = "ttft,tpot,itl,e2el"
METRIC_PERCENTILES = "50,90,99"


@dataclass(frozen=True)
class LengthRange:
    """Whole numbers of tokens, uniform over ``[low, high]`` (``low`` >= 1)."""

    low: int
    high: int


@dataclass(frozen=True)
class BenchLoad:
    label: str  # the result file's stem, e.g. ``rate-4``
    request_rate: float  # requests per second; math.inf: all at once
    max_concurrency: int | None  # a closed loop's clients (None: open loop)
    num_prompts: int


@dataclass(frozen=True)
class BenchPlan:
    prompt: LengthRange
    output: LengthRange
    burstiness: float  # gamma shape of the gaps: 1 Poisson, math.inf evenly spaced
    loads: tuple[BenchLoad, ...]
    seed: int = 0


def label(text: str) -> str:
    """A file stem from a load's name: letters, digits, '.', '_' and '-' only."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "load"


def number(value: float) -> str:
    if math.isinf(value):
        return "inf"
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def vllm_lengths(span: LengthRange) -> tuple[int, float]:
    """``--random-*-len L`` and the ratio r whose range ``[floor(L(1-r)), ceil(L(1+r))]`` is
    ``span`` (§1.7), one token narrower at the top when its width is odd (the bounds are then L
    -+ a whole number). r stays a quarter token inside the exact ratio, so that rounding cannot
    tip a bound over."""
    middle = (span.low + span.high) // 2
    reach = middle - span.low
    if reach == 0:
        return middle, 0.0
    return middle, float(f"{(reach - 0.25) / middle:.10f}")


def vllm_range(length: int, ratio: float) -> tuple[int, int]:
    """What vLLM 0.33 draws for ``length`` and ``ratio`` (§1.7, before special tokens)."""
    return math.floor(length * (1 - ratio)), math.ceil(length * (1 + ratio))


def sglang_range(length: int, ratio: float) -> tuple[int, int]:
    """What SGLang 0.5.23 draws for ``length`` and ``ratio`` (§4.3)."""
    return max(int(length * ratio), 1), length


def sglang_lengths(prompt: LengthRange, output: LengthRange) -> tuple[int, int, float, bool]:
    """``--random-input-len``, ``--random-output-len``, the one ratio, and whether both ranges
    are exact. With L = high, ``int(L r) = low`` holds for r in [low / L, (low + 1) / L), and a
    fixed length needs r = 1: exact when one r satisfies both. Otherwise r is the mean of the
    two columns' ratios, and each L is set so that its column's mean stays."""
    spans = (prompt, output)
    fixed = [span.low == span.high for span in spans]
    if all(fixed):
        return prompt.high, output.high, 1.0, True
    if not any(fixed):
        start = max(span.low / span.high for span in spans)
        end = min((span.low + 1) / span.high for span in spans)
        if start < end:
            return prompt.high, output.high, (start + end) / 2, True
    ratio = float(f"{math.fsum(span.low / span.high for span in spans) / 2:.6f}")
    lengths = [max(1, round((span.low + span.high) / (1 + ratio))) for span in spans]
    return lengths[0], lengths[1], ratio, False


def client_notes(plan: BenchPlan, clients: Iterable[str]) -> list[str]:
    """What the clients cannot reproduce exactly, in words."""
    return [note for bench in _clients(clients) for note in bench.notes(plan)]


def vllm_notes(plan: BenchPlan) -> list[str]:
    odd = [n for n, s in (("prompt", plan.prompt), ("output", plan.output)) if (s.high - s.low) % 2]
    if not odd:
        return []
    return [
        f"vLLM: its ranges are symmetric about --random-*-len, so the {' and '.join(odd)} "
        "range is one token narrower at the top; prompts are drawn about the length less "
        "the tokenizer's special tokens (§1.7)"
    ]


def sglang_notes(plan: BenchPlan) -> list[str]:
    notes = []
    in_len, out_len, ratio, exact = sglang_lengths(plan.prompt, plan.output)
    if not exact:
        low_in, low_out = sglang_range(in_len, ratio)[0], sglang_range(out_len, ratio)[0]
        notes.append(
            "SGLang takes one --random-range-ratio for both lengths, so its ranges keep "
            f"each mean but not the spread: prompts [{low_in}, {in_len}], outputs "
            f"[{low_out}, {out_len}]"
        )
    if plan.burstiness != 1.0 and any(load.max_concurrency is None for load in plan.loads):
        notes.append(
            f"SGLang's arrivals are Poisson only (no --burstiness, §4.3): the planned "
            f"gamma shape {number(plan.burstiness)} is not reproduced by bench_serving"
        )
    return notes


def vllm_command(plan: BenchPlan, load: BenchLoad) -> list[str]:
    (input_len, r_in), (output_len, r_out) = vllm_lengths(plan.prompt), vllm_lengths(plan.output)
    ratio = number(r_in) if r_in == r_out else json.dumps({"input": r_in, "output": r_out})
    argv = ["vllm", "bench", "serve", "--dataset-name", "random"]
    argv += ["--num-prompts", str(load.num_prompts)]
    argv += ["--random-input-len", str(input_len), "--random-output-len", str(output_len)]
    argv += ["--random-range-ratio", ratio, "--ignore-eos"]
    argv += ["--request-rate", number(load.request_rate)]
    if load.max_concurrency is not None:
        argv += ["--max-concurrency", str(load.max_concurrency)]
    else:
        argv += ["--burstiness", number(plan.burstiness)]
    argv += ["--percentile-metrics", PERCENTILE_METRICS]
    argv += ["--metric-percentiles", METRIC_PERCENTILES]
    argv += ["--save-result", "--save-detailed", "--result-dir", VLLM.results]
    return [*argv, "--result-filename", f"{load.label}{VLLM.suffix}"]


def sglang_command(plan: BenchPlan, load: BenchLoad) -> list[str]:
    input_len, output_len, ratio, _ = sglang_lengths(plan.prompt, plan.output)
    argv = ["python", "-m", "sglang.bench_serving", "--backend", "sglang"]
    argv += ["--dataset-name", "random", "--num-prompts", str(load.num_prompts)]
    argv += ["--random-input-len", str(input_len), "--random-output-len", str(output_len)]
    argv += ["--random-range-ratio", number(ratio)]
    argv += ["--request-rate", number(load.request_rate)]
    if load.max_concurrency is not None:
        argv += ["--max-concurrency", str(load.max_concurrency)]
    # --flush-cache: the reported accept_length is a lifetime mean since the last flush (§4.4).
    argv += ["--seed", str(plan.seed), "--flush-cache", "--output-details"]
    return [*argv, "--output-file", SGLANG.result_file(load.label)]


def shell_lines(argv: list[str], indent: str = "  ") -> list[str]:
    """A command as lines, one option (with its values) per line, continued by backslashes."""
    groups: list[list[str]] = [[]]
    for word in argv:
        if word.startswith("--") and groups[-1]:
            groups.append([])
        groups[-1].append(shlex.quote(word))
    lines = [indent + " ".join(groups[0])] + [indent + "  " + " ".join(g) for g in groups[1:]]
    return [line + " \\" for line in lines[:-1]] + [lines[-1]]


def controlled_servers(setting: EngineSetting, engines: Iterable[str]) -> list[str]:
    """Servers (commented out) with acceptance forced to the profile's rates, for the engines
    that have such a test (vLLM's client load-tests any of them)."""
    if setting.speculation is None:
        return []
    lines = [FORCED[name][0](setting) for name in engines if name in FORCED]
    return [f"  {line}" for line in lines if line is not None]


def uncontrolled(setting: EngineSetting, engine: str) -> str | None:
    """Why the engine's server has no controlled test for the setting (None: it has one, or
    no setting needs one)."""
    return FORCED[engine][1](setting) if engine in FORCED else None


def vllm_controlled(setting: EngineSetting) -> str:
    """vLLM's synthetic rejection sampler (§3.3)."""
    synthetic = vllm_config.speculative_config(setting, synthetic=True)
    arguments = vllm_config.server_arguments(setting, synthetic)
    model = shlex.quote(setting.target.path)
    return f"vllm serve {model} {shlex.join(a for pair in arguments for a in pair)}"


def sglang_controlled(setting: EngineSetting) -> str | None:
    """SGLang's simulated acceptance length (§4.6), on its EAGLE-family verify path only."""
    spec = setting.speculation
    k = spec.fallback_k if spec.by_batch else spec.k
    if k == 0 or sglang_config.algorithm(spec) == "NGRAM":
        return None
    options = sglang_config.arguments(setting, k)
    sglang = shlex.join(a for pair in options for a in pair if a is not None)
    return (
        f"SGLANG_SIMULATE_ACC_LEN={spec.mean_acceptance_length(k):.4f} python -m "
        f"sglang.launch_server --model-path {shlex.quote(setting.target.path)} {sglang}"
    )


# TensorRT-LLM forces acceptance in its one-model speculative sampler
# (tensorrt_llm/_torch/speculative/interface.py, FORCE_NUM_ACCEPTED_TOKENS_ENV_VAR): MTP and
# EAGLE-3 run there; the two-model paths (Draft_Target, NGram) do not read it.
TRTLLM_FORCED_TYPES = frozenset({"MTP", "Eagle3"})


def trtllm_controlled(setting: EngineSetting) -> str | None:
    """TensorRT-LLM's forced acceptance: ``TLLM_SPEC_DECODE_FORCE_NUM_ACCEPTED_TOKENS`` counts
    accepted drafts (the mean acceptance length less the bonus token); its whole part is
    accepted every step and its fraction is the chance of one more."""
    spec = setting.speculation
    k = spec.fallback_k if spec.by_batch else spec.k
    if k == 0 or trtllm_config.decoding_type(spec) not in TRTLLM_FORCED_TYPES:
        return None
    name = role_file(trtllm_config.YAML_FILE, setting.role)
    return (
        f"TLLM_SPEC_DECODE_FORCE_NUM_ACCEPTED_TOKENS={spec.mean_acceptance_length(k) - 1:.4f} "
        f"trtllm-serve {shlex.quote(setting.target.path)} --extra_llm_api_options {name}"
    )


def trtllm_uncontrolled(setting: EngineSetting) -> str | None:
    spec = setting.speculation
    if spec is None or trtllm_config.decoding_type(spec) in TRTLLM_FORCED_TYPES:
        return None
    return (
        f"TensorRT-LLM has no controlled test for {trtllm_config.decoding_type(spec)}: "
        "TLLM_SPEC_DECODE_FORCE_NUM_ACCEPTED_TOKENS acts in its one-model sampler (MTP, Eagle3)."
    )


def sglang_uncontrolled(setting: EngineSetting) -> str | None:
    spec = setting.speculation
    if spec is None or sglang_config.algorithm(spec) != "NGRAM":
        return None
    return (
        "SGLang has no controlled test for NGRAM: SGLANG_SIMULATE_ACC_LEN acts on the "
        "EAGLE-family verify path only (engine-formats.md §4.6)."
    )


def script(plan: BenchPlan, header: list[str], clients: Iterable[str]) -> str:
    """bench.sh: ``bash bench.sh vllm`` (or ``sglang``) runs that client at every load."""
    clients = tuple(clients)
    body = ["#!/usr/bin/env bash", comment_block(header).rstrip("\n"), "set -euo pipefail"]
    body.append('cd "$(dirname "${BASH_SOURCE[0]}")"')
    for client, bench in zip(clients, _clients(clients), strict=True):
        body += ["", f"run_{client}() {{", f"  mkdir -p {bench.results}"]
        for load in plan.loads:
            if bench.appends:
                body.append(f"  rm -f {bench.result_file(load.label)}  # it appends")
            body += shell_lines(bench.command(plan, load))
        body.append("}")
    choices = "|".join(clients)
    body += ["", 'case "${1:-}" in']
    body += [f"  {client}) run_{client} ;;" for client in clients]
    body.append(
        f'  *) echo "usage: bash {SCRIPT} {choices} (start the server first)" >&2; exit 2 ;;'
    )
    body.append("esac")
    return "\n".join(body) + "\n"


@dataclass(frozen=True)
class BenchClient:
    """An engine's own load-test client: its command per load, where it writes the results and
    what it cannot reproduce (each server's forced acceptance is ``FORCED``'s)."""

    engine: str
    command: Callable[[BenchPlan, BenchLoad], list[str]]
    notes: Callable[[BenchPlan], list[str]]
    suffix: str = ".json"
    appends: bool = False  # a rerun would add to the file, so the script removes it first
    any_server: bool = False  # it load-tests every engine's server (an OpenAI-style endpoint)

    @property
    def results(self) -> str:
        return f"{FOLDER}/{self.engine}"

    def result_file(self, label: str) -> str:
        return f"{self.results}/{label}{self.suffix}"


VLLM = BenchClient("vllm", vllm_command, vllm_notes, any_server=True)
SGLANG = BenchClient("sglang", sglang_command, sglang_notes, suffix=".jsonl", appends=True)
# Each engine's server with acceptance forced, and why a setting has none (None: it has one).
FORCED = {
    "vllm": (vllm_controlled, lambda setting: None),
    "sglang": (sglang_controlled, sglang_uncontrolled),
    "trtllm": (trtllm_controlled, trtllm_uncontrolled),
}
# The clients by engine name; the engine registry (``serving.registry``) names each its own.
CLIENTS = {bench.engine: bench for bench in (VLLM, SGLANG)}
RESULTS = {name: bench.results for name, bench in CLIENTS.items()}


def _clients(names: Iterable[str]) -> list[BenchClient]:
    """The clients of the engines named, in that order (an engine without one is skipped)."""
    return [CLIENTS[name] for name in names if name in CLIENTS]
