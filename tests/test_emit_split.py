"""``--emit`` for ``plan capacity --disaggregated`` (``specsim.planning.emit.emit_split``): each
pool's engine files, checked key by key, the engines' disaggregation options, a refusal in one
line, and files of an earlier run removed."""

from __future__ import annotations

import json
import shlex
from types import SimpleNamespace

import pytest
import yaml
from test_capacity_split import plan_argv, split_scenario

from specsim.cli import main
from specsim.serving import sglang_config, trtllm_config, vllm_config, vllm_keys
from specsim.serving.setting import EngineSetting, ModelRef, Speculative
from specsim.tree import TreeShape

MODEL = "llama3.2-1b=meta-llama/Llama-3.2-1B-Instruct"


def _args(path) -> dict[str, str | None]:
    words = shlex.split(path.read_text(), comments=True)
    out, i = {}, 0
    while i < len(words):
        value = words[i + 1] if i + 1 < len(words) and not words[i + 1].startswith("--") else None
        out[words[i]] = value
        i += 1 if value is None else 2
    return out


@pytest.fixture(scope="module")
def emitted(tmp_path_factory, repo):
    folder = tmp_path_factory.mktemp("split-emit")
    scenario = split_scenario(folder, repo)
    out = folder / "out"
    argv = [*plan_argv(scenario, repo, out, "0.3"), "--emit", "vllm,sglang,trtllm"]
    code = main([*argv, "--model", MODEL])
    summary = json.loads((out / "summary.json").read_text())
    return SimpleNamespace(code=code, out=out, summary=summary, argv=argv)


@pytest.mark.slow
def test_each_pool_gets_its_engine_files(emitted):
    assert emitted.code == 0
    block = emitted.summary["engine"]
    # The cheapest split choice: 1P1D on two TP1 replicas, with speculation (k = 3).
    assert block["recommended"] == {
        "layout": "1P1D (TP1 bf16 + TP1 bf16)",
        "setting": "speculation",
        "prefill_replicas": 1,
        "decode_replicas": 1,
        "drafter": "llama3.2-1b",
        "k": 3,
    }
    engine = emitted.out / "engine"
    assert sorted(p.name for p in engine.iterdir()) == [
        "sglang-decode.args",
        "sglang-prefill.args",
        "trtllm-decode.yaml",
        "trtllm-disagg.yaml",
        "trtllm-prefill.yaml",
        "vllm-decode.args",
        "vllm-decode.json",
        "vllm-prefill.args",
    ]
    assert block["bench"] is None


@pytest.mark.slow
def test_vllm_instances_carry_the_kv_transfer_config(emitted):
    engine = emitted.out / "engine"
    prefill, decode = _args(engine / "vllm-prefill.args"), _args(engine / "vllm-decode.args")
    transfer = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
    for args in (prefill, decode):
        assert json.loads(args["--kv-transfer-config"]) == transfer
        assert args["--tensor-parallel-size"] == "1" and args["--max-num-seqs"] == "96"
    assert "--speculative-config" not in prefill  # the prefill pool does not speculate
    spec = json.loads(decode["--speculative-config"])
    assert spec == json.loads((engine / "vllm-decode.json").read_text())
    assert spec["method"] == "draft_model" and spec["num_speculative_tokens"] == 3
    assert spec["model"] == "meta-llama/Llama-3.2-1B-Instruct"
    written = emitted.summary["engine"]["vllm"]["written"]
    assert written["prefill"]["kv_transfer_config"] == transfer
    assert written["prefill"]["speculative_config"] is None
    assert "proxy" in emitted.summary["engine"]["vllm"]["router"]


@pytest.mark.slow
def test_sglang_servers_carry_their_disaggregation_mode(emitted):
    engine = emitted.out / "engine"
    for role in ("prefill", "decode"):
        args = _args(engine / f"sglang-{role}.args")
        assert args["--disaggregation-mode"] == role
        assert args["--disaggregation-transfer-backend"] == "mooncake"
        assert args["--tp-size"] == "1" and args["--max-running-requests"] == "96"
        assert ("--speculative-algorithm" in args) == (role == "decode")
    decode = _args(engine / "sglang-decode.args")
    assert decode["--speculative-algorithm"] == "STANDALONE"
    assert decode["--speculative-num-steps"] == "3"
    assert decode["--speculative-num-draft-tokens"] == "4"
    router = emitted.summary["engine"]["sglang"]["router"]
    assert router.startswith("python -m sglang_router.launch_router --pd-disaggregation")


@pytest.mark.slow
def test_trtllm_servers_and_the_disaggregated_router_config(emitted):
    engine = emitted.out / "engine"
    prefill = yaml.safe_load((engine / "trtllm-prefill.yaml").read_text())
    decode = yaml.safe_load((engine / "trtllm-decode.yaml").read_text())
    for document in (prefill, decode):
        assert document["cache_transceiver_config"] == {"backend": "DEFAULT"}
        assert document["tensor_parallel_size"] == 1 and document["max_batch_size"] == 96
    assert "speculative_config" not in prefill
    assert decode["speculative_config"]["decoding_type"] == "Draft_Target"
    assert decode["speculative_config"]["max_draft_len"] == 3
    router = yaml.safe_load((engine / "trtllm-disagg.yaml").read_text())
    assert router == {
        "hostname": "localhost",
        "port": 8000,
        "backend": "pytorch",
        "context_servers": {"num_instances": 1, "urls": ["localhost:8001"]},
        "generation_servers": {"num_instances": 1, "urls": ["localhost:8002"]},
    }


@pytest.mark.slow
def test_a_rerun_removes_the_engine_files_it_no_longer_writes(emitted):
    argv = [a if a != "vllm,sglang,trtllm" else "sglang" for a in emitted.argv]
    assert main(argv) == 0
    names = sorted(p.name for p in (emitted.out / "engine").iterdir())
    assert names == ["sglang-decode.args", "sglang-prefill.args"]
    assert main([*emitted.argv, "--model", MODEL]) == 0  # restore the fixture's files


def test_the_trtllm_router_lists_every_server_on_its_own_port():
    """3 context and 2 generation servers: ports 8001-8003, then 8004-8005."""
    config = trtllm_config.disaggregated_config(3, 2)
    assert config["context_servers"] == {
        "num_instances": 3,
        "urls": ["localhost:8001", "localhost:8002", "localhost:8003"],
    }
    assert config["generation_servers"]["urls"] == ["localhost:8004", "localhost:8005"]


def _setting(role: str, tp: int, tree: TreeShape | None = None) -> EngineSetting:
    k = 2 if tree is None else tree.depth
    spec = Speculative(
        drafter="eagle",
        kind="heads",
        k=k,
        model=ModelRef("eagle", "org/eagle-head", "given"),
        unconditional_rates=(0.8, 0.6, 0.4)[:k],
        tree=tree,
    )
    target = ModelRef("target", "org/target", "given")
    return EngineSetting(target, 64, 4096, spec, tensor_parallel_size=tp, role=role)


def test_pools_of_different_tp_are_written_with_their_own():
    """A TP2 prefill pool and a TP4 decode pool: each file its own TP and name."""
    prefill = vllm_config.render(_setting("prefill", 2), ["h"])
    decode = vllm_config.render(_setting("decode", 4), ["h"])
    assert set(prefill.files) == {"vllm-prefill.args", "vllm-prefill.json"}
    assert set(decode.files) == {"vllm-decode.args", "vllm-decode.json"}
    assert "--tensor-parallel-size 2" in prefill.files["vllm-prefill.args"]
    assert "--tensor-parallel-size 4" in decode.files["vllm-decode.args"]
    assert "vllm-decode.args" in decode.start
    sglang = sglang_config.render(_setting("decode", 4), ["h"])
    assert list(sglang.files) == ["sglang-decode.args"]
    assert sglang.written["tp_size"] == 4 and sglang.written["disaggregation_mode"] == "decode"
    trt = trtllm_config.render(_setting("prefill", 2), ["h"])
    assert list(trt.files) == ["trtllm-prefill.yaml"]
    assert trt.written["tensor_parallel_size"] == 2


def test_an_engine_that_cannot_express_a_pool_is_refused_in_one_line():
    """vLLM 0.33 has no token tree: a decode pool drafting one is refused with its pool named,
    and nothing is written for vLLM."""
    from specsim.planning.emit.emit_split import _engine_files

    tree = TreeShape.parse("2,1")
    settings = {"prefill": _setting("prefill", 1), "decode": _setting("decode", 1, tree)}
    attachments: dict[str, str] = {}
    block = _engine_files("vllm", {}, settings, None, attachments)
    assert block["files"] == [] and attachments == {}
    assert block["refused"].startswith("the decode pool: vLLM 0.33's speculative_config has no")
    assert "\n" not in block["refused"]


@pytest.mark.parametrize(
    ("writer", "document", "key"),
    [
        (sglang_config, [("--max-running-requests", "8"), ("--disaggregation-mode", "both")],
         "--disaggregation-mode"),
        (sglang_config, [("--max-running-requests", "8"), ("--disaggregation-mode", "decode")],
         "--disaggregation-transfer-backend"),
    ],
)  # fmt: skip
def test_disaggregation_options_an_engine_rejects_are_not_written(writer, document, key):
    from specsim.errors import SpecsimError

    with pytest.raises(SpecsimError, match=key):
        writer.check(document)


def test_a_transfer_config_without_vllms_role_or_a_transceiver_backend_is_refused():
    from specsim.errors import SpecsimError

    bad_role = [("--kv-transfer-config", json.dumps({"kv_connector": "X", "kv_role": "both"}))]
    with pytest.raises(SpecsimError, match="kv_role"):
        vllm_keys.check_transfer(bad_role, "vllm-decode.args")
    document = {"max_batch_size": 1, "max_num_tokens": 1, "tensor_parallel_size": 1}
    with pytest.raises(SpecsimError, match=r"cache_transceiver_config\.backend"):
        trtllm_config.check({**document, "cache_transceiver_config": {"backend": "TCP"}})


@pytest.mark.slow
def test_the_outputs_reference_names_every_split_file_and_key(emitted):
    from specsim.docs.outputs_engine import SPLIT_ENGINE_FILES, SPLIT_SUMMARY_KEYS

    documented = {name for key in SPLIT_ENGINE_FILES for name in key.split(", ")}
    written = {f"engine/{p.name}" for p in (emitted.out / "engine").iterdir()}
    assert {n if n.startswith("engine/") else f"engine/{n}" for n in documented} == written
    keys = {part.split(".", 1)[1] for key in SPLIT_SUMMARY_KEYS for part in key.split(", ")}
    assert set(emitted.summary["engine"]) == keys


@pytest.mark.slow
def test_the_api_entry_emits_what_the_command_writes(emitted, repo):
    """plan_disaggregated(emit=..., models=...) kept in memory: the same engine files."""
    from test_capacity_split import ACCEPTANCE, DRAFT, H100, LLAMA_8B

    import specsim

    scenario = emitted.argv[2]
    result = specsim.plan_disaggregated(
        scenario,
        target_rps=30,
        max_replicas=3,
        tolerance=0.3,
        workers=2,
        progress=False,
        hardware=str(repo / H100),
        target_model=str(repo / LLAMA_8B),
        draft_models=[DRAFT.replace("=", f"={repo}/"), "ngram"],
        acceptance_from=str(repo / ACCEPTANCE),
        tp="1,2,3",
        emit="vllm,sglang,trtllm",
        models={"llama3.2-1b": MODEL.split("=", 1)[1]},
    )
    engine = {k: v for k, v in result.attachments.items() if k.startswith("engine/")}
    on_disk = {f"engine/{p.name}": p.read_text() for p in (emitted.out / "engine").iterdir()}
    # The headers name each run's own deployment profiles (its own folder); the rest is equal.
    assert set(engine) == set(on_disk)
    for name, text in engine.items():
        body = [line for line in text.splitlines() if not line.startswith("#")]
        assert body == [line for line in on_disk[name].splitlines() if not line.startswith("#")]
    assert result.summary["engine"]["recommended"] == emitted.summary["engine"]["recommended"]


def test_a_pools_refusal_names_that_pools_file():
    """Every check of a pool's options, speculation's included, names the pool's own file."""
    from specsim.errors import SpecsimError

    options = [("--max-running-requests", "8"), ("--speculative-num-steps", "3")]
    with pytest.raises(SpecsimError, match=r"sglang-decode\.args") as refused:
        sglang_config.check(options, "sglang-decode.args")
    assert "--speculative-num-steps" in str(refused.value)
    document = {"max_batch_size": 1, "max_num_tokens": 1, "tensor_parallel_size": 1}
    document["speculative_config"] = {"decoding_type": "Eagle", "max_draft_len": 2}
    document["speculative_config"]["speculative_model"] = "/models/eagle"
    document["speculative_config"]["eagle_choices"] = [[0], [0, 0], [1, 1]]
    with pytest.raises(SpecsimError, match=r"trtllm-decode\.yaml") as refused:
        trtllm_config.check(document, "trtllm-decode.yaml")
    assert "eagle_choices" in str(refused.value)
