"""The real engine: batch packing, prompt lookup, the serving loop's records, input errors."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import yaml
from numerics import decoder_tolerance
from test_engine_common import drafter_map, model, model_spec, prompt_bank, prompts_path

from specsim.drafters import PromptLookup, proposals
from specsim.engine.batch import Batch
from specsim.engine.generate import audit_caches
from specsim.engine.records import read_engine_records
from specsim.engine.run import run_engine, write_run
from specsim.engine.workload import build_engine_source, open_loop_requests
from specsim.errors import SpecsimError
from specsim.metrics import RECORD_COLUMNS, request_latencies
from specsim.scenario import load_scenario


def scenario_file(tmp_path, **changes):
    data = {
        "name": "engine-test",
        "seed": 5,
        "profile": "unused.yaml",
        "workload": {
            "kind": "closed_loop",
            "concurrency": 3,
            "requests": 7,
            "prompt": {"dist": "uniform", "low": 12, "high": 30},
            "output": {"dist": "uniform", "low": 1, "high": 14},
        },
        "engine": {"max_batch": 3, "chunked_prefill": False},
        "speculation": {"drafter": "small", "k": 3},
    }
    for key, value in changes.items():
        section, _, name = key.partition("__")
        if name:
            data[section][name] = value
        else:
            data[section] = value
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_scenario(path)


def serve(scenario, **kw):
    return run_engine(
        scenario,
        target=model_spec("specsim-target"),
        drafters=drafter_map(),
        prompts=prompts_path(),
        **kw,
    )


def test_engine_runs_its_models_in_the_parameter_type_it_is_given(tmp_path):
    # validate compares the engine with a profile; both must run the models in one type (a
    # GPU profile defaults to bfloat16, the engine to float32).
    scenario = scenario_file(tmp_path)
    assert serve(scenario).summary["scenario"]["dtype"] == "float32"
    run = serve(scenario, dtype="bfloat16")
    assert run.summary["scenario"]["dtype"] == "bfloat16"
    assert run.records["id"].shape[0] == 7


def test_engine_logs_the_padded_pass_it_runs(tmp_path):
    # The engine pads each batched pass to its longest row: at k = 0 a decode over B rows
    # reads B x the longest context and pairs each row's one new token with as many (+1 for
    # itself), which is what a padded-attention simulation charges. The rows' own contexts
    # (kv_tokens, after the step) sum to less wherever their lengths differ.
    run = serve(scenario_file(tmp_path, speculation={"drafter": None, "k": 0}))
    log = run.log
    decodes = [i for i, kind in enumerate(log.kind) if kind == "decode" and log.batch[i] > 1]
    assert decodes
    for i in decodes:
        assert log.context[i] % log.batch[i] == 0
        assert log.pairs[i] == log.context[i] + log.batch[i]
    assert any(log.kv_tokens[i] < log.context[i] + log.batch[i] for i in decodes)


def test_removing_a_row_moves_the_last_row_with_its_caches():
    target, drafter = model("specsim-target"), model("specsim-draft-small")
    batch = Batch(target, drafter, 4, 64)
    prompts = [prompt_bank().prompt(i, 8 + 3 * i) for i in range(3)]
    batch.add(prompts)
    rows = batch.rows()
    lengths = rows.s_len.clone()
    ids = rows.seq[:, : int(lengths.max())]
    with torch.inference_mode():
        target(ids, rows.target_cache, lengths)
        drafter(ids, rows.draft_cache, lengths)
        for slot in range(3):
            batch.append(slot, [65 + slot])
        assert audit_caches(target, drafter, batch.rows()) == []
        assert batch.remove(0) == 2
        assert batch.size == 2
        assert batch.tokens(0) == [*prompts[2], 67]
        assert audit_caches(target, drafter, batch.rows()) == []


def test_prompt_lookup_matches_the_profilers_proposals():
    rng = np.random.default_rng(0)
    for _ in range(20):
        prompt = rng.integers(0, 5, size=int(rng.integers(1, 30))).tolist()
        generated = rng.integers(0, 5, size=25).tolist()
        n, k = int(rng.integers(1, 4)), int(rng.integers(1, 5))
        tokens, lengths = proposals(prompt, generated, n, k)
        lookup = PromptLookup(n, prompt)
        for t, token in enumerate(generated):
            found = lookup.propose(k)
            assert found == tokens[t, : lengths[t]].tolist()
            lookup.extend([token])


def check_records(records, scenario):
    """Invariants every engine run must satisfy."""
    n = records["id"].shape[0]
    assert list(records["id"]) == list(range(n))
    assert (records["scheduled_s"] >= records["arrival_s"]).all()
    assert (records["first_token_s"] > records["scheduled_s"]).all()
    assert (records["finish_s"] >= records["first_token_s"]).all()
    # The prefill emits one token; each step emits its accepted drafts plus one.
    out = records["output_tokens"]
    assert (out == 1 + records["steps"] + records["accepted"]).all()
    assert (records["accepted"] <= records["drafted"]).all()
    assert (records["drafted"] <= scenario.speculation.max_k * records["steps"]).all()
    assert np.isfinite(records["target_logprob_mean"]).all()
    assert (records["target_logprob_mean"] < 0).all()


def test_engine_serves_the_simulators_workload(tmp_path):
    scenario = scenario_file(tmp_path, workload__kind="poisson", workload__rate=40.0)
    run = serve(scenario)
    expected = open_loop_requests(build_engine_source(scenario))
    records = run.records
    check_records(records, scenario)
    assert np.allclose(records["arrival_s"], [r.arrival for r in expected])
    assert list(records["prompt_tokens"]) == [r.prompt_len for r in expected]
    assert list(records["output_tokens"]) == [r.output_len for r in expected]  # EOS ignored
    assert run.summary["requests"] == len(expected)
    assert 1.0 <= run.summary["mean_acceptance_length"] <= 4.0
    assert run.summary["batch_size"]["max"] <= 3
    write_run(run, tmp_path / "run")
    back = read_engine_records(tmp_path / "run" / "requests.csv")
    header = (tmp_path / "run" / "requests.csv").read_text().splitlines()[0].split(",")
    assert header[: len(RECORD_COLUMNS)] == list(RECORD_COLUMNS)
    for name, values in request_latencies(back).items():
        assert np.allclose(values, request_latencies(records)[name], atol=2e-6)


def test_a_requests_tokens_do_not_depend_on_its_batch(tmp_path):
    # Each request samples from its own stream (seed, id): served alone (batch 1) or three at a
    # time, it draws the same tokens; only batched rounding may differ (not seen at this size).
    alone = scenario_file(
        tmp_path, workload__concurrency=1, engine={"max_batch": 1, "chunked_prefill": False}
    )
    shared = scenario_file(tmp_path)
    first, second = serve(alone).records, serve(shared).records
    check_records(first, alone)
    for name in ("steps", "drafted", "accepted", "output_tokens"):
        assert np.array_equal(first[name], second[name]), name
    # A mean log-probability is one log-softmax of the logits: the logits' rounding bound.
    logprobs = torch.from_numpy(np.asarray(first["target_logprob_mean"], dtype=np.float64))
    tolerance = decoder_tolerance(model("specsim-target").config, logprobs)
    assert np.allclose(first["target_logprob_mean"], second["target_logprob_mean"], atol=tolerance)


def test_plain_decoding_and_prompt_lookup(tmp_path):
    plain = scenario_file(tmp_path, speculation={"drafter": None, "k": 0})
    records = serve(plain).records
    check_records(records, plain)
    assert records["drafted"].sum() == 0 and records["accepted"].sum() == 0
    lookup = scenario_file(tmp_path, speculation={"drafter": "ngram", "k": 3})
    records = serve(lookup).records
    check_records(records, lookup)
    # Prompt lookup proposes only where the context repeats: fewer drafts than 3 per step.
    assert records["drafted"].sum() < 3 * records["steps"].sum()


def test_by_batch_window_policy(tmp_path):
    table = [{"max_batch": 1, "k": 3}, {"max_batch": 2, "k": 1}]
    scenario = scenario_file(
        tmp_path, speculation={"drafter": "small", "policy": "by_batch", "k_by_batch": table}
    )
    run = serve(scenario)
    check_records(run.records, scenario)
    windows = {
        (b, k)
        for b, k, kind in zip(run.log.batch, run.log.window, run.log.kind, strict=True)
        if kind == "decode"
    }
    assert all(k == {1: 3, 2: 1, 3: 0}[b] for b, k in windows)


def test_eos_stops_a_request_when_not_ignored(tmp_path):
    scenario = scenario_file(
        tmp_path,
        workload__concurrency=1,
        engine={"max_batch": 1, "chunked_prefill": False},
        speculation={"drafter": "small", "k": 2, "temperature": 0.0, "verifier": "greedy"},
    )
    free = serve(scenario).records
    # Greedy output is fixed, so the first request's first token serves as a stop token.
    prompt = prompt_bank().prompt(0, int(free["prompt_tokens"][0]))
    with torch.inference_mode():
        first = int(model("specsim-target")(torch.tensor([prompt]))[0, -1].argmax())
    stopped = serve(scenario, ignore_eos=False, eos_id=first).records
    check_records(stopped, scenario)
    assert stopped["eos"][0] == 1 and stopped["output_tokens"][0] == 1
    assert (stopped["output_tokens"] <= free["output_tokens"]).all()
    assert free["eos"].sum() == 0


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"engine": {"max_batch": 2, "chunked_prefill": True}}, "engine.chunked_prefill"),
        ({"fleet": {"replicas": 2}}, "fleet"),
        ({"speculation": {"drafter": "small", "policy": "adaptive"}}, "speculation.policy"),
        ({"speculation": {"drafter": "medium", "k": 2}}, "speculation.drafter"),
        ({"workload__output": {"dist": "fixed", "value": 600}}, "workload"),
    ],
)
def test_unsupported_or_bad_scenarios_are_one_line_errors(tmp_path, changes, key):
    scenario = scenario_file(tmp_path, **changes)
    with pytest.raises(SpecsimError) as info:
        serve(scenario)
    assert info.value.key == key
    assert "\n" not in info.value.one_line()


def test_cpu_clock_skips_idle_waits(tmp_path):
    from specsim.engine.clock import ProcessClock, start_clock

    clock = ProcessClock()
    before = clock.now()
    clock.sleep(5.0)
    assert clock.now() - before >= 5.0
    with pytest.raises(SpecsimError, match="applies to CPU"):
        start_clock("cpu", "cuda")
    # Arrivals spread over ~14 s of engine time are served without sleeping through the gaps.
    scenario = scenario_file(tmp_path, workload__kind="poisson", workload__rate=0.5)
    run = serve(scenario, clock="cpu")
    check_records(run.records, scenario)
    assert run.records["arrival_s"][-1] > 5.0
    assert run.summary["duration_s"] >= run.records["arrival_s"][-1]


def test_reference_clock_run_rescales_to_the_profiles_references_and_reports_the_drift(
    tmp_path, monkeypatch
):
    from specsim.engine.speed_reference import ReferenceClockSetting, probes
    from specsim.profile.provenance import SpeedReference

    # A profile's references (the target's, the host pass's and the scenario's drafter's), and
    # a machine on which every model probe now takes 2 ms: the target's decodes run twice as
    # slow as its reference, its prefills as fast, the drafter's prefills twice as fast.
    stored = SpeedReference(
        decode_s=1e-3,
        prefill_s=2e-3,
        host_s=5e-4,
        drafters={
            "small": {"decode_s": 1e-3, "prefill_s": 4e-3},
            "other": {"decode_s": 9.0, "prefill_s": 9.0},
        },
    )
    calls = []
    monkeypatch.setattr(
        probes.ReferencePass, "median_s", lambda self, passes=5: calls.append(self) or 2e-3
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        scenario = scenario_file(tmp_path)
        run = serve(scenario, clock=ReferenceClockSetting(stored))
    finally:
        torch.set_num_threads(threads)
    check_records(run.records, scenario)
    drift = run.summary["machine_speed"]
    assert drift["reference_pass_s"] == 1e-3 and drift["slowdown_median"] == pytest.approx(2.0)
    assert drift["reference_prefill_s"] == 2e-3 and drift["reference_host_s"] == 5e-4
    assert drift["prefill_slowdown_median"] == pytest.approx(1.0)
    own = drift["models"]["small"]  # only the scenario's drafter is probed, at its own references
    assert list(drift["models"]) == ["small"]
    assert own["decode_s"] == 1e-3 and own["slowdown_median"] == pytest.approx(2.0)
    assert own["prefill_s"] == 4e-3 and own["prefill_slowdown_median"] == pytest.approx(0.5)
    # Every reference was given, so nothing was calibrated: four model probes per probe round.
    assert drift["probes"] >= 1 and len(calls) == 4 * drift["probes"]
    assert run.summary["scenario"]["clock"] == "reference"


def test_a_cpu_clock_run_logs_each_iterations_passes_apart(tmp_path):
    from specsim.engine.run import write_run

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run = serve(scenario_file(tmp_path), clock="cpu")
    finally:
        torch.set_num_threads(threads)
    log = run.log
    assert len(log.target_s) == len(log.drafter_s) == len(log.dt)
    for dt, target, drafter in zip(log.dt, log.target_s, log.drafter_s, strict=True):
        assert target > 0 and drafter > 0 and target + drafter < dt  # the rest: own work
    write_run(run, tmp_path / "run")
    header, first = (tmp_path / "run" / "iterations.csv").read_text().splitlines()[:2]
    assert header.endswith(",seconds,target_s,drafter_s")
    assert all(first.split(","))  # every column filled
    wall = serve(scenario_file(tmp_path))
    assert wall.log.target_s == [] and wall.log.drafter_s == []


def test_the_engine_marks_every_pass_with_its_model_and_width(tmp_path, monkeypatch):
    # The reference clock weighs each pass by its own model's factor for its width, so every
    # pass of the served iterations must be marked, start and end, on the real model.
    from specsim.engine import clock as clocks

    events = []
    reading = clocks.WallClock.now
    monkeypatch.setattr(clocks.WallClock, "now", lambda self: events.append("now") or reading(self))
    monkeypatch.setattr(
        clocks.WallClock,
        "mark",
        lambda self, m, tokens=1.0, role="host": events.append((m, tokens, role)),
    )
    run = serve(scenario_file(tmp_path), clock="wall")
    marks = events[events.index("now") :]  # from the clock's start: warm-up passes left out
    passes = [e for e in marks if e != "now"]
    starts, ends = passes[0::2], passes[1::2]
    assert all(end == (None, 1.0, "host") for end in ends) and len(starts) == len(ends)
    assert {type(m).__name__ for m, _, _ in starts} == {"DecoderModel"}  # not the wrappers
    by_role = {}
    for m, tokens, role in starts:
        by_role.setdefault(role, []).append((id(m), tokens))
    assert set(by_role) == {"target", "drafter"}
    assert len({m for m, _ in by_role["target"]} | {m for m, _ in by_role["drafter"]}) == 2
    widths = [tokens for _, tokens in by_role["target"]]
    assert len(widths) == len(run.log.kind)  # one target pass per iteration
    drafted = iter(run.log.drafted)
    for kind, width in zip(run.log.kind, widths, strict=True):
        if kind == "decode":
            rows = next(drafted)
            assert width == len(rows) * (rows.max() + 1)  # the verification's [B, k + 1]
    decodes = sum(int(rows.max()) for rows in run.log.drafted)
    assert len(by_role["drafter"]) == decodes + run.log.kind.count("prefill")


def test_busy_iterations_tile_the_time_bookkeeping_included(tmp_path):
    # A profile is fitted to the iteration log and the simulator replays it back to back, so the
    # log must account for every moment the engine is busy: the appends and retirements after
    # each step included. A clock that charges 1 ms per reading makes any unlogged stretch
    # visible: a reading outside the iterations would put the last finish past their sum.
    from specsim.engine.engine import EngineOptions, ServingEngine
    from specsim.engine.workload import EngineRequest

    class TickingClock:
        t = 0.0

        def now(self):
            self.t += 1e-3
            return self.t

        def sleep(self, seconds):
            raise AssertionError("the requests all wait at the start: no idle waits")

    clock = TickingClock()
    options = EngineOptions(max_batch=3, window=lambda rows: 2, k_max=2, seed=1)
    engine = ServingEngine(
        model("specsim-target"), model("specsim-draft-small"), prompt_bank(), options,
        clock.now, clock.sleep,
    )  # fmt: skip
    lengths = [(12, 9), (20, 3), (16, 14), (9, 6), (25, 1)]
    done = engine.run([EngineRequest(i, 0.0, p, o) for i, (p, o) in enumerate(lengths)])
    log = engine.log
    assert log.kind.count("prefill") >= 2  # admissions between decode steps, too
    assert max(r.finish for r in done) == pytest.approx(1e-3 + sum(log.dt), abs=1e-12)
    # Each iteration's timestamps are its end: a request finishes when its last step does.
    ends = set(np.round(1e-3 + np.cumsum(log.dt), 9))
    assert {round(r.finish, 9) for r in done} <= ends
    assert {round(r.first_token, 9) for r in done} <= ends


@pytest.mark.parametrize(
    ("workload", "rate", "cap"),
    [
        (None, float("inf"), 3),  # the closed loop of scenario_file: 3 clients
        ({"kind": "poisson", "rate": 20.0, "requests": 7, "max_concurrency": 2}, 20.0, 2),
    ],
    ids=["closed-loop", "poisson-capped"],
)
def test_an_engine_run_is_written_as_vllm_bench_serve_writes_its_results(
    tmp_path, workload, rate, cap
):
    from specsim.engine.run import BENCH_FILE
    from specsim.serving.detect import read_bench_files

    changes = {}
    if workload is not None:
        lengths = {
            "prompt": {"dist": "fixed", "value": 16},
            "output": {"dist": "fixed", "value": 9},
        }
        changes["workload"] = {**workload, **lengths}
    run = serve(scenario_file(tmp_path, **changes), clock="cpu")
    write_run(run, tmp_path / "engine")
    (bench,) = read_bench_files([tmp_path / "engine" / BENCH_FILE])
    written = json.loads((tmp_path / "engine" / BENCH_FILE).read_text())
    assert written["produced_by"].startswith("specsim's built-in engine")
    assert (bench.engine, bench.model, bench.label) == (
        "vllm",
        model_spec("specsim-target"),
        "engine-test",
    )
    assert (bench.traffic.request_rate, bench.traffic.max_concurrency) == (rate, cap)
    assert bench.completed == 7 and bench.lengths.output_lens == tuple(run.records["output_tokens"])
    # The client's figures are the engine's requests' (TTFT and E2E from arrival), each
    # statistic by np.percentile as vLLM's client computes it.
    records = run.records
    e2e = records["finish_s"] - records["arrival_s"]
    assert bench.metrics["ttft_s.mean"] == pytest.approx(
        np.mean(records["first_token_s"] - records["arrival_s"]), rel=1e-9
    )
    assert bench.metrics["e2e_s.p90"] == pytest.approx(np.percentile(e2e, 90), rel=1e-9)
    summary = run.summary
    counters = bench.speculation
    assert counters.draft_tokens == int(run.records["drafted"].sum())
    assert counters.k == 3
    assert counters.acceptance_length == pytest.approx(summary["mean_acceptance_length"], rel=1e-4)


def test_the_scenarios_load_is_stated_in_a_benchmark_clients_terms(tmp_path):
    from specsim.engine.run import bench_traffic

    arrivals = np.array([0.5, 1.0, 2.5])
    lengths = {"prompt": {"dist": "fixed", "value": 8}, "output": {"dist": "fixed", "value": 4}}
    cases = {
        "poisson": ({"rate": 4.0, "requests": 3}, (4.0, 1.0, None)),
        "bursty": ({"rate": 4.0, "requests": 3, "cv": 2.0}, (4.0, 0.25, None)),  # 1 / cv^2
        "fixed_rate": ({"rate": 4.0, "requests": 3, "max_concurrency": 2}, (4.0, math.inf, 2)),
        "closed_loop": ({"concurrency": 5, "requests": 3}, (math.inf, 1.0, 5)),
    }
    for kind, (workload, expected) in cases.items():
        scenario = scenario_file(tmp_path, workload={"kind": kind, **workload, **lengths})
        traffic = bench_traffic(scenario, arrivals)
        assert (traffic.request_rate, traffic.burstiness, traffic.max_concurrency) == expected
        assert traffic.num_prompts == 3
    # A trace has no rate of its own: its mean over the run's sends, 2 gaps in 2 s.
    trace = tmp_path / "trace.csv"
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,8,4\n1,8,4\n2,8,4\n")
    scenario = scenario_file(tmp_path, workload={"kind": "trace", "trace": str(trace)})
    assert bench_traffic(scenario, arrivals).request_rate == 1.0
