"""Output safety: unusable --out paths fail first, file modes follow the umask, staging folders
of killed runs are reaped (and a live run's are not)."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from specsim.cli import main
from specsim.fileio import atomic_output_dir, remove_stale_staging, write_text_atomic

# Every subcommand that takes --out, with arguments that would fail *after* the --out check
# (missing input files), so an --out error shows the check comes before any work.
OUT_COMMANDS = {
    "simulate": ["simulate", "missing.yaml"],
    "plan window": ["plan", "window", "missing.yaml"],
    "plan capacity": ["plan", "capacity", "missing.yaml", "--target-rps", "5"],
    "report drafter-swap": ["report", "drafter-swap", "missing.yaml", "--drafter", "a"],
    "profile (folder)": ["profile", "roofline", "--hardware", "missing.yaml", "--target", "x.json"],
    "validate": ["validate", "missing.yaml"],
    "check sampler": ["check", "sampler"],
    "check rollout": ["check", "rollout", "--baseline", "missing", "--candidate", "missing"],
}


def _can_write_in(folder: Path) -> bool:
    try:
        (folder / "probe").mkdir()
    except OSError:
        return False
    (folder / "probe").rmdir()
    return True


@pytest.fixture()
def unwritable(tmp_path) -> Path:
    """A folder this process cannot create anything in.

    A read-only folder does that for an ordinary user; root ignores the mode bits, and then
    /sys (sysfs refuses new entries to everyone) stands in.
    """
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    if not _can_write_in(folder):
        yield folder
    elif Path("/sys").is_dir() and not _can_write_in(Path("/sys")):
        yield Path("/sys")
    else:
        raise AssertionError("found no folder this process cannot write in")
    folder.chmod(0o755)


@pytest.mark.parametrize("where", ["under a file", "in an unwritable folder"])
@pytest.mark.parametrize("name", list(OUT_COMMANDS))
def test_an_unusable_out_is_a_one_line_error_before_any_work(
    name, where, tmp_path, unwritable, capsys
):
    if where == "under a file":
        (tmp_path / "a-file").write_text("x")
        blocked, out = tmp_path / "a-file", tmp_path / "a-file" / "run"
        expected = "is a file"
    else:
        blocked, out = unwritable, unwritable / "run"
        expected = "cannot write in"
    before = sorted(tmp_path.rglob("*"))
    assert main([*OUT_COMMANDS[name], "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert str(out) in err and str(blocked) in err and expected in err and "fix:" in err
    assert sorted(tmp_path.rglob("*")) == before  # nothing made, nothing left


def test_profile_out_file_under_a_file_or_naming_a_folder(tmp_path, capsys):
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "taken.yaml").mkdir()
    cases = {
        tmp_path / "a-file" / "p.yaml": "is a file",
        tmp_path / "taken.yaml": "output file is an existing folder",
    }
    for out, expected in cases.items():
        argv = ["profile", "roofline", "--hardware", "missing.yaml", "--target", "missing.json"]
        assert main([*argv, "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and str(out) in err and expected in err


@pytest.fixture()
def umask_027():
    old = os.umask(0o027)
    yield 0o027
    os.umask(old)


def test_written_files_and_folders_follow_the_umask(tmp_path, umask_027):
    write_text_atomic(tmp_path / "new" / "summary.json", "{}")
    with atomic_output_dir(tmp_path / "out") as staging:
        write_text_atomic(staging / "sub" / "a.json", "{}")
        (staging / "b.csv").write_text("x\n")
    modes = {
        path.relative_to(tmp_path).as_posix(): stat.S_IMODE(path.stat().st_mode)
        for path in tmp_path.rglob("*")
    }
    assert modes == {
        "new": 0o750,
        "new/summary.json": 0o640,
        "out": 0o750,
        "out/sub": 0o750,
        "out/sub/a.json": 0o640,
        "out/b.csv": 0o640,
    }


def test_a_simulation_writes_its_files_with_the_umask_mode(repo, tmp_path, umask_027):
    scenario = repo / "scenarios" / "poisson.yaml"
    out = tmp_path / "run"
    argv = ["simulate", str(scenario), "--out", str(out), "--set", "workload.duration_s=5"]
    assert main(argv) == 0
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()} == {
        "requests.csv": 0o640,
        "summary.json": 0o640,
    }


# A process that stages into OUT and then stops: killed (SIGKILL) or waiting for a line.
STAGER = textwrap.dedent(
    """
    import os, signal, sys
    from specsim.fileio import atomic_output_dir
    with atomic_output_dir(sys.argv[1]) as staging:
        (staging / "partial.csv").write_text("half")
        print(staging, flush=True)
        if sys.argv[2] == "die":
            os.kill(os.getpid(), signal.SIGKILL)
        sys.stdin.readline()
    """
)


def _stage(out: Path, how: str) -> tuple[subprocess.Popen, Path]:
    proc = subprocess.Popen(
        [sys.executable, "-c", STAGER, str(out), how],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    staging = Path(proc.stdout.readline().strip())
    assert staging.is_dir() and staging.parent == out.parent
    return proc, staging


def test_a_killed_runs_staging_is_removed_by_the_next_run_and_a_live_ones_kept(tmp_path):
    out = tmp_path / "out"
    dead, dead_staging = _stage(out, "die")
    assert dead.wait(timeout=60) == -signal.SIGKILL
    assert dead_staging.is_dir()  # what a killed run leaves
    live, live_staging = _stage(out, "wait")
    try:
        with atomic_output_dir(out) as staging:
            (staging / "summary.json").write_text("{}")
        assert not dead_staging.exists()
        assert live_staging.is_dir() and (live_staging / "partial.csv").read_text() == "half"
        assert remove_stale_staging(out) == []  # the live run's lock is held
    finally:
        live.communicate("go\n", timeout=60)
    assert live.returncode == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert sorted(p.name for p in out.iterdir()) == ["partial.csv", "summary.json"]


def test_a_sigterm_that_lands_in_a_finalizer_still_ends_the_run(repo, tmp_path):
    """Python drops an exception raised in a finalizer (``__del__``): a SIGTERM delivered there
    would let the run go on. The command is stopped anyway, with SIGTERM's exit code."""
    script = textwrap.dedent(
        f"""
        import os, signal, sys, time
        from specsim import cli

        class Finalised:
            def __del__(self):
                os.kill(os.getpid(), signal.SIGTERM)  # its handler runs in this finalizer
                sum(range(10_000))

        def long_run(args):  # in place of the check before the work: then a 20 s run
            Finalised()
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                pass
            sys.exit("the SIGTERM was lost")

        cli.check_out = long_run
        sys.exit(cli.main(["simulate", {str(repo / "scenarios" / "poisson.yaml")!r},
                           "--out", {str(tmp_path / "run")!r}]))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=repo
    )
    assert done.returncode == 128 + signal.SIGTERM, done.stderr
    assert "specsim simulate: terminated" in done.stderr
    assert not (tmp_path / "run").exists()


def test_sigterm_during_simulate_leaves_no_staging_folder(repo, tmp_path):
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "specsim",
            "simulate",
            str(repo / "scenarios" / "poisson.yaml"),
            "--out",
            str(out),
            "--set",
            "workload.duration_s=1000000",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not list(tmp_path.glob(".run.*.tmp/requests.csv")) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert list(tmp_path.glob(".run.*.tmp")), "simulate did not start staging"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        proc.kill()
        proc.wait()
    assert "terminated" in proc.stderr.read()
    assert list(tmp_path.iterdir()) == []
