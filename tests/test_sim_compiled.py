"""The compiled kernels (numba, ``specsim/simulation/compiled.py``): where they run, their
acceptance stream, and their on-disk cache.

``JumpStream`` (PCG64 stepped and jumped in numba) must hand out what ``Generator.random``
gives and leave the generator where it would be; a stretch's rows with the uniforms drawn in
the kernel equal those from uniforms handed in. The simulator-level identity of the fast path
with the per-iteration reference is in ``test_sim_stretch.py``.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from specsim.scenario import Scenario
from specsim.simulation import compiled, compiled_loop, compiled_serving, run_simulation, stretch
from specsim.simulation.compiled_stream import JumpStream
from specsim.simulation.replica import Replica

DATA = Path(__file__).parent / "data"
REPO = DATA.parent.parent
FIELDS = (
    "n rows left drafts accepted contexts done totals new own_span kv pairs".split()  # noqa: SIM905
)


def tables(rng: np.random.Generator, levels: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Flat acceptance tables built as ``RateAcceptance`` builds them."""
    rows = [np.sort(rng.random(k)) + 2.0 * level for level in range(levels)]
    sentinels = [[2.0 * level + 1.5] for level in range(levels)]
    flat = np.concatenate([np.concatenate(pair) for pair in zip(rows, sentinels, strict=True)])
    return flat, np.tile(np.arange(k + 1, dtype=np.float64), levels)


def rows_inputs(seed: int, k: int, proposal_rate: float, through: bool, used: int):
    rng = np.random.default_rng(seed)
    capacity, levels, m = 8, 3, 40
    thresholds, counts = tables(rng, levels, k)
    per_iteration = 0 if k == 0 else capacity * (2 if proposal_rate < 1.0 else 1)
    remaining = rng.integers(0, 30, used).astype(np.float64)
    remaining[rng.random(used) < 0.3] = 0.0  # empty slots inside the prefix
    remaining[0] = 1.0 + remaining[0]  # a stretch starts with a row decoding
    context = np.where(remaining > 0, rng.integers(1, 500, used), 0).astype(np.float64)
    shift = np.where(remaining > 0, 2.0 * rng.integers(0, levels, used), 0.0)
    uniforms = rng.random(m * per_iteration)
    decode_kv = float(context.sum())
    tables_part = (per_iteration, capacity, thresholds, counts, proposal_rate, k)
    return (uniforms, *tables_part, shift, remaining, context, m, through, decode_kv)


def test_the_kernels_are_compiled():
    """numba is a dependency: the kernels are numba dispatchers, not Python functions."""
    assert hasattr(compiled.kernels().stretch_rows, "py_func")


CASES = list(itertools.product(range(3), (0, 1, 4), (1.0, 0.6), (False, True), (1, 5, 8)))


@pytest.mark.parametrize(("seed", "k", "proposal_rate", "through", "used"), CASES)
def test_stretch_rows_drawn_in_the_kernel_equal_those_from_uniforms_handed_in(
    seed, k, proposal_rate, through, used
):
    """108 cases (3 seeds x k in 0, 1, 4 x proposals always or at 0.6 x through finishes or not x
    1, 5 or 8 slots used of 8, a third of them empty): the stretch kernel that draws its slots'
    uniforms from the generator's state gives every output byte for byte as the one handed
    the generator's doubles (k = 0 draws none)."""
    inputs = rows_inputs(seed, k, proposal_rate, through, used)
    given = stretch.kernels_rows(*inputs)
    assert given[0] >= 1, "iterations computed"
    per_iteration, capacity = inputs[1:3]
    if k:
        rng = np.random.default_rng(seed)
        state = rng.bit_generator.state["state"]
        mask = (1 << 64) - 1
        value, inc = state["state"], state["inc"]
        words = np.array([value >> 64, value & mask, inc >> 64, inc & mask], dtype=np.uint64)
        m = inputs[10]
        blocks = per_iteration // capacity
        drawn_inputs = (rng.random(m * per_iteration), *inputs[1:])
        drawn = stretch.kernels_drawn(words, blocks, *inputs[2:])
        for name, a, b in zip(FIELDS, drawn, stretch.kernels_rows(*drawn_inputs), strict=True):
            assert np.asarray(a).tobytes() == np.asarray(b).tobytes(), f"drawn: {name}"


def low_load() -> Scenario:
    data = {
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
    return Scenario.model_validate(data).with_source(DATA / "scenario.yaml")


def counting(monkeypatch) -> dict[str, int]:
    """Calls of the compiled loops and of the stretch kernels, counted."""
    calls = {"loops": 0, "stretch kernels": 0}

    def counted(name, function):
        def wrapper(*args):
            calls[name] += 1
            return function(*args)

        return wrapper

    loop = compiled_loop.kernel()
    monkeypatch.setattr(loop, "decode_loop", counted("loops", loop.decode_loop))
    serving = compiled_serving._serving_kernel()
    monkeypatch.setattr(serving, "serving_loop", counted("loops", serving.serving_loop))
    module = compiled.kernels()
    for name in ("stretch_rows", "stretch_rows_drawn"):
        monkeypatch.setattr(module, name, counted("stretch kernels", getattr(module, name)))
    return calls


@pytest.mark.parametrize("policy", ["fixed", "adaptive"])
def test_a_lone_replica_runs_the_serving_loop(policy, monkeypatch):
    """A replica alone on its arrivals runs its iterations in the compiled serving loop (the
    few it leaves to Python may plan stretches of their own)."""
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
    assert calls == {"loops": 0, "stretch kernels": 0}


def generator_words(rng: np.random.Generator) -> tuple:
    state = rng.bit_generator.state
    return state["state"]["state"], state["state"]["inc"], state["has_uint32"], state["uinteger"]


@pytest.mark.parametrize("seed", range(12))
def test_jump_stream_gives_the_sequential_draws(seed):
    """Random mixes of takes (runs of them, which grow the block drawn ahead), occupied-slot
    blocks (the rest jumped over), rewinds into both and integer draws, 60 operations per seed,
    12 seeds, against plain ``Generator`` calls; the generator's whole state (with numpy's
    buffered 32-bit half-draw, which integer draws of a small range set) matches after every
    integer draw."""
    plain, stream = np.random.default_rng(seed), JumpStream(np.random.default_rng(seed))
    choose = np.random.default_rng(1000 + seed)
    for _ in range(60):
        op = int(choose.integers(0, 4))
        if op == 0:
            size = int(choose.integers(1, 10))
            dtype = np.int64 if choose.random() < 0.5 else np.int32  # int32: half-draws
            expected = plain.integers(0, 64, size=size, dtype=dtype)
            got = stream.integers(0, 64, size=size, dtype=dtype)
            assert generator_words(stream.rng) == generator_words(plain)
        elif op == 1:
            n = int(choose.integers(0, 600))
            expected, got = plain.random(n), stream.random(n).copy()
            if n and choose.random() < 0.3:  # draw ahead, then hand the extra back
                position = stream.position
                stream.take(int(choose.integers(1, 5000)))
                stream.rewind(position)
        else:
            m, blocks = int(choose.integers(1, 30)), int(choose.integers(1, 3))
            capacity = int(choose.integers(1, 300))
            used = int(choose.integers(1, capacity + 1))
            start = stream.position
            got = stream.slot_uniforms(m, blocks, capacity, used).reshape(m, blocks, used)
            kept = int(choose.integers(0, m + 1))  # iterations the stretch keeps
            stream.rewind(start + kept * blocks * capacity)
            saved = plain.bit_generator.state
            drawn = plain.random(m * blocks * capacity).reshape(m, blocks, capacity)
            expected = drawn[:, :, :used]
            plain.bit_generator.state = saved  # and again, only the iterations kept
            plain.random(kept * blocks * capacity)
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
    (a constant in ``compiled_layout.py`` is compiled into the kernels that use it)."""
    monkeypatch.setenv("SPECSIM_CACHE_DIR", str(tmp_path))
    folder = compiled.cache_folder()
    assert folder.parent == tmp_path and folder.name.startswith("numba-")
    read = Path.read_bytes
    for name in ("compiled_layout.py", "compiled_step_kernel.py"):
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
