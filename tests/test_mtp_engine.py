"""DeepSeek-V3's MTP module as the engine's drafter (``specsim.models.deepseek_mtp``,
``specsim.engine.mtp_step``).

The folder: transformers' ``DeepseekV3ForCausalLM`` with four layers and seeded random weights
(``test_models_families.reference_model``), saved with its own ``save_pretrained``, then
declared as three layers plus one MTP module (``num_nextn_predict_layers: 1``): layer 3 is the
module's decoder block, and the test adds its ``enorm``, ``hnorm``, ``eh_proj`` and
``shared_head`` weights. It loads through the user path (``load_model``, ``load_mtp_drafter``,
``run_engine``'s ``mtp`` drafter).

Reference for the module's forward: transformers' own layer 3 run inside the four-layer model,
its input replaced (a forward pre-hook) by ``eh_proj([enorm(embed(next token)), hnorm(layer 2's
output)])`` with the embedding zeroed at position 0, its output through ``shared_head`` - the
composition of vLLM's ``deepseek_mtp.py`` written here with transformers' blocks and a
hand-written RMSNorm, none of specsim's code.

A vocabulary of 6 and a module built to guess the target's last prediction again (see
``write_folder``) make drafts partly accepted, partly rejected, so every rollback path runs.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from test_e2e_lossless import NEAR_TIE, exact_joint, greedy_divergences, greedy_reference
from test_engine import scenario_file
from test_engine_tree import AuditedEngine, OnePrompt
from test_models_families import assert_matches, reference_model

from specsim.engine.engine import EngineOptions, ServingEngine
from specsim.engine.generate import generate
from specsim.engine.run import run_engine
from specsim.engine.step import Faults, Sampling
from specsim.engine.workload import EngineRequest
from specsim.errors import SpecsimError
from specsim.models import load_model, load_mtp_drafter
from specsim.sampling.stats import detectable_tv, goodness_of_fit
from specsim.tree import TreeShape

VOCAB = 6
HIDDEN = 32  # test_models_families.COMMON's
GREEDY = Sampling(temperature=0.0, verifier="greedy")
FAULTS = {
    "hidden-after-norm": Faults(mtp_hidden_after_norm=True),
    "keeps-a-draft-entry": Faults(mtp_keep_draft_entry=True),
}


def rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.float()
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def write_folder(path, vocab: int = VOCAB, **config_changes):
    """(folder, transformers' four-layer model) with the MTP module as layer 3."""
    reference = reference_model("deepseek_v3", num_hidden_layers=4, vocab_size=vocab)
    with torch.no_grad():  # the module's block: its updates shrunk (below)
        for name, param in reference.model.layers[3].named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight", "down_proj")):
                param.mul_(0.2)
    full = path / "full"
    reference.save_pretrained(full)
    weights = load_file(full / "model.safetensors")
    generator = torch.Generator().manual_seed(3)
    # A module that guesses "the target's next token again" (the hidden state passed through,
    # the block's updates shrunk, the target's head), plus noise everywhere: the random target
    # repeats itself often enough that its drafts are partly accepted.
    mtp = "model.layers.3."
    for name in ("enorm", "hnorm"):
        weights[f"{mtp}{name}.weight"] = 0.5 + torch.rand(HIDDEN, generator=generator)
    weights[f"{mtp}shared_head.norm.weight"] = weights["model.norm.weight"].clone()
    weights[f"{mtp}eh_proj.weight"] = torch.cat(
        [torch.randn(HIDDEN, HIDDEN, generator=generator) * 0.2, torch.eye(HIDDEN)], dim=1
    )
    noise = torch.randn(vocab, HIDDEN, generator=generator) * 0.1
    weights[f"{mtp}shared_head.head.weight"] = weights["lm_head.weight"] + noise
    config = json.loads((full / "config.json").read_text())
    config.update(num_hidden_layers=3, num_nextn_predict_layers=1, **config_changes)
    folder = path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    save_file(weights, str(folder / "model.safetensors"))
    return folder, reference, weights


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return write_folder(tmp_path_factory.mktemp("mtp"))


@pytest.fixture(scope="module")
def models(built):
    target = load_model(built[0])
    return target, load_mtp_drafter(built[0], target)


def prompts(n: int = 5, seed: int = 2) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (4 + 3 * i,), generator=generator).tolist() for i in range(n)]


def test_each_load_reads_only_its_own_tensors(built, monkeypatch):
    """The target's load never reads the MTP layer, and the drafter's reads nothing else (on
    DeepSeek-V3 the rest is the whole 671B checkpoint)."""
    from specsim.models import fp8

    read: list[str] = []
    check = fp8.check_stored
    monkeypatch.setattr(
        fp8,
        "check_stored",
        lambda tensor, key, *rest: read.append(key) or check(tensor, key, *rest),
    )
    target = load_model(built[0])
    in_layer_3 = [k for k in read if k.startswith("model.layers.3.")]
    assert read and not in_layer_3
    read.clear()
    load_mtp_drafter(built[0], target)
    assert read and all(k.startswith("model.layers.3.") for k in read)


@torch.no_grad()
def reference_mtp_logits(reference, weights, ids: torch.Tensor) -> torch.Tensor:
    """The module's logits at positions 0 .. T-2 of ``ids`` (composition in the docstring)."""
    eps = reference.config.rms_norm_eps
    w = {k.removeprefix("model.layers.3."): v for k, v in weights.items() if ".layers.3." in k}
    nxt = torch.cat([ids[:, 1:], ids[:, :1]], dim=1)  # the last column is never compared
    embedded = reference.model.embed_tokens(nxt)
    embedded[:, 0] = 0.0
    captured = {}

    def replace_input(module, args, kwargs):
        h = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
        x = torch.cat([rms(embedded, w["enorm.weight"], eps), rms(h, w["hnorm.weight"], eps)], -1)
        x = x @ w["eh_proj.weight"].T
        if "hidden_states" in kwargs:
            return args, {**kwargs, "hidden_states": x}
        return (x, *args[1:]), kwargs

    def keep_output(module, args, output):
        captured["out"] = output[0] if isinstance(output, tuple) else output

    layer = reference.model.layers[3]
    hooks = [
        layer.register_forward_pre_hook(replace_input, with_kwargs=True),
        layer.register_forward_hook(keep_output),
    ]
    try:
        reference(input_ids=ids, use_cache=False)
    finally:
        for hook in hooks:
            hook.remove()
    out = rms(captured["out"], w["shared_head.norm.weight"], eps)
    return (out @ w["shared_head.head.weight"].T)[:, :-1].float()


@torch.no_grad()
def test_the_module_matches_a_composition_of_transformers_layers(built, models):
    _, reference, weights = built
    target, mtp = models
    ids = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(1))
    _, hidden = target(ids, return_hidden=True)
    cache = mtp.new_cache(2, 16)
    logits, _ = mtp(ids[:, 1:], hidden[:, :-1], cache, torch.tensor([11, 11]))
    expected = reference_mtp_logits(reference, weights, ids)
    assert_matches(logits, expected, target.config)
    # Entry by entry through the cache (a prompt pass, then one entry a call) gives the same.
    cache = mtp.new_cache(2, 16)
    parts = [mtp(ids[:, 1:5], hidden[:, :4], cache, torch.tensor([4, 4]))[0]]
    for p in range(4, 11):
        parts.append(mtp(ids[:, p + 1 : p + 2], hidden[:, p : p + 1], cache, torch.ones(2))[0])
    assert_matches(torch.cat(parts, dim=1), expected, target.config)


@torch.no_grad()
@pytest.mark.parametrize("k", [1, 2, 3])
def test_greedy_mtp_speculation_gives_the_targets_own_tokens(models, k):
    """Ragged prompts (4 to 16 tokens) in one batch; the caches audited after every step."""
    target, mtp = models
    rows = prompts()
    run = generate(target, mtp, rows, 12, k, GREEDY, 0, audit=True)
    expected, margins = greedy_reference(target, rows, 12)
    near_ties = greedy_divergences(run.tokens, expected, margins)
    assert all(margin < NEAR_TIE for _, _, margin in near_ties), near_ties
    assert run.audit == []
    assert 1.0 < run.mean_acceptance_length < k + 1  # some drafts accepted, some rejected


@torch.no_grad()
@pytest.mark.parametrize("fault", FAULTS)
def test_planted_mtp_faults_fail_the_cache_audit(models, fault):
    # k = 2: the module's second pass makes the entry the off-by-one rollback keeps.
    target, mtp = models
    run = generate(target, mtp, prompts(), 12, 2, GREEDY, 0, FAULTS[fault], audit=True)
    assert any("MTP cache" in problem for problem in run.audit), run.audit[:3]


def serve(target, mtp, requests, sampling, k, bank, max_batch=3, audit=True, faults=None):
    options = EngineOptions(
        max_batch=max_batch,
        sampling=sampling,
        window=lambda rows: k,
        k_max=k,
        seed=11,
        faults=faults or Faults(),
    )
    engine = (AuditedEngine if audit else ServingEngine)(target, mtp, bank, options)
    engine.problems = []
    return engine.run(requests), engine


class Bank:
    def __init__(self, rows):
        self.rows = rows

    def prompt(self, index: int, length: int) -> list[int]:
        return self.rows[index % len(self.rows)][:length]


@torch.no_grad()
def test_served_mtp_speculation_gives_the_targets_greedy_tokens(models):
    """Rows joining and leaving the batch (the last row moved into a finished one's slot, its
    hidden states with it), owed different lengths; audited after every decode iteration."""
    target, mtp = models
    rows = prompts(8, seed=4)
    requests = [EngineRequest(i, 0.0, len(rows[i]), 3 + (5 * i) % 9) for i in range(8)]
    done, engine = serve(target, mtp, requests, GREEDY, 3, Bank(rows))
    assert engine.problems == []
    for request in done:
        expected, margins = greedy_reference(target, [request.prompt_ids], request.output_len)
        flips = greedy_divergences(torch.tensor([request.output_ids]), expected, margins)
        assert all(margin < NEAR_TIE for _, _, margin in flips), flips
    assert 0 < sum(r.accepted for r in done) < sum(r.drafted for r in done)
    assert max(engine.log.batch) == 3 and engine.log.kind.count("prefill") > 1


ALPHA = 0.01
REQUESTS = 1500
SAMPLED = Sampling(temperature=1.0, verifier="rejection")
TOKENS = 3


def served_fit(models, faults=None):
    """N = 1500 requests of one prompt, 3 tokens each at T = 1 (216 cells), k = 2, served 64 at
    a time from their own streams (seed 11), against the target's exact joint law."""
    target, mtp = models
    prompt = prompts(1, seed=7)[0]
    joint = exact_joint(target, prompt, SAMPLED, TOKENS)
    cells = sorted(joint)
    index = {c: i for i, c in enumerate(cells)}
    expected = np.array([joint[c] for c in cells])
    requests = [EngineRequest(i, 0.0, len(prompt), TOKENS) for i in range(REQUESTS)]
    done, _ = serve(target, mtp, requests, SAMPLED, 2, OnePrompt(prompt), 64, False, faults)
    counts = np.zeros(len(cells) + 1)
    for request in done:
        counts[index.get(tuple(request.output_ids), len(cells))] += 1
    result = goodness_of_fit(counts, np.append(expected, 0.0))
    return result, detectable_tv(expected, REQUESTS, ALPHA), done


@torch.no_grad()
def test_served_mtp_speculation_samples_the_targets_distribution(models):
    """A Cressie-Read test at alpha = 0.01 detects a total-variation departure of
    ``detectable_tv`` (printed; about 0.1) with 99 % power. Drafter bugs cannot move this law
    (verification corrects any q); the target's off-by-one rollback shows the test's power."""
    result, tv, done = served_fit(models)
    print(f"p = {result.p_value:.3g}, cells {result.cells}, detectable TV {tv:.3f}")
    assert 0 < sum(r.accepted for r in done) < sum(r.drafted for r in done)
    assert tv < 0.15
    assert result.p_value > ALPHA
    broken, _, _ = served_fit(models, Faults(target_rollback_extra=1))
    assert broken.p_value < ALPHA


def test_a_target_without_mtp_layers_is_refused_in_one_line(built, tmp_path):
    full = built[0].parent / "full"  # transformers' four plain layers
    config = json.loads((full / "config.json").read_text())
    config["num_nextn_predict_layers"] = 0
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    (tmp_path / "m" / "model.safetensors").write_bytes((full / "model.safetensors").read_bytes())
    target = load_model(tmp_path / "m")
    with pytest.raises(SpecsimError, match="no multi-token-prediction layers") as error:
        load_mtp_drafter(tmp_path / "m", target)
    assert "\n" not in str(error.value)


def test_an_mtp_layer_missing_from_the_checkpoint_is_refused_in_one_line(built, tmp_path):
    folder = built[0]
    weights = load_file(folder / "model.safetensors")
    del weights["model.layers.3.eh_proj.weight"]
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text((folder / "config.json").read_text())
    save_file(weights, str(tmp_path / "m" / "model.safetensors"))
    target = load_model(tmp_path / "m")
    with pytest.raises(SpecsimError, match="MTP weight missing") as error:
        load_mtp_drafter(tmp_path / "m", target)
    assert "model.layers.3.eh_proj.weight" in str(error.value) and "\n" not in str(error.value)


MTP_REFUSALS = {
    # (layer 3's tensors changed: None deletes, error with the folder written <dir>)
    "a missing tensor": (
        {"eh_proj.weight": None},
        "<dir>: model.layers.3.eh_proj.weight: MTP weight missing (1 in all); fix: download the "
        "complete checkpoint (its MTP layer included)",
    ),
    "a missing tensor of the block": (
        {"self_attn.kv_a_layernorm.weight": None},
        "<dir>: model.layers.3.self_attn.kv_a_layernorm.weight: MTP weight missing (1 in all); "
        "fix: download the complete checkpoint (its MTP layer included)",
    ),
    "a tensor of the wrong shape": (
        {"eh_proj.weight": torch.zeros(HIDDEN, HIDDEN)},
        "<dir>/model.safetensors: eh_proj.weight: MTP weight of shape (32, 32) does not fit the "
        "config; fix: use the config.json that belongs to these weights",
    ),
    "an unexpected tensor": (
        {"self_attn.o_proj.bias": torch.zeros(HIDDEN)},
        "<dir>/model.safetensors: block.self_attn.o_proj.bias: unexpected MTP weight for this "
        "architecture; fix: use the config.json that belongs to these weights",
    ),
    # The layer is read whole before it is checked: the missing tensor is named first.
    "a missing tensor and a misfit one": (
        {"enorm.weight": None, "eh_proj.weight": torch.zeros(HIDDEN, HIDDEN)},
        "<dir>: model.layers.3.enorm.weight: MTP weight missing (1 in all); fix: download the "
        "complete checkpoint (its MTP layer included)",
    ),
}


@pytest.mark.parametrize("fault", MTP_REFUSALS)
def test_an_mtp_layer_that_does_not_fit_is_refused_word_for_word(built, tmp_path, fault):
    """The MTP layer's refusals exactly (the target's: ``test_models_loader``)."""
    changes, expected = MTP_REFUSALS[fault]
    folder = built[0]
    weights = load_file(folder / "model.safetensors")
    weights.update({f"model.layers.3.{name}": tensor for name, tensor in changes.items()})
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text((folder / "config.json").read_text())
    kept = {k: v for k, v in weights.items() if v is not None}
    save_file(kept, str(tmp_path / "m" / "model.safetensors"))
    target = load_model(tmp_path / "m")
    with pytest.raises(SpecsimError) as error:
        load_mtp_drafter(tmp_path / "m", target)
    assert str(error.value).replace(str(tmp_path / "m"), "<dir>") == expected


def test_mtp_drafts_chains_only(models):
    target, mtp = models
    with pytest.raises(SpecsimError, match="chains only"):
        generate(target, mtp, prompts(2), 4, 1, GREEDY, 0, tree=TreeShape.parse("2"))


@pytest.fixture(scope="module")
def byte_folder(tmp_path_factory):
    """The same shape with the built-in byte tokenizer's vocabulary, for ``run_engine``."""
    path = tmp_path_factory.mktemp("mtp-bytes")
    tokens = dict(specsim_tokenizer="bytes", bos_token_id=256, eos_token_id=257)
    return write_folder(path, vocab=258, max_position_embeddings=96, **tokens)[0]


def test_a_scenario_naming_the_mtp_drafter_runs_it(byte_folder, tmp_path):
    scenario = scenario_file(tmp_path, speculation={"drafter": "mtp", "k": 2})
    run = run_engine(scenario, target=str(byte_folder))
    assert run.summary["scenario"]["drafter_model"] == "mtp"
    records = run.records
    assert (records["output_tokens"] == 1 + records["steps"] + records["accepted"]).all()
    assert records["drafted"].sum() > 0
    with pytest.raises(SpecsimError, match="no multi-token-prediction layers"):
        run_engine(scenario)  # the built-in target has none


def test_the_reference_clock_with_the_mtp_drafter_is_refused_in_one_line(byte_folder, tmp_path):
    scenario = scenario_file(tmp_path, speculation={"drafter": "mtp", "k": 2})
    with pytest.raises(SpecsimError, match="reference clock does not probe MTP") as error:
        run_engine(scenario, target=str(byte_folder), clock="reference")
    assert "\n" not in str(error.value)


def test_a_target_with_several_mtp_modules_is_refused_in_one_line(built, tmp_path):
    config = json.loads((built[0] / "config.json").read_text())
    config["num_nextn_predict_layers"] = 2
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    target = load_model(tmp_path / "m" / "config.json")
    with pytest.raises(SpecsimError, match="runs one MTP module; this target stores 2") as error:
        load_mtp_drafter(tmp_path / "m" / "config.json", target)
    assert "\n" not in str(error.value)


@torch.no_grad()
def test_a_config_alone_gives_a_seeded_random_module(built):
    """As ``load_model`` does for a config.json: random weights, the same for the same seed."""
    spec = built[0] / "config.json"
    target = load_model(spec)
    first, again = load_mtp_drafter(spec, target), load_mtp_drafter(spec, target)
    assert all(
        torch.equal(a, b)
        for a, b in zip(first.module.parameters(), again.module.parameters(), strict=True)
    )
    run = generate(target, first, prompts(3), 6, 2, GREEDY, 0, audit=True)
    assert run.audit == [] and run.tokens.shape == (3, 6)
