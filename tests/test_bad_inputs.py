"""Bad input over every subcommand: one clean line, exit 2, nothing written.

The cases are generated from the schemas and the parsers (``bad_input_corpus``): a key or an
option added later is covered by them, and the tests below fail when it has no place in the base
inputs (``bad_input_bases``) or, for a text option, no class in ``STRING_OPTIONS``. Cases run in
this process through ``specsim.cli.main``; a few run as subprocesses to show that the process
itself prints no traceback.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from bad_input_bases import BASE_COMMANDS, PROFILE, QUICK, SCENARIO, dump, write_base
from bad_input_corpus import (
    FOLDER,
    STRING_OPTIONS,
    Case,
    all_cases,
    commands,
    option_bounds,
    option_name,
    walk_schema,
)

from specsim.cli import main

CASES = all_cases()
# A case should fail in validation within milliseconds; one that runs this long is doing the
# work it should have refused (a hang guard, not a timing assertion).
HANG_GUARD_S = 120


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("bad-input-base")
    write_base(folder)
    return folder


class Hung(Exception):
    pass


class ModelLoaded(Exception):
    pass


def refuse_model_load(*args, **kwargs):
    raise ModelLoaded("a model loaded: the input was not refused before the work")


@contextlib.contextmanager
def hang_guard(seconds: float):
    def stop(signum, frame):
        raise Hung(f"still running after {seconds:g} s: the input was not refused up front")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def prepare(case: Case, base: Path, folder: Path) -> list[str]:
    """A copy of the base inputs with the case's files applied; its command line."""
    shutil.copytree(base, folder)
    for name, content in case.files:
        path = folder / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
        if content is None:
            continue
        if content is FOLDER:
            path.mkdir()
        elif isinstance(content, bytes):
            path.write_bytes(content)
        elif isinstance(content, str):
            path.write_text(content, encoding="utf-8")
        else:
            shutil.copy(base / name, path)
            content(path)
    return [arg.replace("{d}", str(folder)) for arg in case.argv]


def listing(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*")}


def problems(case: Case, code, err: str, folder: Path, before: dict[str, int]) -> list[str]:
    """What is unclean about an outcome (empty when it is clean)."""
    found = []
    lines = err.splitlines()
    if code != 2:
        found.append(f"exit code {code!r}, not 2")
    if len(lines) != 1:
        found.append(f"{len(lines)} lines on stderr, not 1")
    elif "fix:" not in lines[0]:
        found.append("the error line names no fix")
    else:
        for alternatives in case.names:
            names = [a.replace("{d}/", "") for a in alternatives]
            if not any(n in lines[0] for n in names):
                found.append(f"the error line does not name {' or '.join(names)}")
    after = listing(folder)
    written = sorted(k for k in after if before.get(k) != after[k])
    if written:
        found.append(f"wrote {written[:3]}")
    return found


def run_case(case: Case, base: Path, folder: Path, capsys) -> list[str]:
    argv = prepare(case, base, folder)
    before = listing(folder)
    capsys.readouterr()
    try:
        with hang_guard(HANG_GUARD_S):
            code = main(argv)
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    except Exception as exc:  # a traceback in a real run
        err = capsys.readouterr().err
        return [f"raised {type(exc).__name__}: {str(exc)[:200]}"] + ([err[-300:]] if err else [])
    err = capsys.readouterr().err
    found = problems(case, code, err, folder, before)
    return found + ([f"stderr: {err.strip()[-400:]}"] if found else [])


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_refused_cleanly(case, base_dir, tmp_path, capsys, monkeypatch):
    # Profiling and validation load models first of all their work: none may load.
    monkeypatch.setattr("specsim.models.load_model", refuse_model_load)
    found = run_case(case, base_dir, tmp_path / "case", capsys)
    assert not found, "; ".join(found)


# -- the corpus's own guarantees ----------------------------------------------------------------


@pytest.mark.parametrize("command", QUICK)
def test_base_commands_succeed(command, base_dir, tmp_path, capsys):
    """Every case spoils one thing of a command that works: the base inputs are valid."""
    folder = tmp_path / "case"
    argv = prepare(Case("base", tuple(BASE_COMMANDS[command])), base_dir, folder)
    # validate's exit 1 is its verdict (a figure beyond its threshold), not a refusal: the base
    # benchmark run's figures are round numbers, not the base profile's prediction.
    assert main(argv) == (1 if command == "validate bench" else 0), capsys.readouterr().err
    assert "warning" not in capsys.readouterr().err


def test_the_disaggregated_base_succeeds(base_dir, tmp_path, capsys):
    """The split fleet's cases spoil one thing of a scenario that runs."""
    from bad_input_bases import DISAGG_SCENARIO

    files = (("scenario.yaml", dump(DISAGG_SCENARIO)),)
    argv = prepare(Case("base", tuple(BASE_COMMANDS["simulate"]), files), base_dir, tmp_path / "c")
    assert main(argv) == 0, capsys.readouterr().err


def test_base_inputs_have_room_for_every_schema_key():
    """A section the base documents lack would leave its keys out of the corpus."""
    from bad_input_bases import ACCEPTANCE_FILE, ADAPTIVE_STEPS, DISAGGREGATION, HARDWARE

    from specsim.fleet_settings import Disaggregation
    from specsim.hardware import HardwareSpec
    from specsim.policy_settings import AdaptiveSteps
    from specsim.profile.acceptance import Acceptance
    from specsim.profile.schema import Profile
    from specsim.scenario import Scenario

    # A split fleet refuses pools, and adaptive steps are a policy of their own: their keys are
    # walked in bases of their own.
    walk = walk_schema(Scenario, SCENARIO)
    assert walk.uncovered == [
        "speculation.adaptive_steps",
        "fleet.pools[0].speculation.adaptive_steps",
        "fleet.disaggregation",
    ]
    for model, doc in (
        (AdaptiveSteps, ADAPTIVE_STEPS),
        (Disaggregation, DISAGGREGATION),
        (Profile, PROFILE),
        (HardwareSpec, HARDWARE),
        (Acceptance, ACCEPTANCE_FILE["acceptance"][0]),
    ):
        walk = walk_schema(model, doc)
        assert walk.uncovered == [], f"add these sections to bad_input_bases: {walk.uncovered}"
        assert walk.leaves


def test_every_option_is_covered():
    """Each option of each command is numeric (bounded), a choice, a flag or a classified
    text option, and every command has a base command line."""
    for command, parser in commands().items():
        assert any(b == command or b.startswith(f"{command} ") for b in BASE_COMMANDS), command
        for action in parser._actions:
            if action.nargs == 0 or action.choices or option_bounds(action) is not None:
                continue
            name = option_name(action)
            assert name in STRING_OPTIONS, f"{command}: classify {name} in STRING_OPTIONS"


# -- at the process level ------------------------------------------------------------------------

SUBPROCESS_CASES = [
    "scenario:slo.ttft_s=inf",
    "profile:target.latency.fit.fixed_s=huge",
    "profile measure:--repeats=below",
    "validate:--profile-budget=nan",
    "rollout-csv:output_tokens=below",
    "model-json:hidden_size=nan",
]


@pytest.mark.parametrize("case_id", SUBPROCESS_CASES)
def test_no_traceback_from_the_process(case_id, base_dir, tmp_path):
    (case,) = [c for c in CASES if c.id == case_id]
    folder = tmp_path / "case"
    argv = prepare(case, base_dir, folder)
    before = listing(folder)
    proc = subprocess.run(
        [sys.executable, "-m", "specsim", *argv],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )
    assert "Traceback" not in proc.stderr
    assert not problems(case, proc.returncode, proc.stderr, folder, before), proc.stderr


def test_model_family_bases_are_accepted():
    """The family configs the corpus spoils are valid: the loader and the roofline read them."""
    from bad_input_models import LOADER_BASES, ROOFLINE_BASES

    from specsim.models import ModelConfig
    from specsim.profiling.model_configs import shape_from_config

    for family, doc in LOADER_BASES.items():
        assert ModelConfig.from_hf_dict(doc, f"{family}.json").model_type == family
    for family, doc in ROOFLINE_BASES.items():
        assert shape_from_config(doc, family).num_experts > 0
