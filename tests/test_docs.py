"""The documentation stays true to the code.

- The reference pages in docs/reference are what ``python -m specsim.docs`` generates now.
- The pages document every schema field and every command option, and the output files and keys
  they describe are the ones real runs write.
- The README keeps its two CI set-up commands; its tour commands, and the guide's, parse with the
  real CLI and name files that exist (the tour's quick ones are run); the guide's scenario and
  profile examples validate; the README links every guide page and every link resolves.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import json
import os
import re
import shlex
import shutil
import typing
from pathlib import Path

import pydantic
import pytest
from pydantic import Field

from specsim import docs
from specsim.cli import build_parser
from specsim.cli import main as specsim
from specsim.config import StrictModel
from specsim.docs import cli as cli_docs

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
GUIDE = ROOT / "docs" / "guide"
INPUT_SUFFIXES = (".yaml", ".yml", ".json", ".jsonl", ".txt", ".csv")


# ---------------------------------------------------------------------------------------------
# Reference pages


def test_committed_reference_pages_are_current():
    stale = docs.stale_pages(docs.DEFAULT_FOLDER, docs.reference_pages())
    assert not stale, f"stale reference pages {stale}: run `python -m specsim.docs` and commit"


def test_stale_and_leftover_pages_are_detected(tmp_path):
    pages = docs.reference_pages()
    docs.write_pages(tmp_path, pages)
    assert docs.stale_pages(tmp_path, pages) == []
    edited = pages["scenario.md"].replace("window size", "windw size", 1)
    assert edited != pages["scenario.md"]
    (tmp_path / "scenario.md").write_text(edited, encoding="utf-8")
    (tmp_path / "cli" / "retired.md").write_text("an old command\n", encoding="utf-8")
    assert docs.stale_pages(tmp_path, pages) == ["cli/retired.md", "scenario.md"]
    # A page written by hand is kept: neither stale nor removed.
    (handwritten,) = docs.HANDWRITTEN
    (tmp_path / handwritten).write_text("# by hand\n", encoding="utf-8")
    assert docs.stale_pages(tmp_path, pages) == ["cli/retired.md", "scenario.md"]
    assert f"]({handwritten})" in pages["README.md"]
    page = tmp_path.parent / f"{tmp_path.name}-validate.md"  # the command writes its table too
    shutil.copy(GUIDE / "validate.md", page)
    where = ["--out", str(tmp_path), "--table-page", str(page)]
    with contextlib.redirect_stdout(io.StringIO()):
        assert docs.main(["--check", *where]) == 1
        assert docs.main(where) == 0
        assert docs.main(["--check", *where]) == 0
    assert not (tmp_path / "cli" / "retired.md").exists()
    assert (tmp_path / handwritten).read_text(encoding="utf-8") == "# by hand\n"


def test_docs_command_refuses_a_file_as_its_folder(tmp_path, capsys):
    target = tmp_path / "reference"
    target.write_text("not a folder\n", encoding="utf-8")
    assert docs.main(["--out", str(target)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and str(target) in err and "fix: give a folder" in err
    assert target.read_text(encoding="utf-8") == "not a folder\n"


def _models(root: type[pydantic.BaseModel]) -> list[type[pydantic.BaseModel]]:
    found, todo = [], [root]
    while todo:
        model = todo.pop()
        if model in found:
            continue
        found.append(model)
        for field in model.model_fields.values():
            todo += docs.nested_models(field.annotation)
    return found


def _section(page: str, title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", page, re.S | re.M)
    assert match, f"no section {title!r}"
    return match.group(1)


@pytest.mark.parametrize("page_name", ["scenario.md", "profile.md"])
def test_schema_pages_document_every_field_of_every_model(page_name):
    from specsim.profile.schema import Profile
    from specsim.scenario import Scenario

    root = Scenario if page_name == "scenario.md" else Profile
    page = docs.reference_pages()[page_name]
    models = _models(root)
    assert len(models) >= 8
    for model in models:
        section = _section(page, model.__name__)
        for name, field in model.model_fields.items():
            row = next((r for r in section.splitlines() if r.startswith(f"| `{name}` |")), None)
            assert row is not None, f"{model.__name__}.{name} missing"
            if field.description:
                assert docs.cell(field.description) in row


def test_schema_page_renders_types_defaults_and_constraints():
    class Inner(StrictModel):
        """An inner part, ``documented``."""

        size: int = 1

    class Outer(StrictModel):
        mode: typing.Literal["fast", "exact"] = Field(default="fast", description="how | why")
        rate: typing.Annotated[float, Field(gt=0)] | None = None
        need: int = Field(ge=1, le=8)
        parts: list[Inner] = Field(default_factory=list)
        named: dict[str, Inner] = Field(default_factory=dict)

    page = docs.schema_page(Outer, "Planted", "intro text")
    assert "| `mode` | string | `'fast'` | `'fast'`, `'exact'` | how \\| why |" in page
    assert "| `rate` | number or null | `null` | > 0 |  |" in page
    assert "| `need` | integer | **required** | ≥ 1; ≤ 8 |  |" in page
    assert "| `parts` | list of [Inner](#inner) | `[]` |" in page
    assert "| `named` | mapping string → [Inner](#inner) | `{}` |" in page
    assert "Used at `parts[]`, `named.<name>`." in page
    assert "An inner part, `documented`." in page


def test_docstring_literal_blocks_become_fenced_code():
    doc = """Title line.

    The formula::

        y = a * x  # ``literal``

    After, ``code``.
    """
    assert docs.docstring_markdown(doc) == (
        "Title line.\n\nThe formula:\n\n```text\ny = a * x  # ``literal``\n```\n\nAfter, `code`."
    )


def _commands(parser: argparse.ArgumentParser, prog: str):
    yield prog, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, f"{prog} {name}")


def test_cli_pages_document_every_command_and_option():
    pages = docs.reference_pages()
    commands = list(_commands(build_parser(), "specsim"))[1:]
    assert {p.split()[1] for p, _ in commands} == set(
        build_parser()._subparsers._group_actions[0].choices
    )
    for prog, parser in commands:
        page = pages[f"cli/{prog.split()[1]}.md"]
        assert f"`{prog}`" in page
        if parser.description:  # once per page even where subcommands share it
            first_line = parser.description.strip().splitlines()[0]
            assert page.count(first_line) == 1, prog
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction) or cli_docs.hidden(action):
                continue
            shown = action.option_strings[0] if action.option_strings else action.metavar
            assert f"`{shown or action.dest.upper()}`" in page, f"{prog}: {action.dest}"
            if action.help:
                assert docs.cell(docs.option_help(action)) in page


def test_every_command_has_its_own_description_and_every_option_a_help_line():
    """``--help`` of a subcommand says what it does, not what its parent does; every option
    and positional says what it takes (walked over the whole parser tree)."""
    missing = []
    for prog, parser in _commands(build_parser(), "specsim"):
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction | argparse._VersionAction):
                continue
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    if not (sub.description or "").strip():
                        missing.append(f"{prog} {name}: no description")
                    elif sub.description == parser.description:
                        missing.append(f"{prog} {name}: the description of {prog}")
                continue
            if action.dest == argparse.SUPPRESS:  # an old spelling's pointer to its replacement
                continue
            if not action.help or action.help == argparse.SUPPRESS:
                name = "/".join(action.option_strings) or action.dest
                missing.append(f"{prog} {name}: no help line")
    assert missing == []


def test_synopsis_and_description_rendering():
    parser = argparse.ArgumentParser(prog="specsim demo")
    parser.add_argument("scenario", metavar="SCENARIO")
    parser.add_argument("--out", metavar="DIR", required=True)
    parser.add_argument("--set", metavar="KEY=VALUE", action="append", default=[])
    parser.add_argument("--loads", metavar="LOAD", nargs="+")
    parser.add_argument("--json", action="store_true")
    assert docs.synopsis("specsim demo", parser) == (
        "specsim demo SCENARIO --out DIR [--set KEY=VALUE ...] [--loads LOAD ...] [--json]"
    )
    wrapped = docs.synopsis("specsim demo", parser, width=40).splitlines()
    assert all(len(line) <= 40 for line in wrapped) and len(wrapped) > 2
    assert all(line.startswith(" " * 13) for line in wrapped[1:])
    text = "Do a thing.\n\nExamples:\n  specsim demo a.yaml --out x\n      explained here\nEnd."
    assert docs.help_markdown(text) == (
        "Do a thing.\n\nExamples:\n\n```text\nspecsim demo a.yaml --out x\n    explained here\n"
        "```\n\nEnd."
    )


# ---------------------------------------------------------------------------------------------
# Output files: what the reference says against what runs write


def test_simulate_outputs_match_the_reference(tmp_path):
    out = tmp_path / "run"
    argv = ["simulate", str(ROOT / "scenarios/poisson.yaml"), "--out", str(out)]
    argv += ["--set", "workload.duration_s=20", "--compare-baseline", "--json"]
    with contextlib.redirect_stdout(io.StringIO()):
        assert specsim(argv) == 0
    header = (out / "requests.csv").read_text(encoding="utf-8").splitlines()[0].split(",")
    assert header == list(docs.REQUEST_COLUMNS)
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert list(summary) == list(docs.SUMMARY_KEYS) + list(docs.BASELINE_KEYS)


def test_outputs_page_covers_the_commands_that_write_files():
    page = docs.reference_pages()["outputs.md"]
    for command in docs.COMMAND_OUTPUTS:
        assert (f"## `{command}`" in page) == (command in docs.command_names())
    for command in ("specsim plan window", "specsim report drafter-swap", "specsim validate"):
        assert command in docs.command_names()


def test_every_documented_output_file_is_named_in_the_code():
    """Catches a renamed output for the commands too slow to run here (validate, profile)."""
    docs_package = Path(docs.__file__).parent  # where the names are documented, not written
    source = "\n".join(
        p.read_text(encoding="utf-8")
        for p in (ROOT / "specsim").rglob("*.py")
        if docs_package not in p.parents
    )
    for command, files in docs.COMMAND_OUTPUTS.items():
        for name in files:
            if "*" in name or name == "FILE.yaml":
                continue
            # Some names are built from a stem (a table named "best_k" becomes best_k.csv).
            stem = name.rstrip("/").rsplit(".", 1)[0]
            written = name.rstrip("/") in source or f'"{stem}"' in source
            assert written, f"{command}: {name} is written nowhere"


def _documented_files_exist(out: Path, command: str) -> None:
    for name in docs.COMMAND_OUTPUTS[command]:
        if name.startswith("*"):
            assert list(out.glob(name)), f"{command}: no {name}"
        elif name.endswith("/"):
            assert (out / name).is_dir(), f"{command}: no {name}"
        else:
            assert (out / name).is_file(), f"{command}: no {name}"


@pytest.mark.slow
def test_plan_and_report_outputs_match_the_reference(tmp_path):
    """plan window and report drafter-swap run briefly; plan capacity (a bisection per
    candidate, slower) is covered by the name check above."""
    scenario = str(ROOT / "scenarios/poisson.yaml")
    short = ["--set", "workload.duration_s=10", "--workers", "1", "--no-progress", "--json"]
    runs = {
        "specsim plan window": ["plan", "window", scenario, "--k", "0,2", "--loads", "4"],
        "specsim report drafter-swap": [
            *("report", "drafter-swap", scenario, "--drafter", "llama3.2-1b"),
            *("--drafter", "ngram", "--k", "0,2", "--loads", "4"),
            *("--policies", "adaptive"),  # policies.csv, documented as written with it
        ],
    }
    for command, argv in runs.items():
        out = tmp_path / command.split()[-1]
        with contextlib.redirect_stdout(io.StringIO()):
            assert specsim([*argv, *short, "--out", str(out)]) == 0, command
        _documented_files_exist(out, command)


# ---------------------------------------------------------------------------------------------
# README


def readme_section(title: str) -> str:
    return _section(README, title)


def guide_page(name: str) -> str:
    return (GUIDE / name).read_text(encoding="utf-8")


def fenced_blocks(markdown: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", markdown, re.S | re.M)


def shell_commands(block: str) -> list[list[str]]:
    """Each command of a bash block as argv (continuations joined, comments dropped, leading
    environment settings such as ``OMP_NUM_THREADS=1`` dropped)."""
    joined = block.replace("\\\n", " ")
    commands = [shlex.split(line, comments=True) for line in joined.splitlines() if line.strip()]
    return [list(itertools.dropwhile(ENVIRONMENT.fullmatch, argv)) for argv in commands]


ENVIRONMENT = re.compile(r"[A-Z_][A-Z0-9_]*=\S*")


TOUR_SECTION = readme_section("Tour")
TOUR = [argv for block in fenced_blocks(TOUR_SECTION, "bash") for argv in shell_commands(block)]
GUIDE_COMMANDS = [
    argv
    for page in sorted(GUIDE.glob("*.md"))
    for block in fenced_blocks(page.read_text(encoding="utf-8"), "bash")
    for argv in shell_commands(block)
]


def ci_block(tag: str) -> str:
    """The block .ci/run extracts: the first fenced block after the line ``<!-- ci:TAG -->``."""
    lines = README.splitlines()
    start = lines.index(f"<!-- ci:{tag} -->")
    opening = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("```"))
    closing = next(i for i in range(opening + 1, len(lines)) if lines[i].startswith("```"))
    return "\n".join(lines[opening + 1 : closing])


def test_setup_section_holds_exactly_the_two_ci_commands():
    setup = readme_section("Set-up")
    assert len(fenced_blocks(setup, "bash")) == 2
    main, tests = ci_block("main"), ci_block("tests")
    assert main in setup and tests in setup
    assert "pip install -e ." in main and "torch" not in main
    assert main.endswith("specsim simulate scenarios/chat.yaml --out runs/chat")
    assert "torch==2.13.0" in tests and "'.[dev]'" in tests and tests.endswith("pytest -n 2")


def _path_values(argv: list[str]) -> list[tuple[str, str]]:
    """(option, path) for every input file an argv names; ``--set profile=`` resolved."""
    found = []
    for option, value in zip(["", *argv], argv, strict=False):
        if option == "--out":
            continue
        if option == "--set" and value.startswith("profile="):
            scenario = next(a for a in argv[2:] if a.endswith(".yaml"))
            found.append((option, str(Path(scenario).parent / value.split("=", 1)[1])))
            continue
        named = ("--drafter", "--draft-model", "--set")  # NAME=PATH
        candidate = value.split("=", 1)[-1] if option in named else value
        if candidate.endswith(INPUT_SUFFIXES):
            found.append((option, candidate))
    return found


def tour_problems(commands: list[list[str]], root: Path) -> list[str]:
    """What is wrong with a list of tour commands: parse errors and missing input files."""
    problems, written = [], []
    for argv in commands:
        if argv[0] != "specsim":
            problems.append(f"not a specsim command: {shlex.join(argv)}")
            continue
        try:
            with contextlib.redirect_stderr(io.StringIO()):
                args = build_parser().parse_args(argv[1:])
        except SystemExit:
            problems.append(f"does not parse: {shlex.join(argv)}")
            continue
        for option, path in _path_values(argv):
            resolved = Path(os.path.normpath(path))  # scenarios/../runs/x -> runs/x
            made_earlier = any(resolved.is_relative_to(w) for w in written)
            if not (root / resolved).exists() and not made_earlier:
                problems.append(f"{shlex.join(argv[:3])}: {option} {path} does not exist")
        if getattr(args, "out", None):
            written.append(Path(args.out))
    return problems


def test_tour_commands_parse_and_name_existing_files(monkeypatch):
    monkeypatch.chdir(ROOT)
    assert len(TOUR) >= 10
    assert tour_problems(TOUR, ROOT) == []
    covered = {argv[1] for argv in TOUR}
    assert {"profile", "simulate", "plan", "report", "check", "validate"} <= covered
    # One command per question: the tour stays a tour, the manual is the guide.
    assert len(TOUR_SECTION.strip().splitlines()) <= 60
    assert len(README.encode("utf-8")) <= 10 * 1024


def test_guide_commands_parse_and_name_existing_files(monkeypatch):
    """The guide's commands may read what the tour wrote (a profile in runs/)."""
    monkeypatch.chdir(ROOT)
    assert len(GUIDE_COMMANDS) >= 15
    assert tour_problems(TOUR + GUIDE_COMMANDS, ROOT) == []
    covered = {" ".join(argv[1:3]) for argv in GUIDE_COMMANDS}
    assert {"plan capacity", "plan window", "check sampler"} <= covered
    assert any(argv[1] == "validate" and "--bench" in argv for argv in GUIDE_COMMANDS)


def test_tour_checker_flags_planted_mistakes(monkeypatch):
    monkeypatch.chdir(ROOT)
    planted = [
        ["specsim", "simulate", "scenarios/no-such.yaml", "--out", "runs/x"],
        ["specsim", "simulate", "scenarios/chat.yaml", "--outt", "runs/x"],
        [
            *("specsim", "simulate", "scenarios/poisson.yaml", "--out", "runs/y"),
            *("--set", "profile=../runs/never-written.yaml"),
        ],
        ["python", "-m", "specsim"],
    ]
    problems = tour_problems(planted, ROOT)
    assert len(problems) == 4
    assert "scenarios/no-such.yaml does not exist" in problems[0]
    assert "does not parse" in problems[1]
    assert "never-written.yaml does not exist" in problems[2]


@pytest.mark.slow
def test_tour_quick_commands_run(tmp_path, monkeypatch):
    """Run the tour's simulate, profile and validate --bench commands exactly as written, in a
    fresh copy."""
    for name in ("profiles", "scenarios"):
        shutil.copytree(ROOT / name, tmp_path / name)
    monkeypatch.chdir(tmp_path)
    quick = [
        argv
        for argv in TOUR
        if argv[1] in ("simulate", "profile") or (argv[1] == "validate" and "--bench" in argv)
    ]
    assert len(quick) >= 6
    for argv in quick:
        # Measuring real models takes minutes; the tour shows rooflines and calibrations.
        assert argv[1] != "profile" or argv[2] in ("roofline", "calibrate", "from-bench")
        with contextlib.redirect_stdout(io.StringIO()):
            code = specsim(argv[1:])
        # A shipped example shows the tool working: validate --bench meets every threshold.
        assert code == 0, shlex.join(argv)
        out = Path(argv[argv.index("--out") + 1])
        assert out.exists()


def test_readme_transcripts_match_what_the_cli_prints(tmp_path, monkeypatch, capsys):
    """A ```text block opening with ``$ specsim ...`` shows that command's exact output."""
    for name in ("profiles", "scenarios"):
        (tmp_path / name).symlink_to(ROOT / name)
    monkeypatch.chdir(tmp_path)
    transcripts = [b for b in fenced_blocks(README, "text") if b.startswith("$ specsim ")]
    assert transcripts
    for block in transcripts:
        command, *expected = block.rstrip("\n").splitlines()
        argv = shlex.split(command[2:])
        code = specsim(argv[1:])
        captured = capsys.readouterr()
        assert (captured.out + captured.err).rstrip("\n").splitlines() == expected, command
        if any(": error: " in line for line in expected):
            assert code == 2
            out = Path(argv[argv.index("--out") + 1])
            assert not out.exists(), "nothing is written on bad input"


def test_guide_scenario_example_is_valid_and_runs(tmp_path):
    from specsim.scenario import load_scenario
    from specsim.simulation import run_simulation

    (block,) = fenced_blocks(guide_page("scenarios.md"), "yaml")
    (tmp_path / "scenarios").mkdir()
    (tmp_path / "profiles").symlink_to(ROOT / "profiles")
    path = tmp_path / "scenarios" / "mine.yaml"
    path.write_text(block, encoding="utf-8")
    scenario = load_scenario(path, ["workload.duration_s=20"])
    assert scenario.fleet.total_replicas == 2
    summary = run_simulation(scenario).summary
    assert summary["requests"] > 50 and summary["mean_acceptance_length"] > 1


def test_guide_profile_example_is_valid_and_drives_a_scenario(tmp_path):
    from specsim.profile import load_profile
    from specsim.scenario import load_scenario
    from specsim.simulation import run_simulation

    section = _section(guide_page("calibrate.md"), "By hand")
    (block,) = fenced_blocks(section, "yaml")
    (tmp_path / "profiles").mkdir()
    # A real folder, not a link: scenarios/../profiles must lead to the copy's profiles.
    shutil.copytree(ROOT / "scenarios", tmp_path / "scenarios")
    (tmp_path / "profiles" / "mine.yaml").write_text(block, encoding="utf-8")
    profile = load_profile(tmp_path / "profiles" / "mine.yaml")
    assert profile.profile.provenance.source == "published"
    (command,) = re.findall(r"`(specsim simulate [^`]+)`", " ".join(section.split()))
    argv = shlex.split(command)[2:]
    overrides = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
    assert "profile=../profiles/mine.yaml" in overrides
    scenario = load_scenario(tmp_path / argv[0], [*overrides, "workload.duration_s=20"])
    summary = run_simulation(scenario).summary
    assert summary["scenario"]["profile_name"] == "h100-published"
    assert summary["scenario"]["drafter"] == "ngram" and summary["mean_acceptance_length"] > 1


def local_links(markdown: str) -> list[str]:
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", markdown)
    return [link for link in links if not link.startswith(("http://", "https://"))]


def test_readme_links_resolve_and_attribution_is_kept():
    local = local_links(README)
    assert len(local) >= 10
    assert [link for link in local if not (ROOT / link).exists()] == []
    # The README is the front door to every guide page, and the guide's index lists them too.
    pages = sorted(p.name for p in GUIDE.glob("*.md") if p.name != "README.md")
    assert len(pages) >= 8
    assert [name for name in pages if f"docs/guide/{name}" not in local] == []
    index = local_links(guide_page("README.md"))
    assert [name for name in pages if name not in index] == []
    notebooks = sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))
    assert all(f"notebooks/{name}" in README for name in notebooks)
    data = readme_section("Data")
    for words in ("CC-BY 4.0", "Patel et al.", "Splitwise", "ISCA 2024", "SOURCE.md"):
        assert words in data


def test_guide_links_resolve():
    broken = [
        f"{page.name}: {link}"
        for page in sorted(GUIDE.glob("*.md"))
        for link in local_links(page.read_text(encoding="utf-8"))
        if not (page.parent / link).exists()
    ]
    assert broken == []
