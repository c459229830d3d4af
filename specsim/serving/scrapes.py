"""Acceptance from a /metrics scrape for benchmark runs whose files count none, and the
runs' prefix-cache hit share where the scrape has the cache's series
(``specsim.serving.prefix_share``).

Older ``vllm bench serve`` layouts and a plain ``--save-result`` without speculative counters
leave a speculative run's acceptance out of its file; the server's /metrics scrape has it. A
pair ``RESULT=SCRAPE`` (``--metrics``) gives the scrape's counters to the runs of RESULT. vLLM's
counters are totals since the server started and SGLang's gauges its latest logging interval,
so the acceptance is the deployment's over that span, not the run's own: each run says so.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path

from specsim.errors import SpecsimError
from specsim.fileio import check_input_file, read_text
from specsim.serving.prefix_share import scrape_share
from specsim.serving.prometheus import read_scrape
from specsim.serving.prometheus_text import parse_prometheus
from specsim.serving.runs import BenchRun

OPTION = "--metrics"


def parse_pair(text: str) -> tuple[str, str]:
    """``RESULT=SCRAPE`` as (result, scrape)."""
    result, sep, scrape = text.partition("=")
    if not sep or not result or not scrape:
        raise SpecsimError(
            f"{text!r} is not RESULT=SCRAPE",
            file="command line",
            key=OPTION,
            fix="give a benchmark result file and the /metrics scrape of its server, joined by =",
        )
    return result, scrape


def attach_scrapes(runs: list[BenchRun], pairs: list[tuple[str, str]]) -> list[BenchRun]:
    """``runs`` with each pair's scrape counters given to the runs of its result file."""
    by_file: dict[Path, str] = {}
    for result, scrape in pairs:
        path = Path(result).resolve()
        if path in by_file:
            raise SpecsimError(
                f"{result} is given two scrapes", file="command line", key=OPTION,
                fix="give one scrape per result file",
            )  # fmt: skip
        if not any(Path(run.source).resolve() == path for run in runs):
            raise SpecsimError(
                f"{result} is not one of the benchmark result files given",
                file="command line",
                key=OPTION,
                fix="name a result file given to profile from-bench (or under validate --bench) "
                "before the =",
            )
        by_file[path] = scrape
    return [_with_scrape(run, by_file.get(Path(run.source).resolve())) for run in runs]


def _with_scrape(run: BenchRun, scrape_path: str | None) -> BenchRun:
    """The scrape's acceptance for a run that counts none, and its prefix-cache hit share."""
    if scrape_path is None:
        return run
    samples = parse_prometheus(read_text(scrape_path, "metrics dump"), scrape_path)
    share = scrape_share(samples, scrape_path)
    speculative = any(s.name.startswith(("vllm:spec_decode", "sglang:spec_")) for s in samples)
    if share is not None:
        note = f"prefix-cache hit share {share[0]:.4g} from {scrape_path}: {share[1]}"
        run = replace(run, prefix_hit_share=share[0], notes=(*run.notes, note))
        if not speculative or run.speculation is not None:
            return run
    return _with_acceptance(run, scrape_path)


def _with_acceptance(run: BenchRun, scrape_path: str) -> BenchRun:
    if run.speculation is not None:
        raise SpecsimError(
            "the run counts its own acceptance, so a scrape is not given to it",
            file=run.where,
            key=OPTION,
            fix=f"drop {OPTION} for this file",
        )
    scrape = read_scrape(scrape_path)
    if run.engine not in (scrape.engine, "other"):
        raise SpecsimError(
            f"the scrape is {scrape.engine}'s, the run {run.engine}'s",
            file=scrape_path,
            key=OPTION,
            fix="give the scrape of the server the benchmark ran against",
        )
    digest = hashlib.sha256(check_input_file(scrape_path, "metrics dump").read_bytes())
    note = (
        f"acceptance from the /metrics scrape {scrape_path} (sha256 {digest.hexdigest()[:12]}): "
        + "; ".join(scrape.notes)
    )
    return replace(run, speculation=scrape.speculation, notes=(*run.notes, note))
