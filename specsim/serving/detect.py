"""``read_bench_files``: benchmark results of any known format, told apart by their content.

- JSON objects (one, or one per line): each engine's benchmark with a reader in the engine
  registry, told by its keys (``vllm bench serve --save-result`` writes ``model_id``, SGLang
  ``bench_serving`` ``mean_e2e_latency_ms``); a file name says nothing, so a renamed file reads
  the same.
- A CSV whose header has ``completed`` and ``duration_s``: specsim's normalised table.
- A Prometheus scrape is acceptance, not a run: ``specsim.serving.prometheus.read_scrape``.

The runs of one call must come from one deployment: two models, two engines or one file given
twice are refused, since a fit over them would mean nothing.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from pathlib import Path

from specsim.errors import SpecsimError
from specsim.fileio import check_input_file
from specsim.parsing import JSON_DECODER, reading_json
from specsim.serving import normalised, registry
from specsim.serving.runs import BenchRun

KNOWN = (
    "".join(f"{e.reader.title}, " for e in registry.readers())
    + f"or specsim's normalised CSV ({normalised.REFERENCE})"
)
_PROMETHEUS = re.compile(r"^(# (HELP|TYPE) |[a-zA-Z_:][a-zA-Z0-9_:]*(\{.*\})?\s+\S+\s*$)")


def read_bench_files(paths: Iterable[str | Path]) -> list[BenchRun]:
    """Every run in ``paths``, in order (files, then runs within a file)."""
    runs: list[BenchRun] = []
    seen: dict[str, str] = {}
    for path in paths:
        source = str(path)
        raw = check_input_file(path, "benchmark result").read_bytes()
        sha256 = hashlib.sha256(raw).hexdigest()
        if sha256 in seen:
            raise SpecsimError(
                f"the same results as {seen[sha256]}", file=source, fix="give each file once"
            )
        seen[sha256] = source
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SpecsimError(
                f"not UTF-8 text (byte {exc.start})", file=source, fix="give the file as written"
            ) from None
        runs += read_bench_text(text, source, sha256)
    check_one_deployment(runs)
    return runs


def read_bench_text(text: str, source: str, sha256: str) -> list[BenchRun]:
    """The runs in one file's text, its format told from the content."""
    if not text.strip():
        raise SpecsimError("file is empty", file=source, fix=f"give a benchmark result: {KNOWN}")
    if text.lstrip().startswith("{"):
        objects = json_objects(text, source)
        found = {_engine_of(data, source, i) for i, data in enumerate(objects)}
        if len(found) > 1:
            both = " and ".join(f"{e.display}'s" for e in registry.ENGINES if e in found)
            raise SpecsimError(
                f"holds results of both {both} benchmark",
                file=source,
                fix="keep one tool's results per file",
            )
        return found.pop().reader.read_runs(objects, source, sha256)
    if normalised.is_normalised_csv(text):
        return normalised.read_runs(text, source, sha256)
    if is_scrape(text):
        raise SpecsimError(
            "a /metrics scrape holds acceptance, not a benchmark run",
            file=source,
            fix="give the benchmark's result file here, and the scrape as --metrics RESULT=SCRAPE "
            "(or to profile calibrate)",
        )
    raise SpecsimError("not a benchmark result of a known format", file=source, fix=f"give {KNOWN}")


def is_scrape(text: str) -> bool:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return all(_PROMETHEUS.match(line) for line in lines[:20])


def not_results(path: Path) -> str | None:
    """Why a file in a results folder is no benchmark result (a server log, notes, a scrape),
    or None when its content reads as one: ``validate --bench DIR`` skips the others."""
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        return "not UTF-8 text"
    if not text.strip():
        return "file is empty"
    if text.lstrip().startswith("{") or normalised.is_normalised_csv(text):
        return None
    if is_scrape(text):
        return "a /metrics scrape (give it as --metrics RESULT=SCRAPE)"
    return "not a benchmark result of a known format"


def json_objects(text: str, source: str) -> list[dict]:
    """The JSON objects of a file: one, or several separated by whitespace (JSONL, or vLLM's
    ``--append-result``). Python's parser takes SGLang's bare ``Infinity``; the readers refuse
    a non-finite number wherever a key does not allow one."""
    objects, position = [], 0
    while True:
        while position < len(text) and text[position].isspace():
            position += 1
        if position == len(text):
            return objects
        with reading_json(source, "give the file as the benchmark wrote it"):
            data, position = JSON_DECODER.raw_decode(text, position)
        if not isinstance(data, dict):
            line = text.count("\n", 0, position) + 1
            raise SpecsimError(
                f"expected a JSON object, found {type(data).__name__}",
                file=source,
                key=f"line {line}",
                fix=f"give {KNOWN}",
            )
        objects.append(data)


def _engine_of(data: dict, source: str, index: int) -> registry.Engine:
    """The engine whose benchmark wrote the object, told from its keys."""
    for engine in registry.readers():
        if engine.reader.detects(data):
            return engine
    raise SpecsimError(
        "neither " + " nor ".join(e.reader.described for e in registry.readers()),
        file=f"{source} (run {index + 1})",
        fix=f"give {KNOWN}",
    )


def check_one_deployment(runs: list[BenchRun]) -> None:
    """Refuse runs of two models or two engines in one call."""
    for what in ("model", "engine"):
        first = next((run for run in runs if getattr(run, what)), None)
        for run in runs:
            value = getattr(run, what)
            if first is not None and value and value != getattr(first, what):
                raise SpecsimError(
                    f"runs of two {what}s: {getattr(first, what)!r} in {first.where} and {value!r}",
                    file=run.where,
                    key=what,
                    fix="give the results of one deployment (one model on one engine) per call",
                )
