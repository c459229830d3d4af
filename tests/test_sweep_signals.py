"""A sweep that is terminated or killed leaves no process behind (workers, forkserver, tracker).

The sweep runs as ``specsim plan window`` in its own session, so every process it starts shares
its process group, even once the sweep's process is gone and they are re-parented. Linux only
(the test reads /proc).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")

WORKERS = 2
STARTUP_S = 120.0  # generous: CI's two cores may be busy with other tests
GONE_WITHIN_S = 15.0


def _group(pgid: int) -> list[int]:
    """Live (not zombie) processes whose process group is ``pgid``."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # it exited while we looked
        # "pid (comm) state ppid pgrp ...": comm may hold spaces, so split after its ')'.
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


def _wait_for(condition, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


@pytest.fixture()
def running_sweep(repo, tmp_path):
    """A two-worker sweep whose points each take far longer than the test waits."""
    command = [
        sys.executable,
        "-m",
        "specsim",
        "plan",
        "window",
        str(repo / "scenarios" / "poisson.yaml"),
        "--k",
        "0,1",
        "--loads",
        "2",
        "--workers",
        str(WORKERS),
        "--set",
        "workload.duration_s=1000000",
        "--out",
        str(tmp_path / "sweep"),
    ]
    proc = subprocess.Popen(
        command,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
        text=True,
    )
    try:
        # The sweep's process, the resource tracker, the forkserver and the workers.
        started = _wait_for(lambda: len(_group(proc.pid)) >= 3 + WORKERS, STARTUP_S)
        assert started, f"the sweep did not start its workers: {_group(proc.pid)}"
        yield proc
    finally:
        for pid in _group(proc.pid):  # leave nothing behind even when the test fails
            os.kill(pid, signal.SIGKILL)
        proc.wait()


@pytest.mark.slow
def test_sigterm_ends_the_sweep_and_every_process_it_started(running_sweep, tmp_path):
    running_sweep.send_signal(signal.SIGTERM)
    assert running_sweep.wait(timeout=GONE_WITHIN_S) == 128 + signal.SIGTERM
    assert "terminated" in running_sweep.stderr.read()
    assert _wait_for(lambda: not _group(running_sweep.pid), GONE_WITHIN_S), _group(
        running_sweep.pid
    )
    assert not list(tmp_path.glob(".sweep.*.tmp"))


@pytest.mark.slow
def test_the_workers_of_a_killed_sweep_exit(running_sweep):
    running_sweep.send_signal(signal.SIGKILL)
    running_sweep.wait(timeout=GONE_WITHIN_S)
    assert _wait_for(lambda: not _group(running_sweep.pid), GONE_WITHIN_S), _group(
        running_sweep.pid
    )
