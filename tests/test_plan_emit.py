"""``--emit vllm,sglang,trtllm`` on real plans: the recommended setting in each engine's files,
written atomically with the plan; model paths; what an engine cannot express; bad input."""

from __future__ import annotations

import contextlib
import io
import json
import shlex
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml
from test_plan_support import PROFILE, write_scenario

import specsim
from specsim.cli import main
from specsim.errors import SpecsimError
from specsim.planning.emit import emit, emit_choice, emit_workload
from specsim.planning.report import Report
from specsim.planning.window import window
from specsim.version import __version__

ALL = "vllm,sglang,trtllm"
QUICK = ["--workers", "1", "--no-progress"]


def run(argv: list[str]) -> int:
    with contextlib.redirect_stdout(io.StringIO()):
        return main(argv)


def args_of(path: Path) -> list[str]:
    return shlex.split(path.read_text(encoding="utf-8"), comments=True)


def option(words: list[str], flag: str) -> str:
    return words[words.index(flag) + 1]


@pytest.fixture(scope="module")
def emitted(tmp_path_factory, repo):
    """plan window at one low load, k 0..2, every engine emitted. The shipped profile with a
    per-sequence cost of 10 us a step (the roofline's before its fitted 120 us, which makes
    k = 2 best at every batch here): the plan then recommends a table of more than one k."""
    folder = tmp_path_factory.mktemp("emit")
    data = yaml.safe_load((repo / PROFILE).read_text())
    data["overhead"]["per_sequence_s"] = 1e-5
    profile = folder / "profile.yaml"
    profile.write_text(yaml.safe_dump(data))
    scenario = write_scenario(folder, repo, requests=200, rate=2.0, profile=profile)
    out = folder / "out"
    argv = ["plan", "window", str(scenario), "--k", "0..2", "--loads", "2", *QUICK]
    code = run([*argv, "--emit", ALL, "--out", str(out)])
    return SimpleNamespace(code=code, out=out, scenario=scenario, argv=argv)


@pytest.mark.slow
def test_the_recommended_table_in_every_engines_files(emitted):
    """At 2 req/s with k 0..2 the plan recommends its k-by-batch table: vLLM and TensorRT-LLM
    take it as it is, SGLang runs the best static k instead (and says so)."""
    assert emitted.code == 0
    summary = json.loads((emitted.out / "summary.json").read_text())
    table = summary["k_by_batch"]
    assert table["verdict"] == "recommended" and len({r["k"] for r in table["rows"]}) > 1
    block = summary["engine"]
    assert block["recommended"]["drafter"] == "llama3.2-1b"
    assert block["recommended"]["k_by_batch"] == table["rows"]
    top = max(r["k"] for r in table["rows"])
    engine = emitted.out / "engine"
    config = json.loads((engine / "vllm.json").read_text())
    assert config["method"] == "draft_model" and config["num_speculative_tokens"] == top
    assert (
        config["num_speculative_tokens_per_batch_size"]
        == table["num_speculative_tokens_per_batch_size"]
    )
    assert config["model"] == "meta-llama/Llama-3.2-1B-Instruct"  # the profile's description
    vllm = args_of(engine / "vllm.args")
    assert option(vllm, "--max-num-seqs") == "96"  # the scenario's engine.max_batch
    assert option(vllm, "--max-num-batched-tokens") == "8192"
    assert json.loads(option(vllm, "--speculative-config")) == config
    best = summary["best_k"][0]["best_k"]
    sglang = args_of(engine / "sglang.args")
    assert option(sglang, "--speculative-num-steps") == str(best)
    assert option(sglang, "--speculative-num-draft-tokens") == str(best + 1)
    assert option(sglang, "--max-running-requests") == "96"
    assert "k-by-batch table" in block["sglang"]["not_expressible"][0]
    trt = yaml.safe_load((engine / "trtllm.yaml").read_text())
    schedule = {r["max_batch"]: r["k"] for r in table["rows"]}
    assert trt["speculative_config"]["draft_len_schedule"] == schedule
    assert trt["speculative_config"]["max_draft_len"] == top
    assert trt["max_batch_size"] == 96
    assert block["vllm"]["written"]["speculative_config"] == config
    assert block["trtllm"]["written"] == json.loads(json.dumps(trt))  # JSON keys are text
    assert block["models"]["target"] == {
        "path": "meta-llama/Llama-3.1-8B-Instruct",
        "source": "profile",
    }
    for name in ("vllm.args", "sglang.args", "trtllm.yaml", "bench.sh"):
        text = (engine / name).read_text()
        head = " ".join(line.lstrip("#").strip() for line in text.splitlines()[:6])
        assert f"specsim {__version__}" in head, name
        assert "scenario 'plan-test'" in head and "llama3.1-8b_llama3.2-1b_h100-roofline" in head


@pytest.mark.slow
def test_the_bench_script_tests_the_planned_loads(emitted):
    summary = json.loads((emitted.out / "summary.json").read_text())
    bench = summary["engine"]["bench"]
    assert bench["clients"] == ["vllm", "sglang"]
    assert bench["results"] == {"vllm": "engine/bench/vllm", "sglang": "engine/bench/sglang"}
    (load,) = bench["loads"]
    assert load == {"label": "rate-2", "request_rate": 2.0, "max_concurrency": None,
                    "num_prompts": 200}  # fmt: skip
    assert bench["burstiness"] == 1.0  # Poisson
    text = (emitted.out / "engine" / "bench.sh").read_text()
    assert "--result-filename rate-2.json" in text
    assert "rejection_sample_method" in text and "SGLANG_SIMULATE_ACC_LEN=" in text
    for line in text.splitlines():  # the controlled-test servers are commented out
        if "synthetic" in line or "SGLANG_SIMULATE_ACC_LEN" in line:
            assert line.startswith("#")


@pytest.mark.slow
def test_the_engine_files_read_back_as_attachments_and_the_api_writes_the_same(emitted):
    back = specsim.load_run(emitted.out)
    names = {"engine/vllm.json", "engine/vllm.args", "engine/sglang.args"}
    names |= {"engine/trtllm.yaml", "engine/bench.sh"}
    assert names <= set(back.attachments)
    for name in names:
        assert back.attachments[name] == (emitted.out / name).read_text()
    in_memory = specsim.plan_window(
        emitted.scenario, k="0..2", loads=[2], workers=1, progress=False, emit=ALL.split(",")
    )
    assert in_memory.out is None
    for name in names:
        assert in_memory.attachments[name] == back.attachments[name]
    assert in_memory.summary["engine"] == back.summary["engine"]


@pytest.mark.slow
def test_a_rerun_removes_the_engine_files_it_no_longer_writes(emitted, tmp_path):
    out = tmp_path / "out"
    run([*emitted.argv, "--emit", "vllm,sglang", "--out", str(out)])
    results = out / "engine" / "bench" / "vllm" / "rate-2.json"
    results.parent.mkdir(parents=True)
    results.write_text("{}")  # a measurement bench.sh wrote: never removed
    assert run([*emitted.argv, "--emit", "trtllm", "--out", str(out)]) == 0
    left = sorted(p.name for p in (out / "engine").iterdir() if p.is_file())
    assert left == ["bench.sh", "trtllm.yaml"]
    assert results.read_text() == "{}"
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["engine"]) == {"recommended", "models", "trtllm", "bench"}
    assert run([*emitted.argv, "--out", str(out)]) == 0  # no --emit: no engine files at all
    assert not [p for p in (out / "engine").iterdir() if p.is_file()]
    assert "engine" not in json.loads((out / "summary.json").read_text())


@pytest.mark.slow
def test_given_model_paths_and_placeholders(emitted, tmp_path, repo):
    profile = yaml.safe_load((repo / PROFILE).read_text())
    profile["target"]["description"] = "Llama 3.1 8B"  # not an id: no path is known
    profile["drafters"]["llama3.2-1b"]["description"] = ""
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(profile, sort_keys=False))
    scenario = write_scenario(tmp_path, repo, requests=200, rate=2.0, profile=path)
    argv = ["plan", "window", str(scenario), "--k", "0,2", "--loads", "2", *QUICK, "--json"]
    out = tmp_path / "placeholder"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert main([*argv, "--emit", "vllm", "--out", str(out)]) == 0
    config = json.loads((out / "engine" / "vllm.json").read_text())
    assert config["model"] == "REPLACE-ME/llama3.2-1b"
    assert config["num_speculative_tokens"] == 2  # a static k: k 0 or 2 only
    assert "num_speculative_tokens_per_batch_size" not in config
    header = (out / "engine" / "vllm.args").read_text()
    assert "REPLACE-ME/target is a PLACEHOLDER" in header and "--model target=" in header
    models = json.loads(stdout.getvalue())["engine"]["models"]
    assert {m["source"] for m in models.values()} == {"placeholder"}
    given = tmp_path / "given"
    extra = ["--model", "target=org/t-8b", "--model", "llama3.2-1b=/models/draft 1b"]
    assert run([*argv, "--emit", "vllm", *extra, "--out", str(given)]) == 0
    config = json.loads((given / "engine" / "vllm.json").read_text())
    assert config["model"] == "/models/draft 1b"
    words = args_of(given / "engine" / "vllm.args")
    assert json.loads(option(words, "--speculative-config"))["model"] == "/models/draft 1b"
    assert "org/t-8b (given with --model)" in (given / "engine" / "vllm.args").read_text()


@pytest.mark.slow
def test_speculation_off_is_the_plain_configuration(emitted, tmp_path):
    out = tmp_path / "off"
    argv = ["plan", "window", str(emitted.scenario), "--k", "0", "--loads", "2", *QUICK]
    assert run([*argv, "--emit", ALL, "--out", str(out)]) == 0
    engine = out / "engine"
    assert not (engine / "vllm.json").exists()
    assert "--speculative-config" not in args_of(engine / "vllm.args")
    assert not [a for a in args_of(engine / "sglang.args") if a.startswith("--speculative")]
    assert "speculative_config" not in yaml.safe_load((engine / "trtllm.yaml").read_text())
    summary = json.loads((out / "summary.json").read_text())
    assert summary["engine"]["recommended"]["drafter"] is None
    assert summary["engine"]["vllm"]["files"] == ["engine/vllm.args"]


# -- bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--emit", "vllm", "--model", "nosuch=org/x"], "--model: 'nosuch' is neither"),
        (["--emit", "vllm", "--model", "ngram=org/x"], "--model: 'ngram' is prompt lookup"),
        (["--model", "target=org/x"], "--model: model paths are for the engine configuration"),
        (["--emit", "vllm", "--model", "target=a", "--model", "target=b"], "named twice"),
        (["--emit", "tensorrt"], "--emit: 'tensorrt' is not an engine"),
    ],
)
def test_bad_emit_options_are_one_line_errors_before_any_work(extra, says, tmp_path, repo, capsys):
    scenario = write_scenario(tmp_path, repo, requests=50)
    out = tmp_path / "out"
    argv = ["plan", "window", str(scenario), "--k", "0..1", "--loads", "2", *QUICK, *extra]
    assert main([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0] and "fix:" in err[0]
    assert not out.exists()


def test_the_api_names_its_own_arguments_in_errors(tmp_path, repo):
    scenario = write_scenario(tmp_path, repo, requests=50)
    with pytest.raises(SpecsimError, match=r"^emit: 'x' is not an engine"):
        specsim.plan_window(scenario, k="0..1", loads=[2], emit="x")
    with pytest.raises(SpecsimError, match=r"^models: model paths are for the engine"):
        specsim.plan_window(scenario, k="0..1", loads=[2], models={"target": "org/t"})


@pytest.mark.slow
def test_a_setting_an_engine_refuses_leaves_nothing_written(emitted, tmp_path, monkeypatch):
    """The engines' files are rendered before anything is written, so a refused setting (a
    violated constraint) stops the whole plan's output, not half of it."""
    from specsim.serving import trtllm_config

    def refuse(document, *file):
        raise SpecsimError("planted", file="engine/trtllm.yaml", key="max_draft_len", fix="x")

    monkeypatch.setattr(trtllm_config, "check", refuse)
    out = tmp_path / "out"
    assert main([*emitted.argv, "--emit", ALL, "--out", str(out)]) == 2
    # The sweep's own records (points/, sweep.json) stay for a rerun; the plan is not written.
    written = {p.name for p in out.rglob("*") if p.is_file() and "points" not in p.parts}
    assert written <= {"sweep.json"}


# -- the choice, on hand-made outcomes ------------------------------------------------------------


def _window_plan(tmp_path, repo):
    scenario = write_scenario(tmp_path, repo, requests=100)
    return window.prepare(str(scenario), [], [0, 1, 2, 3, 4], [2.0, 4.0, 8.0], None)


def _verdict(rows, verdict="recommended", off_above=None):
    return {
        "loads": None,
        "rows": rows,
        "crossover": {"load": None, "last_paying": None},
        "verdict": {
            "verdict": verdict,
            "reason": "it wins",
            "speculation_off_above_load": off_above,
        },
    }


def test_a_recommended_table_is_emitted_with_the_static_k_for_sglang(tmp_path, repo):
    plan = _window_plan(tmp_path, repo)
    outcome = _verdict([{"max_batch": 16, "k": 4}, {"max_batch": 96, "k": 2}])
    outcome["loads"] = [
        window.LoadResult(load, best_k=k) for load, k in ((2.0, 4), (4.0, 3), (8.0, 2))
    ]
    choice = emit_choice.window_choice(plan, outcome)
    assert choice.rows == outcome["rows"] and choice.k == 4
    assert choice.static_k == 3  # the best static k at 4 req/s, the scenario's own load
    planned = SimpleNamespace(summary={}, report=Report("t"))
    emit.attach(planned, choice, emit.emit_request(ALL, None))
    files = planned.report.attachments
    config = json.loads(files["engine/vllm.json"])
    assert config["num_speculative_tokens_per_batch_size"] == [[1, 16, 4], [17, 96, 2]]
    trt = yaml.safe_load(files["engine/trtllm.yaml"])
    assert trt["speculative_config"]["draft_len_schedule"] == {16: 4, 96: 2}
    sglang = shlex.split(files["engine/sglang.args"], comments=True)
    assert option(sglang, "--speculative-num-steps") == "3"
    assert planned.summary["engine"]["sglang"]["not_expressible"]
    assert planned.summary["engine"]["recommended"]["k_by_batch"] == outcome["rows"]


def test_past_the_crossover_the_files_say_to_turn_speculation_off(tmp_path, repo):
    plan = _window_plan(tmp_path, repo)
    outcome = _verdict([], verdict="not recommended", off_above=4.0)
    outcome["crossover"] = {"load": 8.0, "last_paying": 4.0}
    outcome["loads"] = [
        window.LoadResult(load, best_k=k) for load, k in ((2.0, 3), (4.0, 2), (8.0, 0))
    ]
    choice = emit_choice.window_choice(plan, outcome)
    assert (choice.drafter, choice.k, choice.rows) == ("llama3.2-1b", 2, [])
    assert "turns speculation off above 4 req/s" in choice.unexpressed[0]


def test_the_adaptive_policy_is_not_expressible_and_its_best_static_stands_in(tmp_path, repo):
    from specsim.planning.capacity import capacity

    scenario = write_scenario(tmp_path, repo, requests=100, slo={"ttft_s": 1.0, "tpot_s": 0.05})
    plan = capacity.prepare(str(scenario), [], 12.0, None, [1, 2], 0.2, 0.99, None)

    def result(label, drafter, k, policy, replicas, rps):
        candidate = capacity.Candidate(label, drafter, k, policy)
        return SimpleNamespace(
            candidate=candidate, replicas=replicas, capacity=rps, cost_per_hour=replicas * 2.0
        )

    candidates = [
        result("speculation off", None, 0, "fixed", 3, 5.0),
        result("llama3.2-1b k=1", "llama3.2-1b", 1, "fixed", 2, 6.5),
        result("llama3.2-1b k=2", "llama3.2-1b", 2, "fixed", 2, 7.0),
        result("llama3.2-1b adaptive", "llama3.2-1b", 2, "adaptive", 2, 8.0),
    ]
    outcome = {"chosen": candidates[-1], "candidates": candidates, "fleet": [(2, None)]}
    choice = emit_choice.capacity_choice(plan, outcome)
    assert (choice.drafter, choice.k) == ("llama3.2-1b", 2)  # k=2: most capacity of 2 replicas
    (note,) = choice.unexpressed
    assert "goodput-adaptive policy" in note and "llama3.2-1b k=2" in note
    assert [load.rate for load in choice.loads] == [6.0, 8.0]  # each replica's share, capacity
    planned = SimpleNamespace(summary={}, report=Report("t"))
    emit.attach(planned, choice, emit.emit_request(ALL, None))
    for engine in ("vllm", "sglang", "trtllm"):
        assert note in planned.summary["engine"][engine]["not_expressible"]
    assert note in planned.summary["engine"]["recommended"]["not_expressible"]
    text = " ".join(planned.report.attachments["engine/trtllm.yaml"].replace("#   ", "").split())
    assert "Not expressible: the goodput-adaptive policy" in text


def test_unconditional_rates_chain_the_simulators_conditional_ones(tmp_path, repo):
    from specsim.simulation.acceptance import extend_rates, window_rates

    plan = _window_plan(tmp_path, repo)
    outcome = _verdict([], verdict="not recommended")
    outcome["loads"] = [window.LoadResult(4.0, best_k=4)]
    choice = emit_choice.window_choice(plan, outcome)
    rates = emit.unconditional_rates(choice, 4)
    entry = plan.profile.acceptance("llama3.2-1b", "rejection", 1.0)
    conditional = extend_rates(window_rates(entry), 4)
    assert np.allclose(rates, np.cumprod(conditional), rtol=0, atol=1e-15)
    # The profile's lengths are 1 + the sum of these (its mean_acceptance_length at k = 4).
    assert 1 + sum(rates) == pytest.approx(entry.mean_acceptance_length[4], abs=1e-9)


# -- the workload the bench sends ------------------------------------------------------------------


def test_exact_lengths_stay_exact_and_a_lognormal_keeps_its_mean(tmp_path, repo):
    from specsim.scenario import load_scenario

    scenario = load_scenario(write_scenario(tmp_path, repo, requests=100))
    lengths = ["workload.prompt={dist: fixed, value: 128}"]
    lengths.append("workload.output={dist: uniform, low: 8, high: 40}")
    fixed = load_scenario(write_scenario(tmp_path, repo, requests=100), lengths)
    assert emit_workload.length_range(fixed, "prompt")[0] == emit_workload.LengthRange(128, 128)
    assert emit_workload.length_range(fixed, "output")[0] == emit_workload.LengthRange(8, 40)
    span, text = emit_workload.length_range(scenario, "prompt")
    # lognormal median 300, sigma 0.5, clipped at 1500: mean ~ 300 exp(0.125) = 340.
    assert abs((span.low + span.high) / 2 - 340) < 4
    assert "no long tail" in text


def test_a_trace_is_sent_at_its_mean_rate_with_its_gaps_shape(repo):
    from specsim.scenario import load_scenario

    scenario = load_scenario(repo / "scenarios" / "chat.yaml")
    columns = emit_workload.trace_columns(scenario)
    plan, notes = emit_workload.bench_plan(
        scenario, [emit_workload.PlannedLoad("speed-1", "1x", 2.0, None, 100)]
    )
    assert abs((plan.prompt.low + plan.prompt.high) / 2 - columns["prompt"].mean()) <= 1
    gaps = columns["gaps"]
    assert plan.burstiness == pytest.approx((gaps.mean() / gaps.std()) ** 2, rel=1e-3)
    assert any("not replayed" in note for note in notes)


@pytest.mark.slow
def test_the_outputs_reference_names_every_engine_file_and_key(emitted):
    from specsim.docs.outputs_engine import ENGINE_FILES, ENGINE_SUMMARY_KEYS
    from specsim.serving.bench_commands import RESULTS

    for name in ENGINE_FILES:
        if "/bench/" in name:  # bench.sh writes these, where the reference says
            client = name.split("/")[2]
            assert name.startswith(f"engine/{RESULTS[client]}/LABEL."), name
            continue
        if name == "engine/sglang-adaptive.json":  # policy adaptive_steps only: not this plan
            assert not (emitted.out / name).exists()
            continue
        assert (emitted.out / name).is_file(), name
    block = json.loads((emitted.out / "summary.json").read_text())["engine"]
    documented = {part.split(".", 1)[1] for key in ENGINE_SUMMARY_KEYS for part in key.split(", ")}
    assert set(block) == documented


def test_a_closed_loop_sends_as_many_requests_as_its_simulation_completed(tmp_path, repo):
    """Its clients' pace and the duration end a closed loop before its request limit (500)."""
    scenario = write_scenario(tmp_path, repo, kind="closed_loop", requests=500)
    plan = window.prepare(str(scenario), [], [0, 2], [4.0], None)
    run = SimpleNamespace(ok=True, summary={"requests": 86})
    outcome = _verdict([], verdict="not recommended")
    outcome["loads"] = [window.LoadResult(4.0, by_config={"k=2": run}, best_k=2)]
    (load,) = emit_choice.window_choice(plan, outcome).loads
    assert (load.label, load.rate, load.clients, load.requests) == ("concurrency-4", None, 4, 86)


@pytest.mark.parametrize(
    "scenario, flags",
    [
        ("chat-70b-tp4.yaml", {"--tensor-parallel-size": "4"}),
        (
            "chat-70b-fp8.yaml",
            {"--tensor-parallel-size": "1", "--quantization": "fp8", "--kv-cache-dtype": "fp8"},
        ),
    ],
)
def test_the_profiles_split_and_formats_reach_the_engine_files(scenario, flags, tmp_path, repo):
    """A plan on the shipped 70B scenarios (30 s of their trace) writes the profile's tensor
    parallelism and FP8 formats into vLLM's arguments, and the TP into SGLang's and TRT-LLM's."""
    out = tmp_path / "out"
    argv = ["plan", "window", str(repo / "scenarios" / scenario), "--k", "0,2", "--loads", "1"]
    argv += ["--set", "workload.duration_s=30", *QUICK, "--emit", ALL, "--out", str(out)]
    assert run(argv) == 0
    words = args_of(out / "engine" / "vllm.args")
    assert {flag: option(words, flag) for flag in flags} == flags
    tp = flags["--tensor-parallel-size"]
    assert option(args_of(out / "engine" / "sglang.args"), "--tp-size") == tp
    trt = yaml.safe_load((out / "engine" / "trtllm.yaml").read_text())
    assert trt["tensor_parallel_size"] == int(tp)


@pytest.mark.parametrize(
    ("name", "message", "fix"),
    [
        ("nosuch", "is neither the target nor a drafter of the profile", "name one of: target, d"),
        ("ng", "is prompt lookup, which has no model", "drop --model ng=..."),
        (
            "m",
            "is the target's MTP module, which loads from the target's checkpoint",
            "drop --model m=... (give --model target=... instead)",
        ),
    ],
)
def test_a_model_path_for_what_has_no_model_of_its_own_is_refused(name, message, fix):
    drafters = {
        "ng": SimpleNamespace(kind="ngram", method=None),
        "m": SimpleNamespace(kind="draft_model", method="mtp"),
        "d": SimpleNamespace(kind="draft_model", method=None),
    }
    profile = SimpleNamespace(profile=SimpleNamespace(drafters=drafters))
    request = emit.EmitRequest(("vllm",), (("target", "org/t"), ("d", "org/d"), (name, "x")))
    with pytest.raises(SpecsimError) as caught:
        emit.check_models(request, [profile])
    assert (caught.value.key, caught.value.message, caught.value.fix) == (
        "--model",
        f"{name!r} {message}",
        fix.replace("target, d", "target, d, m, ng"),
    )
    emit.check_models(emit.EmitRequest(("vllm",), (("d", "org/d"),)), [profile])
