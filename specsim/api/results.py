"""What the API returns, and ``load_run``: a run folder read back into the same objects.

A ``Result`` is a simulation (``specsim simulate``'s folder: summary.json and requests.csv), a
``PlanResult`` a plan or a report (``specsim plan``, ``specsim report``: summary.json and one
CSV per table and figure), a ``ValidationRun`` a ``specsim validate`` folder. Every table is a
pandas DataFrame read from its CSV text, so a result in memory and the same result read back
from its folder hold equal frames. pandas is imported where a frame is made, so the commands,
which write files and make none, do not pay for importing it.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specsim.engine.records import QUALITY_FORMATS
from specsim.errors import SpecsimError
from specsim.fileio import atomic_output_dir, check_output_folder, dump_json, read_text
from specsim.parsing import parse_json
from specsim.simulation.records import CELL_FORMATS, read_requests

if TYPE_CHECKING:
    import pandas as pd

SUMMARY = "summary.json"
REQUESTS = "requests.csv"
COMPARISON = "comparison.json"
# Files of a plan or report folder that are neither a table, a figure nor an attachment.
PLAN_FILES = {SUMMARY, "sweep.json", "report.html", "report.md"}
ENGINE_FOLDER = "engine"  # a plan's --emit files (specsim.planning.emit.emit.FOLDER)


@dataclass(eq=False)
class Result:
    """One simulation: ``summary`` is summary.json's dict, ``requests`` requests.csv as a
    DataFrame (one row per request, by id; the columns and types ``pandas.read_csv`` gives)."""

    summary: dict[str, Any]
    requests: pd.DataFrame

    def save(self, out: str | Path) -> Path:
        """Write requests.csv and summary.json into ``out`` (atomically), byte for byte as
        ``specsim simulate --out`` writes them."""
        check_output_folder(out, "out")
        with atomic_output_dir(out) as staging:
            write_requests(self.requests, staging / REQUESTS)
            (staging / SUMMARY).write_text(dump_json(self.summary), encoding="utf-8")
        return Path(out)

    def __repr__(self) -> str:
        scenario = self.summary.get("scenario")
        name = scenario.get("name") if isinstance(scenario, dict) else scenario
        return f"<specsim Result {name!r}: {len(self.requests)} requests>"


@dataclass(eq=False)
class PlanResult:
    """A plan or report: ``summary`` is summary.json's dict (the answer), ``tables`` the
    report's tables and ``figures`` the numbers behind each figure (long format: panel, series,
    x, y, x_unit, y_unit), each by its CSV file's stem, and ``attachments`` the other files
    written beside the report (``k_by_batch.yaml``; with ``emit``, ``engine/vllm.json`` and
    the like) by name. ``out`` is the folder, or None for a run kept in memory only;
    ``simulations`` how many simulations the run computed and how many it reused from
    ``out/points`` (None for a folder read back: summary.json leaves it out)."""

    summary: dict[str, Any]
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    figures: dict[str, pd.DataFrame] = field(default_factory=dict)
    attachments: dict[str, str] = field(default_factory=dict)
    out: Path | None = None
    simulations: dict[str, int] | None = None

    @property
    def command(self) -> str:
        """The command that made it: ``plan window``, ``plan capacity``, ``report drafter-swap``."""
        return self.summary["command"]

    @property
    def failed(self) -> list[dict[str, Any]]:
        """The simulations that failed (their overrides and one-line error); empty when none."""
        return self.summary.get("failed", [])

    def __repr__(self) -> str:
        return f"<specsim PlanResult {self.command!r}: tables {sorted(self.tables)}>"


@dataclass(eq=False)
class ValidationRun:
    """A ``specsim validate`` folder: ``comparison`` is comparison.json's dict, ``metrics`` its
    rows as a DataFrame (metric, measured, predicted, relative error, threshold, ok, ...),
    ``engine`` and ``simulation`` the two runs (the engine's requests carry its quality
    columns), ``iterations`` the engine's iterations.csv."""

    comparison: dict[str, Any]
    engine: Result
    simulation: Result
    iterations: pd.DataFrame
    out: Path

    @property
    def metrics(self) -> pd.DataFrame:
        """comparison.json's rows: one per metric, measured against predicted."""
        import pandas as pd

        return pd.DataFrame(self.comparison["rows"])

    @property
    def passed(self) -> bool:
        """Whether every metric is within its threshold."""
        return bool(self.comparison["passed"])


@dataclass(eq=False)
class BenchValidationRun:
    """A ``specsim validate --bench`` folder: ``comparison`` is comparison.json's dict,
    ``metrics`` every run's rows as one DataFrame (its first column ``run``: the run's folder
    name under runs/), ``runs`` the simulator's seeded run of each benchmark run by that name."""

    comparison: dict[str, Any]
    runs: dict[str, Result]
    out: Path

    @property
    def metrics(self) -> pd.DataFrame:
        """comparison.json's rows of every run: one per run and figure, measured against
        predicted."""
        import pandas as pd

        rows = [
            {"run": run["name"], **row} for run in self.comparison["runs"] for row in run["rows"]
        ]
        return pd.DataFrame(rows)

    @property
    def passed(self) -> bool:
        """Whether every figure of every run is within its threshold."""
        return bool(self.comparison["passed"])


def write_requests(frame: pd.DataFrame, path: Path) -> None:
    """requests.csv from its DataFrame, each column in the format the simulator (or the real
    engine) writes it in, through the csv module's quoting as theirs is."""
    import pandas as pd

    formats = {**CELL_FORMATS, **QUALITY_FORMATS}
    cells = pd.DataFrame(
        {
            name: frame[name].map(formats[name].__mod__) if name in formats else frame[name]
            for name in frame.columns
        }
    )
    cells.to_csv(path, index=False, lineterminator="\n", encoding="utf-8")


def read_table(text: str) -> pd.DataFrame:
    """A report's CSV (a table's or a figure's) as a DataFrame; an empty cell is a missing value
    (the report writes one for None), every other cell is kept as written."""
    import pandas as pd

    return pd.read_csv(io.StringIO(text), keep_default_na=False, na_values=[""])


def plan_result(summary: dict[str, Any], report, out: Path | None) -> PlanResult:
    """The PlanResult of a report built in this process (``specsim.planning.report.Report``)."""
    return PlanResult(
        summary=summary,
        tables={t.name: read_table(t.csv_text()) for t in report.tables()},
        figures={f.name: read_table(f.csv_text()) for f in report.figures()},
        attachments=dict(report.attachments),
        out=out,
    )


def load_run(folder: str | Path) -> Result | PlanResult | ValidationRun | BenchValidationRun:
    """Read a run folder back: ``specsim simulate``'s (a Result), ``specsim plan`` or
    ``specsim report``'s (a PlanResult) or ``specsim validate``'s (a ValidationRun; with
    ``--bench``, a BenchValidationRun)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise SpecsimError(
            "run folder not found", file=str(folder), fix="give the --out folder of a specsim run"
        )
    if (folder / COMPARISON).is_file():
        comparison = _json(folder / COMPARISON)
        if "bench" in comparison:
            return _bench_validation(folder, comparison)
        return _validation(folder)
    summary = _json(folder / SUMMARY)
    if "command" in summary:
        return _plan(folder, summary)
    return Result(summary, read_requests(folder / REQUESTS))


def _json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise SpecsimError(
            f"no {path.name} here, so this is not a specsim run's folder",
            file=str(path.parent),
            fix="give the --out folder of specsim simulate, plan, report or validate",
        )
    data = parse_json(read_text(path, path.name), str(path), "run the command again")
    if not isinstance(data, dict):
        raise SpecsimError("expected a JSON object", file=str(path), fix="run the command again")
    return data


def _plan(folder: Path, summary: dict[str, Any]) -> PlanResult:
    tables, figures, attachments = {}, {}, {}
    for path in sorted(p for p in folder.iterdir() if p.is_file()):
        if path.name in PLAN_FILES or path.suffix == ".png" or path.name.startswith("."):
            continue
        text = read_text(path, path.name)
        if path.suffix != ".csv":
            attachments[path.name] = text
        elif path.with_suffix(".png").is_file():
            figures[path.stem] = read_table(text)
        else:
            tables[path.stem] = read_table(text)
    engine = folder / ENGINE_FOLDER  # --emit's files (its bench/ results are not the plan's)
    if engine.is_dir():
        for path in sorted(p for p in engine.iterdir() if p.is_file()):
            if not path.name.startswith("."):
                attachments[f"{ENGINE_FOLDER}/{path.name}"] = read_text(path, path.name)
    return PlanResult(summary, tables, figures, attachments, folder)


def _validation(folder: Path) -> ValidationRun:
    runs = {}
    for part in ("engine", "simulation"):
        runs[part] = Result(_json(folder / part / SUMMARY), read_requests(folder / part / REQUESTS))
    iterations = folder / "engine" / "iterations.csv"
    return ValidationRun(
        comparison=_json(folder / COMPARISON),
        engine=runs["engine"],
        simulation=runs["simulation"],
        iterations=read_table(read_text(iterations, "iterations.csv")),
        out=folder,
    )


def _bench_validation(folder: Path, comparison: dict[str, Any]) -> BenchValidationRun:
    runs = {}
    for run in comparison["runs"]:
        part = folder / "runs" / run["name"]
        runs[run["name"]] = Result(_json(part / SUMMARY), read_requests(part / REQUESTS))
    return BenchValidationRun(comparison, runs, folder)
