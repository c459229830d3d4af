"""Engine caps: read from a server's log or flags file, else the engine version's defaults for
the device, and always said which (``specsim.serving.caps``, ``specsim.calibration.caps``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from specsim.bounds import MAX_BATCH
from specsim.calibration.caps import device_of, resolve_caps
from specsim.errors import SpecsimError
from specsim.profile import load_profile
from specsim.serving import caps
from specsim.serving.caps import Device, read_server_args
from specsim.serving.detect import read_bench_files

DATA = Path(__file__).parent / "data" / "bench"
GB = 1e9


@pytest.mark.parametrize(
    ("rule", "text", "expected"),
    [
        (caps.VLLM, "vllm serve Qwen/Qwen3-8B --max-num-seqs 512 --port 8000", {"max_batch": 512}),
        (
            caps.VLLM,
            "INFO 12-02 non-default args: {'model': 'x', 'max_num_seqs': 64, "
            "'max_num_batched_tokens': 4096}",
            {"max_batch": 64, "max_batched_tokens": 4096},
        ),
        (caps.VLLM, "--max-num-batched-tokens=16384", {"max_batched_tokens": 16384}),
        (
            caps.SGLANG,
            "server_args=ServerArgs(model_path='x', chunked_prefill_size=8192, "
            "max_running_requests=48, max_total_tokens=None)",
            {"max_batch": 48, "max_batched_tokens": 8192},
        ),
        (
            caps.TRTLLM,
            "max_batch_size: 128\nmax_num_tokens: 4096\n",
            {"max_batch": 128, "max_batched_tokens": 4096},
        ),
        (caps.VLLM, "cuda_graph_max_num_seqs_x 9; no caps here", {}),
    ],
    ids=["vllm-flags", "vllm-log", "vllm-equals", "sglang-server-args", "trtllm-yaml", "none"],
)
def test_caps_are_read_from_a_log_or_flags_in_the_engine_s_own_keys(rule, text, expected):
    assert read_server_args(text, rule) == expected


@pytest.mark.parametrize(
    ("device", "expected"),
    [
        (Device("NVIDIA H200 SXM 141GB", 141 * GB), (1024, 8192)),
        (Device("NVIDIA H100 SXM5 80GB", 80 * GB), (1024, 8192)),
        (Device("NVIDIA A100 SXM4 80GB", 80 * GB), (256, 2048)),  # an A100 is excluded
        (Device("NVIDIA B200 180GB", 180 * GB), (1024, 16384)),
        (Device("NVIDIA L40S 48GB", 48 * GB), (256, 2048)),
        (None, (256, 2048)),
    ],
)
def test_vllm_defaults_follow_the_device_as_its_engine_args_do(device, expected):
    batch, tokens, why = caps.VLLM.defaults(device, False)
    assert (batch, tokens) == expected and why.startswith("vLLM 0.33's API-server default")


def test_sglang_defaults_depend_on_speculation_and_memory():
    h100 = Device("NVIDIA H100 SXM5 80GB", 80 * GB)
    assert caps.SGLANG.defaults(h100, True)[:2] == (48, 8192)
    assert caps.SGLANG.defaults(h100, False)[:2] == (MAX_BATCH, 8192)  # KV-cache bound
    assert caps.SGLANG.defaults(Device("RTX 4090 24GB", 24 * GB), False)[1] == 2048
    assert caps.TRTLLM.defaults(None, False)[:2] == (2048, 8192)


def test_each_cap_says_where_it_came_from(tmp_path):
    prior = load_profile(DATA / "calibration_prior.yaml")
    runs = read_bench_files([DATA / "vllm_v33_spec.json"])
    device = device_of(prior.profile)
    assert (device.name, device.memory_bytes) == ("test-gpu", 80e9)
    defaults = resolve_caps(runs, {}, None, prior.profile)
    assert (defaults.max_batch, defaults.max_batched_tokens) == (1024, 8192)
    assert all(
        s.startswith("vLLM 0.33's API-server default (test-gpu, 75 GiB)") for s in defaults.sources
    )
    log = tmp_path / "server.log"
    log.write_text("vllm serve m --max-num-seqs 96\n")
    given = {"max_batched_tokens": (2048, "the command line (--max-batched-tokens)")}
    mixed = resolve_caps(runs, given, str(log), prior.profile)
    assert (mixed.max_batch, mixed.max_batched_tokens) == (96, 2048)
    assert mixed.sources == ("server.log (max_num_seqs)", "the command line (--max-batched-tokens)")
    log.write_text("nothing about caps\n")
    with pytest.raises(SpecsimError, match="states none of the engine's batch caps"):
        resolve_caps(runs, {}, str(log), prior.profile)


@pytest.mark.parametrize(
    ("text", "on"),
    [
        ("python -m sglang.launch_server --model-path m --enable-mixed-chunk --tp 2", True),
        ("server_args=ServerArgs(model_path='m', enable_mixed_chunk=True, tp_size=1)", True),
        ("server_args=ServerArgs(model_path='m', enable_mixed_chunk=False, tp_size=1)", False),
        ("enable_mixed_chunk: true\n", True),
        ("--enable-mixed-chunk-size 3 (another flag)", False),
        ("no such flag", False),
    ],
)
def test_a_switch_is_read_from_a_log_or_flags_in_each_of_their_forms(text, on):
    assert caps.states_flag(text, "enable_mixed_chunk") is on


def test_sglang_runs_replay_prefill_apart_unless_its_server_mixes_them(tmp_path):
    """SGLang runs prefill batches apart from decode batches (enable_mixed_chunk off by
    default): its runs replay with engine.chunked_prefill false and say why; a server log that
    turns the flag on mixes them, as vLLM's runs always are."""
    from specsim.calibration.workload import replay

    prior = load_profile(DATA / "calibration_prior.yaml")
    sglang = read_bench_files([DATA / "sglang_two_runs.jsonl"])
    defaults = resolve_caps(sglang, {}, None, prior.profile)
    assert defaults.prefill_apart
    rebuilt = replay(sglang[0], tmp_path / "a.csv", None, defaults)
    assert rebuilt.engine["chunked_prefill"] is False
    assert "enable_mixed_chunk off" in rebuilt.engine_sources["chunked_prefill"]
    assert rebuilt.scenario(str(DATA / "calibration_prior.yaml")).engine.chunked_prefill is False
    log = tmp_path / "server.log"
    log.write_text("launch_server --model-path m --max-running-requests 48 --enable-mixed-chunk\n")
    mixed = resolve_caps(sglang, {}, str(log), prior.profile)
    assert not mixed.prefill_apart and "server.log (enable_mixed_chunk on" in mixed.prefill_source
    assert "chunked_prefill" not in replay(sglang[0], tmp_path / "b.csv", None, mixed).engine
    vllm = read_bench_files([DATA / "vllm_v33_spec.json"])
    assert not resolve_caps(vllm, {}, None, prior.profile).prefill_apart
