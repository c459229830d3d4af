"""Bad values and conditions: refused up front in one clean line (exit 2, nothing written),
never a traceback, a hang, a silent acceptance or a message naming the wrong thing."""

from __future__ import annotations

import errno
import importlib
import os
from pathlib import Path

import pytest
import yaml

from specsim.cli import main
from specsim.errors import SpecsimError

REPO = Path(__file__).resolve().parent.parent
PROFILE = REPO / "profiles" / "llama3.1-8b_llama3.2-1b_h100-roofline.yaml"
HARDWARE = REPO / "profiles" / "hardware" / "h100-sxm.yaml"
MODELS = REPO / "profiles" / "models"
SCENARIO = {
    "profile": str(PROFILE),
    "workload": {
        "kind": "poisson",
        "rate": 4.0,
        "requests": 20,
        "prompt": {"dist": "fixed", "value": 100},
        "output": {"dist": "fixed", "value": 20},
    },
    "speculation": {"drafter": "llama3.2-1b", "k": 2},
}


def refused(argv: list, capsys, *names: str) -> str:
    """Run the command; it exits 2 with one line naming ``names`` and a fix."""
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exc:  # a usage error, from the parser
        code = exc.code
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2, lines
    assert len(lines) == 1 and "; fix: " in lines[0], lines
    for name in names:
        assert name in lines[0], (name, lines[0])
    return lines[0]


def write(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def scenario_with(tmp_path: Path, **sections) -> Path:
    data = {**SCENARIO, **{k: {**SCENARIO.get(k, {}), **v} for k, v in sections.items()}}
    return write(tmp_path / "s.yaml", data)


def profile_with(tmp_path: Path, change) -> Path:
    data = yaml.safe_load(PROFILE.read_text())
    change(data)
    return write(tmp_path / "p.yaml", data)


def simulate_refused(tmp_path: Path, scenario: Path, capsys, *names: str) -> str:
    line = refused(["simulate", scenario, "--out", tmp_path / "out"], capsys, *names)
    assert not (tmp_path / "out").exists()
    return line


# -- tracebacks --------------------------------------------------------------------------------


def test_a_full_disk_is_one_line_and_leaves_nothing(tmp_path, capsys, monkeypatch):
    simulate = importlib.import_module("specsim.api.simulate")

    def disk_full(staging, scenario, baseline):
        (staging / "requests.csv").write_text("half")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(staging / "requests.csv"))

    monkeypatch.setattr(simulate, "simulate_into", disk_full)
    scenario = scenario_with(tmp_path)
    line = simulate_refused(tmp_path, scenario, capsys, "requests.csv", "No space left")
    assert "--out" in line
    assert [p.name for p in tmp_path.iterdir()] == ["s.yaml"]


def test_a_link_too_slow_for_the_scaled_profile_names_the_link(tmp_path, capsys):
    # 1 byte/s passes the schema; at 1% of it the scaled passes take longer than any run.
    link = {"bandwidth_bytes_per_s": 1e-300, "latency_s": 1e-6, "efficiency": 0.01}
    for bandwidth, names in ((1e-300, ("greater than or equal to 1",)), (1, ("out of bounds",))):
        link["bandwidth_bytes_per_s"] = bandwidth
        engine = {"tensor_parallel_size": 2, "tensor_parallel_scaling": link}
        scenario = scenario_with(tmp_path, engine=engine)
        simulate_refused(tmp_path, scenario, capsys, "bandwidth_bytes_per_s", *names)


@pytest.mark.parametrize("option", ["--seed", "--samples"])
def test_a_5000_digit_option_value_is_one_short_line(capsys, option):
    line = refused(["check", "sampler", option, "9" * 5000], capsys, option)
    assert len(line) < 300


# -- hangs -------------------------------------------------------------------------------------


@pytest.mark.parametrize("option", ["--alpha", "--temperature"])
def test_a_denormal_level_or_temperature_is_refused(capsys, option):
    # A level hangs the sample-size search; a temperature divides logits into nan.
    refused(["check", "sampler", option, "5e-324", "--samples", "0"], capsys, option)


def test_a_load_list_past_the_cap_is_refused(tmp_path, capsys):
    loads = ",".join(str(i + 1) for i in range(10_000))
    argv = ["plan", "window", scenario_with(tmp_path), "--loads", loads, "--out", tmp_path / "o"]
    refused(argv, capsys, "--loads", "10,000 loads", "at most 64")
    assert not (tmp_path / "o").exists()


def test_json_lines_under_another_suffix_are_read_as_json(tmp_path):
    from specsim.errors import SpecsimError
    from specsim.workload.prompts import read_prompts

    prompts = tmp_path / "prompts.json"
    prompts.write_text('{"question": "what?"}\n')
    with pytest.raises(SpecsimError, match=r"prompts.json: line 1: no non-empty 'prompt'"):
        read_prompts(prompts)
    prompts.write_text('{"prompt": "what?"}\n{"text": "why?"}\n')
    assert read_prompts(prompts) == ["what?", "why?"]


# -- silent acceptance -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key, value",
    [("rate", 5e-324), ("rate", 1e-300)],
)
def test_a_positive_past_any_real_one_is_refused(tmp_path, capsys, key, value):
    scenario = scenario_with(tmp_path, workload={key: value})
    simulate_refused(tmp_path, scenario, capsys, f"workload.{key}", "greater than or equal")


def test_a_drafter_with_an_empty_name_is_refused(tmp_path, capsys):
    def rename(data):
        data["drafters"][""] = data["drafters"].pop("llama3.2-1b")

    profile = profile_with(tmp_path, rename)
    scenario = write(tmp_path / "s.yaml", {**SCENARIO, "profile": str(profile)})
    simulate_refused(tmp_path, scenario, capsys, "p.yaml", "drafters", "the name is empty")


def test_a_per_position_list_longer_than_any_window_is_refused(tmp_path, capsys):
    def lengthen(data):
        data["acceptance"][0]["per_position"] = [0.5] * 200

    profile = profile_with(tmp_path, lengthen)
    scenario = write(tmp_path / "s.yaml", {**SCENARIO, "profile": str(profile)})
    simulate_refused(tmp_path, scenario, capsys, "acceptance[0].per_position", "at most 32")


# -- messages naming the wrong thing -----------------------------------------------------------


def test_a_draft_model_without_a_config_names_the_option(tmp_path, capsys):
    argv = ["plan", "capacity", scenario_with(tmp_path), "--target-rps", "10"]
    argv += ["--hardware", HARDWARE, "--target-model", MODELS / "llama3.1-8b.json"]
    argv += ["--draft-model", "small", "--out", tmp_path / "o"]
    refused(argv, capsys, "--draft-model", "'small'", "NAME=CONFIG.json")


def test_a_bad_tree_in_a_pool_is_refused_as_at_the_top_level(tmp_path, capsys):
    pools = [{"name": "a"}, {"name": "b", "speculation": {"tree": "2,x"}}]
    scenario = scenario_with(tmp_path, fleet={"pools": pools})
    simulate_refused(tmp_path, scenario, capsys, "fleet.pools[1] ('b')", "speculation.tree")
    pools[1]["speculation"] = {"policy": "by_batch"}
    scenario = scenario_with(tmp_path, fleet={"pools": pools})
    simulate_refused(tmp_path, scenario, capsys, "fleet.pools[1]", "needs a 'k_by_batch' table")


def test_a_misspelt_key_is_named_with_the_key_it_resembles(tmp_path, capsys):
    data = {**SCENARIO, "worklaod": SCENARIO["workload"]}
    del data["workload"]
    line = simulate_refused(tmp_path, write(tmp_path / "s.yaml", data), capsys, "worklaod")
    assert "rename it to 'workload'" in line
    data = {**SCENARIO, "colour": "red"}
    line = simulate_refused(tmp_path, write(tmp_path / "s.yaml", data), capsys, "colour")
    assert "remove the key or check its spelling" in line


def test_requests_nearly_alike_give_no_concentration_rather_than_one_past_the_schema():
    import numpy as np

    from specsim.profiling.acceptance import request_concentration

    alike = [np.full(64, 0.5 + d) for d in (0.0, 1e-5, -1e-5, 2e-5, -2e-5)]
    assert request_concentration(alike) is None
    unlike = [np.full(64, m) for m in (0.3, 0.5, 0.7, 0.4, 0.6)]
    assert 1 < request_concentration(unlike) < 100


# -- safety ------------------------------------------------------------------------------------


def test_a_linked_folder_inside_out_is_refused_before_the_run(tmp_path, capsys):
    elsewhere, out = tmp_path / "elsewhere", tmp_path / "out"
    elsewhere.mkdir()
    out.mkdir()
    (out / "points").symlink_to(elsewhere)
    argv = ["plan", "window", scenario_with(tmp_path), "--k", "0", "--loads", "1", "--out", out]
    refused(argv, capsys, "points is a symbolic link", "--out")
    assert list(elsewhere.iterdir()) == [] and sorted(p.name for p in out.iterdir()) == ["points"]


def test_results_are_not_moved_through_a_linked_folder_deeper_in_out(tmp_path):
    from specsim.errors import SpecsimError
    from specsim.fileio import atomic_output_dir

    elsewhere, out = tmp_path / "elsewhere", tmp_path / "out"
    elsewhere.mkdir()
    (out / "engine").mkdir(parents=True)
    (out / "engine" / "v1").symlink_to(elsewhere)
    linked = r"out: --out: .*engine/v1 is a symbolic link"
    with pytest.raises(SpecsimError, match=linked), atomic_output_dir(out) as staging:
        (staging / "summary.json").write_text("{}")
        (staging / "engine" / "v1").mkdir(parents=True)
        (staging / "engine" / "v1" / "vllm.json").write_text("{}")
    assert list(elsewhere.iterdir()) == [] and not (out / "summary.json").exists()
    with atomic_output_dir(out) as staging:  # a run that writes nothing under the link is fine
        (staging / "summary.json").write_text("{}")
    assert (out / "summary.json").read_text() == "{}"


def test_plain_tcp_to_another_machine_warns_and_loopback_does_not():
    from specsim.planning.sweep.cluster import _loopback

    assert _loopback("127.0.0.1:8786") and _loopback("tcp://localhost:8786")
    assert _loopback("tcp://[::1]:8786")
    assert not _loopback("10.0.0.5:8786") and not _loopback("tcp://scheduler.lan:8786")


def test_plain_tcp_cluster_warns_before_connecting(monkeypatch):
    """No packet leaves the machine: the client refuses at once, as an unreachable host would."""
    import dask.distributed

    from specsim.errors import SpecsimError
    from specsim.planning.sweep import cluster

    def refused(*args, **kwargs):
        raise OSError("connection refused")

    monkeypatch.setattr(dask.distributed, "Client", refused)
    warned = pytest.warns(UserWarning, match="plain TCP to another machine")
    with warned, pytest.raises(SpecsimError, match="cannot reach a Dask scheduler"):
        cluster.connect_cluster("tcp://scheduler.example:9", 0.2)


# -- a plan of which nothing succeeded ---------------------------------------------------------


def test_a_plan_whose_simulations_all_failed_exits_2_and_writes_no_report(tmp_path, capsys):
    """The command line exits 2; the Python API raises the same one-line error (a script
    exits non-zero) and writes nothing either."""
    argv = ["plan", "window", scenario_with(tmp_path), "--k", "0..1", "--loads", "1"]
    argv += ["--workers", "1", "--no-progress"]
    failing = [*argv, "--out", tmp_path / "o", "--set", "engine.kv_capacity_tokens=50"]
    assert main([str(a) for a in failing]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]  # after each point's own line
    assert last.startswith("specsim plan: error: all 3 simulations failed") and "; fix: " in last
    assert not (tmp_path / "o" / "summary.json").exists()
    assert main([str(a) for a in [*argv, "--out", tmp_path / "ok"]]) == 0
    import specsim

    with pytest.raises(SpecsimError, match="all 3 simulations failed"):
        specsim.plan_window(
            scenario_with(tmp_path), k="0..1", loads=[1], workers=1, progress=False,
            out=tmp_path / "api", engine__kv_capacity_tokens=50,
        )  # fmt: skip
    assert not (tmp_path / "api" / "summary.json").exists()
