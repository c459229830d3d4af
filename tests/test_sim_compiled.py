"""The compiled kernels (numba, ``specsim/simulation/compiled.py``): where they run, their
acceptance stream, and their on-disk cache.

``JumpStream`` (PCG64 stepped and jumped in numba) must hand out what ``Generator.random``
gives and leave the generator where it would be. The simulator-level identity of the fast path
with the per-iteration reference is in ``test_sim_identity.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from specsim.scenario import Scenario
from specsim.simulation import compiled, compiled_serving, run_simulation
from specsim.simulation.compiled_stream import JumpStream
from specsim.simulation.replica import Replica

DATA = Path(__file__).parent / "data"
REPO = DATA.parent.parent


def test_the_kernels_are_compiled():
    """numba is a dependency: the kernels are numba dispatchers, not Python functions."""
    assert hasattr(compiled.kernels().pcg_random, "py_func")


def low_load_data() -> dict:
    return {
        "seed": 3,
        "profile": "sim_profile.yaml",
        "workload": {
            "kind": "poisson",
            "rate": 2.0,
            "requests": 120,
            "prompt": {"dist": "uniform", "low": 20, "high": 300},
            "output": {"dist": "uniform", "low": 1, "high": 200},
        },
        "engine": {"max_batch": 16},
        "speculation": {"drafter": "c05", "k": 3},
    }


def low_load() -> Scenario:
    return Scenario.model_validate(low_load_data()).with_source(DATA / "scenario.yaml")


def counting(monkeypatch) -> dict[str, int]:
    """Calls of the compiled loops, counted."""
    calls = {"loops": 0}

    def counted(name, function):
        def wrapper(*args):
            calls[name] += 1
            return function(*args)

        return wrapper

    serving = compiled_serving._serving_kernel()
    monkeypatch.setattr(serving, "serving_loop", counted("loops", serving.serving_loop))
    return calls


@pytest.mark.parametrize("policy", ["fixed", "adaptive"])
def test_a_lone_replica_runs_the_serving_loop(policy, monkeypatch):
    """A replica alone on its arrivals runs its iterations in the compiled serving loop."""
    calls = counting(monkeypatch)
    scenario = low_load()
    scenario.speculation.policy = policy
    run_simulation(scenario, fast_path=True)
    assert calls["loops"] >= 5, calls


def test_the_reference_path_never_takes_the_kernels(monkeypatch):
    calls = counting(monkeypatch)
    made = []
    init = Replica.__init__

    def keep(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(Replica, "__init__", keep)
    run_simulation(low_load(), fast_path=False)
    assert made and not any(replica.fast for replica in made)
    assert not any(isinstance(replica._draws, JumpStream) for replica in made)
    assert calls == {"loops": 0}


def generator_words(rng: np.random.Generator) -> tuple:
    state = rng.bit_generator.state
    return state["state"]["state"], state["state"]["inc"], state["has_uint32"], state["uinteger"]


@pytest.mark.parametrize("seed", range(12))
def test_jump_stream_gives_the_sequential_draws(seed):
    """Random mixes of takes (runs of them, which grow the block drawn ahead), skips (draws made
    elsewhere, jumped over) and integer draws, 60 operations per seed, 12 seeds, against plain
    ``Generator`` calls; the generator's whole state (with numpy's buffered 32-bit half-draw,
    which integer draws of a small range set) matches after every integer draw."""
    plain, stream = np.random.default_rng(seed), JumpStream(np.random.default_rng(seed))
    choose = np.random.default_rng(1000 + seed)
    for _ in range(60):
        op = int(choose.integers(0, 3))
        if op == 0:
            size = int(choose.integers(1, 10))
            dtype = np.int64 if choose.random() < 0.5 else np.int32  # int32: half-draws
            expected = plain.integers(0, 64, size=size, dtype=dtype)
            got = stream.integers(0, 64, size=size, dtype=dtype)
            assert generator_words(stream.rng) == generator_words(plain)
        elif op == 1:
            n = int(choose.integers(0, 600))
            expected, got = plain.random(n), stream.random(n).copy()
        else:
            n = int(choose.integers(0, 5000))
            plain.random(n)
            stream.skip(n)
            expected, got = plain.random(3), stream.random(3).copy()
        assert expected.tobytes() == got.tobytes()
    assert plain.random((3, 7)).tobytes() == stream.random((3, 7)).tobytes()


def test_the_compiled_pcg64_advances_as_numpy_does():
    """One jump of 2^40 + 12,345 draws and 10,000 single steps, against ``PCG64.advance`` and
    ``Generator.random``."""
    rng = np.random.default_rng(42)
    stream = JumpStream(np.random.default_rng(42))
    delta = (1 << 40) + 12_345
    rng.bit_generator.advance(delta)
    stream.position = delta
    assert stream.random(10_000).tobytes() == rng.random(10_000).tobytes()


COMPILE_COUNT = """
import hashlib, json, os, sys
import specsim
from specsim.simulation import compiled
result = specsim.simulate("scenarios/poisson.yaml", workload__duration_s=30)
counts = {"hits": 0, "misses": 0}
for name in compiled.KERNEL_MODULES:
    for value in vars(compiled.kernel_module(name)).values():
        if hasattr(value, "stats"):
            counts["hits"] += sum(value.stats.cache_hits.values())
            counts["misses"] += sum(value.stats.cache_misses.values())
counts["csv"] = hashlib.sha256(result.requests.to_csv().encode()).hexdigest()
print(json.dumps(counts))
"""


def test_the_kernels_compile_once_per_machine(tmp_path):
    """A second process loads every kernel from numba's on-disk cache (no miss: nothing
    compiled) and gives the same records as the first, which compiled them."""
    env = {**os.environ, "SPECSIM_CACHE_DIR": str(tmp_path)}
    runs = []
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "-c", COMPILE_COUNT], cwd=REPO, env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr[-2000:]
        runs.append(json.loads(done.stdout.splitlines()[-1]))
    first, second = runs
    assert first["misses"] > 0 and first["hits"] == 0
    assert second["misses"] == 0 and second["hits"] > 0  # the kernels Python calls, loaded
    assert second["csv"] == first["csv"]
    (folder,) = tmp_path.iterdir()
    assert folder.name == compiled.cache_folder().name


def test_an_edit_to_any_kernel_source_moves_the_cache_folder(monkeypatch, tmp_path):
    """numba checks only a kernel's own file; the folder's name covers every compiled source
    (a constant in ``compiled_layout.py`` is compiled into the kernels that use it): every
    kernel module, the layout and the cost formula."""
    monkeypatch.setenv("SPECSIM_CACHE_DIR", str(tmp_path))
    folder = compiled.cache_folder()
    assert folder.parent == tmp_path and folder.name.startswith("numba-")
    read = Path.read_bytes
    names = [f"{module}.py" for module in compiled.KERNEL_MODULES]
    for name in ("compiled_layout.py", "formula.py", *names):
        edited = lambda path, name=name: read(path) + (b"#" if path.name == name else b"")  # noqa: E731
        monkeypatch.setattr(Path, "read_bytes", edited)
        assert compiled.cache_folder() != folder
        monkeypatch.setattr(Path, "read_bytes", read)
    assert compiled.cache_folder() == folder


def test_a_cache_folder_that_cannot_be_made_falls_back_to_a_temporary_one(tmp_path):
    """A home that cannot be written (here: a file where the folder would go) still runs: the
    kernels then compile into a temporary folder, once per process."""
    blocked = tmp_path / "file"
    blocked.write_text("")
    fallback = compiled.writable(blocked / "specsim")
    assert fallback.is_dir() and not fallback.is_relative_to(tmp_path)
    assert compiled.writable(tmp_path / "made") == tmp_path / "made"


# The kernels' one source, run by Python with numba's JIT off (``NUMBA_DISABLE_JIT``): a lone
# replica, a fleet behind a router, and a split fleet's two pools, each written to disk.
INTERPRETED = {
    "lone": {"workload": {"rate": 3.0, "requests": 150}, "speculation": {"policy": "adaptive"}},
    "fleet": {
        "fleet": {"replicas": 4, "router": "least_outstanding"},
        "workload": {"rate": 12.0, "requests": 240},
    },
    "split": {
        "fleet": {
            "disaggregation": {
                "prefill": {"replicas": 1},
                "decode": {"replicas": 2},
                "kv_transfer": {"bandwidth_bytes_per_s": 1.0e9, "latency_s": 0.001},
            }
        },
        "workload": {"rate": 10.0, "requests": 150},
    },
}
RUN_ALL = """
import sys
from specsim.cli import main
from specsim.simulation import compiled
compiled_kernels = hasattr(compiled.kernels().pcg_random, "py_func")
assert compiled_kernels == (sys.argv[1] == "compiled"), compiled_kernels
for path in sys.argv[3:]:
    assert main(["simulate", path, "--out", f"{sys.argv[2]}/{path.rsplit('/', 1)[1]}"]) == 0
"""


def test_the_kernels_source_run_interpreted_gives_the_compiled_bytes(tmp_path):
    """numba compiles the kernels' Python source; with its JIT off Python runs that source and
    must give every output byte for byte and warn nothing (PCG64's 64-bit products wrap on
    purpose). Fails if the source leans on numba's typing, e.g. a product taken in Python
    ints, which never wrap."""
    paths = []
    for name, changes in INTERPRETED.items():
        data = low_load_data() | {"profile": str(DATA / "sim_profile.yaml")}
        for section, values in changes.items():
            data[section] = {**data.get(section, {}), **values}
        paths.append(tmp_path / f"{name}.yaml")
        paths[-1].write_text(yaml.safe_dump(data))
    runs = {}
    for mode in ("compiled", "interpreted"):
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        env.pop("NUMBA_DISABLE_JIT", None)
        if mode == "interpreted":
            env["NUMBA_DISABLE_JIT"] = "1"
        command = [sys.executable, "-c", RUN_ALL, mode, str(tmp_path / mode), *map(str, paths)]
        runs[mode] = subprocess.run(command, env=env, capture_output=True, text=True, cwd=tmp_path)
        assert runs[mode].returncode == 0, runs[mode].stderr[-2000:]
    assert "warning" not in runs["interpreted"].stderr
    for path in paths:
        for output in ("requests.csv", "summary.json"):
            compiled_bytes = (tmp_path / "compiled" / path.name / output).read_bytes()
            assert (tmp_path / "interpreted" / path.name / output).read_bytes() == compiled_bytes
