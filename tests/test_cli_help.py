"""The help of every command follows one set of rules, walked over the whole parser tree: one
placeholder per kind of value, no literal values as placeholders, help lines that are phrases
naming only their own command's options, descriptions without broken lines."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys

import pytest

from specsim.cli import build_parser
from specsim.cli import main as specsim
from specsim.docs.cli import hidden

# Each kind of value has one placeholder; a compound one (NAME=MODEL) is built from them.
PLACEHOLDERS = {
    "ADDRESS": "a cluster scheduler's address",
    "AXIS": "a timing-grid axis",
    "CONFIG": "a model's config.json",
    "DEVICE": "a torch device",
    "DIR": "a folder",
    "DTYPE": "a number format",
    "ENGINES": "serving engines, comma-separated",
    "FILE": "a file",
    "FRACTION": "a share, a level or a probability",
    "FUNCTION": "a Python function",
    "HW": "a hardware spec YAML",
    "K": "a window size, or a list of them",
    "KEY": "a key",
    "KIND": "a named kind",
    "L": "a mean acceptance length",
    "LOAD": "a load level",
    "MODEL": "a model: a folder, a config.json or a built-in name",
    "MODULE": "a Python module or file",
    "N": "a whole number, or a list of them",
    "NAME": "a name",
    "PATH": "a path or a Hugging Face id",
    "PEM": "a PEM file",
    "PROFILE": "a profile YAML",
    "R": "a draft acceptance rate",
    "RATE": "requests per second",
    "TEXT": "free text, kept as given",
    "RESULT": "a benchmark result file",
    "RUN": "an engine run's folder",
    "SCENARIO": "a scenario YAML",
    "SCRAPE": "a /metrics scrape",
    "SECONDS": "a duration",
    "SEED": "a random seed",
    "SHAPE": "a tree shape",
    "T": "a sampling temperature",
    "VALUE": "a value",
}
# Options that name the same thing in every command take the same placeholder everywhere.
SAME_EVERYWHERE = ("--profile", "--seed", "--temperature", "--k", "--workers", "--tree", "--set")
# Engines' own flags, which help lines quote when saying what an option corresponds to.
ENGINE_FLAGS = {
    "--max-num-seqs",
    "--max-num-batched-tokens",
    "--save-result",
    "--speculative-num-steps",
    "--speculative-eagle-topk",
    "--speculative-num-draft-tokens",
    "--max-running-requests",
    "--chunked-prefill-size",
    "--enable-mixed-chunk",
}


def commands() -> list[tuple[str, argparse.ArgumentParser]]:
    """Every command line with its parser, ``specsim`` and ``specsim plan window`` alike."""
    found = []

    def walk(parser: argparse.ArgumentParser, prog: str) -> None:
        found.append((prog, parser))
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, f"{prog} {name}")

    walk(build_parser(), "specsim")
    return found


def shown_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [
        a
        for a in parser._actions
        if not hidden(a) and not isinstance(a, argparse._VersionAction | argparse._SubParsersAction)
    ]


def placeholder(action: argparse.Action) -> str | None:
    """What ``--help`` shows for the value, or None: a flag, or a choice listing its values."""
    if action.option_strings and action.nargs == 0:
        return None
    if action.metavar is None and action.choices is not None:
        return None
    return action.metavar if action.metavar is not None else action.dest.upper()


def placeholder_problems(prog: str, parser: argparse.ArgumentParser) -> list[str]:
    problems = []
    for action in shown_actions(parser):
        shown = placeholder(action)
        if shown is None:
            continue
        words = [w for w in re.split(r"[^A-Za-z0-9_]+", shown) if w]
        unknown = [w for w in words if w not in PLACEHOLDERS]
        if unknown or not words:
            name = "/".join(action.option_strings) or action.dest
            problems.append(f"{prog} {name}: {shown} ({', '.join(unknown) or 'empty'})")
    return problems


def help_problems(prog: str, parser: argparse.ArgumentParser) -> list[str]:
    own = {s for a in parser._actions for s in a.option_strings}
    problems = []
    for action in shown_actions(parser):
        name = "/".join(action.option_strings) or action.dest
        text = action.help or ""
        if not text.strip() or text.rstrip().endswith("."):
            problems.append(f"{prog} {name}: help is not a phrase: {text!r}")
        for option in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", text):
            if option not in own and option not in ENGINE_FLAGS:
                problems.append(f"{prog} {name}: help names {option}, not an option of {prog}")
    return problems


def description_problems(prog: str, parser: argparse.ArgumentParser) -> list[str]:
    """A line cut short inside a paragraph ("Results are" and the rest on the next line), or a
    run of spaces where a backslash joined two lines of an example."""
    problems = []
    lines = (parser.description or "").splitlines()
    for line, after in zip(lines, [*lines[1:], ""], strict=True):
        prose = line and not line.startswith(" ") and after and not after.startswith(" ")
        if prose and len(line) < 40 and not line.endswith((".", ":")):
            problems.append(f"{prog}: broken line {line!r}")
        if re.search(r"\S {4,}[^\s#]", line):  # aligned "# comments" are fine
            problems.append(f"{prog}: a gap inside {line.strip()!r}")
    return problems


def test_every_placeholder_is_one_of_the_kinds():
    problems = [p for prog, parser in commands() for p in placeholder_problems(prog, parser)]
    assert problems == []


def test_help_lines_are_phrases_naming_only_their_own_commands_options():
    problems = [p for prog, parser in commands() for p in help_problems(prog, parser)]
    assert problems == []


def test_descriptions_have_no_broken_lines():
    problems = [p for prog, parser in commands() for p in description_problems(prog, parser)]
    assert problems == []


def test_an_option_takes_the_same_placeholder_in_every_command():
    seen: dict[str, set[str]] = {}
    for _, parser in commands():
        for action in shown_actions(parser):
            for option in set(action.option_strings) & set(SAME_EVERYWHERE):
                seen.setdefault(option, set()).add(str(placeholder(action)))
    assert {o: s for o, s in seen.items() if len(s) > 1} == {}
    assert set(seen) == set(SAME_EVERYWHERE)


def test_the_rules_catch_planted_mistakes():
    parser = argparse.ArgumentParser(prog="specsim demo")
    parser.add_argument("scenario")  # SCENARIO by its dest: allowed
    parser.add_argument("--draft-tp", metavar="1", help="draft models on one device")
    parser.add_argument("--hardware", metavar="HW.yaml", help="hardware spec")
    parser.add_argument("--vocab", type=int, help="toy vocabulary size.")
    parser.add_argument("--emit", help="engine files (with --disaggregated: each pool's)")
    parser.add_argument("--max-batch", help="vLLM --max-num-seqs")
    parser.description = "Sweeps run on a pool.\nResults are\nkept per simulation, resumably.\n"
    parser.description += "  specsim x --clock reference       --out runs/v1\n"
    assert placeholder_problems("demo", parser) == [
        "demo --draft-tp: 1 (1)",
        "demo --hardware: HW.yaml (yaml)",
        "demo --vocab: VOCAB (VOCAB)",
        "demo --emit: EMIT (EMIT)",
        "demo --max-batch: MAX_BATCH (MAX_BATCH)",
    ]
    problems = help_problems("demo", parser)
    assert len(problems) == 3
    assert "demo scenario: help is not a phrase" in problems[0]
    assert "toy vocabulary size." in problems[1]
    assert problems[2].endswith("help names --disaggregated, not an option of demo")
    assert description_problems("demo", parser) == [
        "demo: broken line 'Results are'",
        "demo: a gap inside 'specsim x --clock reference       --out runs/v1'",
    ]


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (["--roofline", "--hardware", "h.yaml"], "specsim profile roofline"),
        (["--from-bench", "a.json", "--into", "p.yaml"], "specsim profile from-bench RESULT..."),
        (["--calibrate", "metrics.txt"], "specsim profile calibrate SCRAPE"),
        (["--target", "specsim-target", "--out", "p.yaml"], "specsim profile measure --target"),
    ],
)
def test_an_old_profile_spelling_names_its_sub_command(old, new, capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_:
        specsim(["profile", *old])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"fix: write {new}" in err
    assert list(tmp_path.iterdir()) == []


def test_each_profile_sub_command_takes_only_its_own_options(capsys):
    required = {
        "measure": ["--target", "specsim-target"],
        "roofline": ["--hardware", "h.yaml", "--target", "c.json"],
        "from-bench": ["a.json", "--into", "p.yaml"],
        "calibrate": ["m.txt", "--into", "p.yaml", "--drafter", "d", "--verifier", "greedy"],
    }
    required["calibrate"] += ["--temperature", "0"]
    foreign = {"measure": "--tp", "roofline": "--device", "from-bench": "--label"}
    foreign["calibrate"] = "--no-held-out"
    for mode, argv in required.items():
        argv = ["profile", mode, *argv, "--out", "p.yaml"]
        build_parser().parse_args(argv)
        with pytest.raises(SystemExit) as exit_:
            build_parser().parse_args([*argv, foreign[mode], "1"])
        assert exit_.value.code == 2
        assert f"unrecognized arguments: {foreign[mode]}" in capsys.readouterr().err


def test_a_run_imports_only_its_own_command(tmp_path):
    """``specsim plan ...`` builds the plan command's options alone: the other commands' modules
    (the profiler's, the checker's) stay unimported, and the top-level help is the same."""
    argv = ["plan", "window", "missing.yaml", "--out", str(tmp_path / "out")]
    code = (
        "import sys\n"
        "from specsim.cli import main\n"
        f"assert main({argv!r}) == 2\n"
        "print(sorted(m for m in sys.modules if m.startswith('specsim.cli.')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split("\n")[0]
    assert out == "['specsim.cli.common', 'specsim.cli.plan', 'specsim.cli.plan_options']"
    assert build_parser("plan").format_help() == build_parser().format_help()
