"""The measured profiler on tiny random-weight models: timing grid, acceptance pipeline, the CLI
end to end, and its bad inputs."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

torch = pytest.importorskip("torch")

from specsim.cli import main  # noqa: E402
from specsim.errors import SpecsimError  # noqa: E402
from specsim.profile import load_profile  # noqa: E402
from specsim.profiling import timing  # noqa: E402
from specsim.profiling.specs import parse_drafters  # noqa: E402


def tiny_config(hidden=32, layers=2, vocab=258, max_position=512):
    return {
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "num_attention_heads": 4,
        "num_hidden_layers": layers,
        "num_key_value_heads": 2,
        "vocab_size": vocab,
        "max_position_embeddings": max_position,
        "specsim_tokenizer": "bytes",
        "bos_token_id": 256,
        "eos_token_id": 257,
    }


@pytest.fixture
def configs(tmp_path):
    paths = {}
    for name, cfg in {
        "target": tiny_config(48, 2),
        "draft": tiny_config(16, 1),
        "othervocab": tiny_config(16, 1, vocab=300),
    }.items():
        path = tmp_path / name / "config.json"
        path.parent.mkdir()
        path.write_text(json.dumps(cfg))
        paths[name] = str(path)
    return paths


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text(
        "the cat sat on the mat, the cat sat on the mat\n\n"
        "one two three one two three one two\n\n"
        "a quick brown fox jumps over the lazy dog\n"
    )
    return str(path)


SMALL_GRID = [
    "--grid",
    "batch=1,2",
    "--grid",
    "context=8,32",
    "--grid",
    "new=1,3",
    "--grid",
    "prefill=16",
]


def test_time_grid_measures_every_point_with_repeats(configs):
    from specsim.models import load_model

    model = load_model(configs["target"])
    points = timing.grid_points(
        {"batch": (1, 2), "context": (0, 16), "new": (1, 4), "prefill": (8,)}
    )
    run = timing.time_grid(model, points, timing.PassTimer("cpu", warmup=1, repeats=3))
    assert not run.stopped_early
    assert [(s.batch, s.context, s.new_tokens) for s in run.samples] == [
        (p.batch, p.context, p.new_tokens) for p in sorted(points)
    ]
    assert all(s.repeats == 3 and s.seconds > 0 and s.spread_s >= 0 for s in run.samples)
    phases = {(s.context, s.new_tokens): s.phase for s in run.samples}
    assert phases[(16, 1)] == "decode" and phases[(16, 4)] == "verify"
    assert phases[(0, 8)] == "prefill"


class Recording:
    """A model that notes its name in ``calls`` on every pass."""

    def __init__(self, model, name, calls):
        self.model, self.name, self.calls = model, name, calls
        self.config, self.device = model.config, model.device

    def new_cache(self, *args):
        return self.model.new_cache(*args)

    def __call__(self, ids, cache, *args):
        self.calls.append((self.name, tuple(ids.shape), int(cache.lengths[0])))
        return self.model(ids, cache, *args)


def test_several_models_are_timed_in_interleaved_rounds(configs, monkeypatch):
    from specsim.models import load_model

    calls = []
    models = {
        name: Recording(load_model(configs[name]), name, calls) for name in ("draft", "target")
    }
    points = timing.grid_points({"batch": (1,), "context": (8,), "new": (1, 2)})
    ticks = iter(range(10_000))  # a fake clock: one tick per look, priming lasts two looks
    monkeypatch.setattr(timing.time, "perf_counter", lambda: next(ticks))
    timer = timing.PassTimer("cpu", warmup=0, repeats=3, prime_s=2)
    runs = timing.time_grids(models, points, timer)
    assert all(s.repeats == 3 for run in runs.values() for s in run.samples)
    # Each round: every point once per model, each timed pass right after the same pass
    # untimed for prime_s (so it runs warm, as a serving loop's alike steps do).
    rounds = [calls[i : i + 6] for i in range(0, len(calls), 6)]
    assert len(calls) == 2 * 3 * 6
    assert [r[0][0] for r in rounds] == ["draft", "target"] * 3
    for r in rounds:
        assert len({name for name, _, _ in r}) == 1
        assert r[0] == r[1] == r[2] and r[3] == r[4] == r[5]  # primed: after its twins
        assert [shape for _, shape, _ in r[::3]] == [(1, 1), (1, 2)]  # the points in order
        assert {context for _, _, context in r} == {8}


def test_a_due_speed_probe_runs_before_the_priming_not_between_it_and_the_timing(
    configs, monkeypatch
):
    # A probe's own passes (a prefill among them) would leave the timed pass cold, as a
    # different pass before it does; so the normaliser gets its chance before the primers.
    from specsim.models import load_model

    calls = []
    model = Recording(load_model(configs["target"]), "pass", calls)
    timer = timing.PassTimer("cpu", warmup=0, repeats=2, clock="cpu", prime_s=0)
    timer.normalise = lambda tokens, m: calls.append(("factor", tokens)) or 1.0
    points = timing.grid_points({"batch": (2,), "context": (8,), "new": (1, 3)})
    timing.time_grid(model, points, timer)
    names = [c[0] for c in calls]
    # Per timed point: a chance to probe, one primer, the factor read, the timed pass.
    assert names == ["factor", "pass", "factor", "pass"] * 4
    assert [c[1] for c in calls if c[0] == "factor"] == [2, 2, 6, 6] * 2


def test_time_budget_stops_the_grid_and_keeps_what_was_measured(configs, monkeypatch):
    from specsim.models import load_model

    model = load_model(configs["target"])
    points = timing.grid_points({"batch": (1, 2), "context": (8,), "new": (1, 2, 3)})
    clock = iter(range(10_000))  # a fake clock: one tick per look
    monkeypatch.setattr(timing.time, "monotonic", lambda: next(clock))
    run = timing.time_grid(model, points, timing.PassTimer("cpu", warmup=0, repeats=2), deadline=5)
    assert run.stopped_early
    assert 0 < len(run.samples) < len(points)
    # The cut falls in the first round, so the measured points are a prefix of the grid in
    # order (small batches first) and the expensive end is what is lost.
    measured = [timing.GridPoint(s.batch, s.context, s.new_tokens) for s in run.samples]
    assert measured == sorted(points)[: len(measured)]


@pytest.mark.parametrize(
    "grid, words",
    [
        (["batch="], ["batch", "no points"]),
        (["speed=1"], ["unknown grid axis"]),
        (["context=a,b"], ["not integers"]),
        (["new=0"], ["new", "from 1"]),
        (["batch=99999999999"], ["batch", "to 65,536"]),
    ],
)
def test_bad_grids_are_errors(grid, words):
    with pytest.raises(SpecsimError) as err:
        timing.parse_grid(grid, "cpu")
    for word in words:
        assert word in str(err.value)


def test_a_drafter_identical_to_the_target_is_always_accepted(configs):
    """beta = 1 and greedy match everywhere, so each window-k step emits k + 1 tokens."""
    from specsim.models import load_model
    from specsim.profiling.acceptance_measure import measure_acceptance

    model = load_model(configs["target"])
    ids = [[256, *b"abcabcabc"], [256, *b"hello there"]]
    drafters = parse_drafters(["same=unused-the-model-is-passed-in", "ngram:2"])
    result = measure_acceptance(
        model,
        {"same": model},
        drafters,
        ids,
        [1.0],
        max_new_tokens=24,
        seed=0,
        eos_id=None,
        sequences_prefix="p",
    )
    same = [e for e in result.entries if e["drafter"] == "same"]
    assert {(e["verifier"], e["temperature"]) for e in same} == {
        ("greedy", 0.0),
        ("rejection", 1.0),
        ("typical", 1.0),
    }
    for entry in same:
        assert entry["per_position"] == pytest.approx([1.0] * 8)
        assert entry["mean_acceptance_length"] == {k: pytest.approx(k + 1) for k in range(1, 9)}
        assert entry["tokens_scored"] == 48
    ngram = [e for e in result.entries if e["drafter"] == "ngram"]
    assert all(0 < e["proposal_rate"] <= 1 for e in ngram)
    greedy = next(e for e in same if e["verifier"] == "greedy")
    lines = result.side_files[greedy["sequences"]["path"]].splitlines()
    assert len(lines) == 2
    # Unlimited k on an always-accepted text: a step at t accepts the 24 - t drafts left, plus
    # the bonus token.
    assert [int(v) for v in lines[0].split()] == list(range(25, 1, -1))


def test_measure_cli_writes_a_profile_that_loads_and_answers(configs, prompts, tmp_path, capsys):
    out = tmp_path / "prof" / "tiny.yaml"
    argv = [
        "profile",
        "measure",
        "--target",
        configs["target"],
        "--drafter",
        f"small={configs['draft']}",
        "--drafter",
        "ngram:2",
        "--prompts",
        prompts,
        *SMALL_GRID,
        "--repeats",
        "2",
        "--max-new-tokens",
        "16",
        "--temperature",
        "0.7",
        "--sequences",
        "--out",
        str(out),
        "--json",
    ]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["source"] == "measured"
    loaded = load_profile(out)
    profile = loaded.profile
    assert profile.provenance.profiling_seconds > 0
    assert "torch" in profile.provenance.software
    target = profile.target.latency
    assert len(target.samples) == 2 * 2 * 2 + 2  # batch x context x new + prefill per batch
    assert target.valid_range.batch == (1, 2) and target.valid_range.context == (0, 32)
    assert target.fit.held_out.points == len(target.samples)
    assert loaded.latency_model("small").pass_seconds(np.array([8, 30]), 3) > 0
    assert profile.target.flops_per_token > profile.drafters["small"].flops_per_token
    assert profile.overhead.source == "measured"
    # The draft model's own draft terms, measured against the latency fits (see overhead.py).
    assert profile.drafters["small"].overhead is not None
    assert profile.provenance.speed_reference is None  # wall clock: no reference speed
    verifiers = {(a.drafter, a.verifier, a.temperature) for a in profile.acceptance}
    assert ("small", "greedy", 0.0) in verifiers and ("small", "rejection", 0.7) in verifiers
    assert ("small", "typical", 0.7) in verifiers
    typical = [a for a in profile.acceptance if a.verifier == "typical"]
    assert typical and all(0 <= a.tv_distance <= 1 for a in typical)
    for entry in profile.acceptance:
        if entry.sequences is None:
            continue
        lines = loaded.sequences_path(entry).read_text().splitlines()
        assert len(lines) == entry.sequences.requests == 3
        values = [float(v) for line in lines for v in line.split()]
        if entry.sequences.kind == "run_length":
            assert all(v >= 1 and v == int(v) for v in values)
        else:
            assert all(0 <= v <= 1 for v in values)


@pytest.mark.parametrize(
    "change, words",
    [
        ({"--target": "no/such/model"}, ["no/such/model", "not found"]),
        ({"--drafter": "big=specsim-draft-huge"}, ["specsim-draft-huge", "not found"]),
        ({"--drafter": "bad name=x"}, ["not a plain name"]),
        ({"--grid": "batch="}, ["no points"]),
        ({"prompts": b""}, ["no prompts"]),
        ({"prompts": b"caf\xe9 au lait\n"}, ["not UTF-8"]),
        ({"prompts.jsonl": b'{"prompt": "a"}\n{"text": 3}\n'}, ["line 2"]),
        ({"--device": "tpu"}, ["unknown device"]),
        ({"othervocab": True}, ["vocabulary", "vocab_size"]),
        ({"--temperature": "-1"}, ["temperature"]),
    ],
)
def test_measure_cli_bad_input_exit_2_nothing_written(
    configs, prompts, tmp_path, capsys, change, words
):
    args = {
        "--target": configs["target"],
        "--drafter": f"small={configs['draft']}",
        "--prompts": prompts,
    }
    extra = []
    for key, value in change.items():
        if key.startswith("prompts"):
            path = tmp_path / ("bad." + ("jsonl" if key.endswith("jsonl") else "txt"))
            path.write_bytes(value)
            args["--prompts"] = str(path)
        elif key == "othervocab":
            args["--drafter"] = f"small={configs['othervocab']}"
        elif key == "--grid":
            extra += ["--grid", value]
        else:
            args[key] = value
    out = tmp_path / "out" / "p.yaml"
    argv = ["profile", "measure", "--out", str(out), "--repeats", "1", *SMALL_GRID, *extra]
    for key, value in args.items():
        argv += [key, value]
    try:
        code = main(argv)
    except SystemExit as exc:  # an option's own bounds, refused by argparse
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    for word in words:
        assert word in err
    assert not out.parent.exists() or not any(out.parent.iterdir())


@pytest.mark.gpu
def test_cuda_timing_with_events(configs):
    from specsim.models import load_model

    model = load_model(configs["target"], device="cuda", dtype=torch.bfloat16)
    points = timing.grid_points({"batch": (1, 4), "context": (64,), "new": (1, 5)})
    run = timing.time_grid(model, points, timing.PassTimer("cuda", warmup=2, repeats=5))
    assert len(run.samples) == 4
    assert all(0 < s.seconds < 1 for s in run.samples)


def test_acceptance_is_deterministic_for_a_seed(configs):
    from specsim.models import load_model
    from specsim.profiling.acceptance_measure import measure_acceptance

    target, draft = load_model(configs["target"]), load_model(configs["draft"])
    ids = [[256, *b"the cat sat"], [256, *b"on the mat"]]
    drafters = parse_drafters([f"small={configs['draft']}", "ngram"])

    def entries(seed):
        return measure_acceptance(
            target,
            {"small": draft},
            drafters,
            ids,
            [0.8],
            max_new_tokens=12,
            seed=seed,
            eos_id=None,
        ).entries

    assert entries(3) == entries(3)
    sampled = [e for e in entries(3) if e["verifier"] == "rejection"]
    assert sampled != [e for e in entries(4) if e["verifier"] == "rejection"]


def test_a_budget_too_short_to_fit_is_a_clear_error(configs, tmp_path, capsys):
    out = tmp_path / "p.yaml"
    argv = [
        "profile",
        "measure",
        "--target",
        configs["target"],
        "--no-acceptance",
        *SMALL_GRID,
        "--time-budget",
        "1e-6",
        "--out",
        str(out),
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "need at least 7" in err and "--time-budget" in err
    assert not out.exists()


def test_cpu_clock_times_the_process_and_needs_one_thread(configs, monkeypatch):
    from specsim.models import load_model

    timer = timing.PassTimer("cpu", warmup=0, repeats=2, clock="cpu")
    model = load_model(configs["target"])
    run = timing.time_grid(
        model, timing.grid_points({"batch": (1,), "context": (8,), "new": (1, 2)}), timer
    )
    assert all(s.seconds > 0 for s in run.samples)
    # A process that sleeps uses no CPU time: the cpu clock leaves it out, the wall clock not.
    import time as _time

    assert timer.time_once(lambda: _time.sleep(0.05)) < 0.02
    assert timing.PassTimer("cpu", clock="wall").time_once(lambda: _time.sleep(0.05)) >= 0.05
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    with pytest.raises(SpecsimError, match="one torch thread"):
        timing.PassTimer("cpu", clock="cpu")
    with pytest.raises(SpecsimError, match="CUDA events"):
        timing.PassTimer("cuda", clock="cpu")


def test_reference_clock_profile_records_the_speed_it_rescaled_to(configs, tmp_path):
    out = tmp_path / "p.yaml"
    argv = [
        "profile",
        "measure",
        "--target",
        configs["target"],
        "--drafter",
        f"small={configs['draft']}",
    ]
    argv += ["--no-acceptance", *SMALL_GRID, "--repeats", "2", "--clock", "reference"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert main([*argv, "--out", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)
    profile = load_profile(out).profile
    speed = profile.provenance.speed_reference  # one block: the shared CPU's timing
    assert 0 < speed.decode_s < 1.0 and 0 < speed.prefill_s < 1.0
    assert 0 < speed.host_s < 1.0  # the engine's own work's probe
    own = speed.drafters["small"]  # the drafter's own probes
    assert 0 < own.decode_s < 1.0 and 0 < own.prefill_s < 1.0
    assert "rescaled to the machine's quiet speed" in profile.provenance.notes
    assert 0 < speed.slowdown < 10  # the probes over the reference
    assert speed.overhead_pass_scale is not None and 0 < speed.overhead_pass_scale < 10
    # Written nested, with none of the older flat keys.
    written = yaml.safe_load(out.read_text(encoding="utf-8"))["provenance"]
    assert "speed_reference" in written and "reference_pass_s" not in written


def test_a_profile_whose_references_were_taken_slow_says_so(configs, monkeypatch):
    # References are the fastest bursts at the start; when the machine was slow then, later
    # probes run faster than them throughout, and the profile says to profile again.
    from specsim.engine.speed_reference import normaliser, probes
    from specsim.profiling import measure

    calls = iter(range(1_000_000))
    calibration = 2 * normaliser.CALIBRATION_ROUNDS  # the target's decode and prefill bursts
    monkeypatch.setattr(
        probes.ReferencePass,
        "median_s",
        lambda self, passes=5: 2e-3 if next(calls) < calibration else 1e-3,
    )
    options = measure.MeasureOptions(
        target=configs["target"],
        drafters=[],
        name="slow-start",
        grid=SMALL_GRID[1::2],
        repeats=2,
        clock="reference",
        acceptance=False,
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        report = measure.measure_profile(options)
    finally:
        torch.set_num_threads(threads)
    assert report.profile.provenance.speed_reference.slowdown == pytest.approx(0.5)
    assert any("profile again" in line for line in report.lines)


def test_generation_stops_each_row_at_eos(configs):
    from specsim.models import load_model
    from specsim.profiling.scoring import generate_target_text

    model = load_model(configs["target"])
    prompts = [[256, *b"abc"], [256, *b"hello"]]
    free = generate_target_text(model, prompts, 0.0, 10, torch.Generator().manual_seed(0))
    assert [len(g.tokens) for g in free] == [10, 10]
    assert all(g.logits.shape == (10, 258) for g in free)
    # Greedy text is deterministic, so making row 0's third token the EOS stops it there.
    eos = free[0].tokens[2]
    stopped = generate_target_text(
        model, prompts, 0.0, 10, torch.Generator().manual_seed(0), eos_id=eos
    )
    assert stopped[0].tokens == free[0].tokens[: free[0].tokens.index(eos) + 1]
    assert torch.equal(stopped[0].logits, free[0].logits[: len(stopped[0].tokens)])
