"""DeepSeek-V3's MTP module as a roofline drafter: its passes by hand, and the refusals."""

from __future__ import annotations

import pytest
import yaml

from specsim.cli import main
from specsim.hardware import load_hardware
from specsim.profiling.model_configs import load_shape
from specsim.profiling.parallel import Layout
from specsim.profiling.roofline import roofline_fit

OWN = 11_610_068_224  # the module's own parameters (test_model_sizing_deepseek)
HEAD = 129_280 * 7_168  # the target's LM head, which every MTP pass multiplies by and reads
LATENT = 512 + 64  # one layer's latent and rotary key per token
BANDWIDTH = 4.8e12 * 0.8  # h200-sxm.yaml: peak bandwidth x efficiency
LAUNCH = 1.0e-5  # per layer per pass


@pytest.fixture
def paths(repo):
    return {
        "target": repo / "profiles" / "models" / "deepseek-v3.json",
        "hardware": repo / "profiles" / "hardware" / "h200-sxm.yaml",
        "acceptance": repo / "profiles" / "acceptance" / "deepseek-v3_mtp.assumed.yaml",
        "dense": repo / "profiles" / "models" / "llama3.1-8b.json",
    }


def roofline(paths, out, *extra, target=None):
    return main(
        [
            *("profile", "roofline", "--hardware", str(paths["hardware"])),
            *("--target", str(target or paths["target"]), "--drafter", "mtp=mtp"),
            *("--drafter", "ngram"),
            *("--acceptance-from", str(paths["acceptance"]), "--out", str(out), *extra),
        ]
    )


def test_one_device_bf16_pass_reads_the_module_and_the_targets_head(paths):
    """One pass: the layer and projection (held) plus the LM head (read, not held) at 2 bytes,
    one layer's launch; the slope is 2 FLOPs per matmul parameter at the bf16 peak x the H200
    file's MFU, 0.38 (fitted on H100 runs: docs/notes/2026-12-02-efficiency-priors.md)."""
    mtp = load_shape(paths["target"]).mtp_shape()
    fit = roofline_fit(mtp, load_hardware(paths["hardware"]), Layout())
    # the routed experts' read leaves fixed_s for the experts term (their union is read)
    read_all = fit.fixed_s + fit.experts.weights_s
    assert read_all == pytest.approx((OWN + HEAD) * 2 / BANDWIDTH + LAUNCH, rel=1e-12)
    assert fit.per_batched_token_s == pytest.approx(mtp.flops_per_token() / (989.4e12 * 0.38))
    assert fit.per_kv_token_s == pytest.approx(LATENT * 2 / BANDWIDTH)
    assert fit.per_attention_pair_s == pytest.approx(
        128 * (2 * LATENT + 2 * 512) / (989.4e12 * 0.38)
    )


def test_the_8xh200_fp8_profile_writes_a_draft_model_marked_mtp(paths, tmp_path):
    assert roofline(paths, tmp_path / "p.yaml", "--tp", "8", "--weights-dtype", "fp8") == 0
    doc = yaml.safe_load((tmp_path / "p.yaml").read_text())
    entry = doc["drafters"]["mtp"]
    assert entry["kind"] == "draft_model" and entry["method"] == "mtp"
    assert entry["params"] == OWN and entry["layers"] == 1
    assert entry["kv_bytes_per_token"] == LATENT * 2  # bf16 cache: --kv-dtype not given
    # Every device holds the latent whole (MLA), and an eighth of the module's weights.
    assert entry["sharding"]["kv_bytes_per_token_per_device"] == LATENT * 2
    held = entry["weight_bytes"]
    assert entry["sharding"]["weight_bytes_per_device"] == round(held / 8)
    assert held < 2 * OWN  # fp8 matrices (norms, router and projection stay 16-bit)
    # fixed: the shard and an eighth of the 16-bit head, one launch, two all-reduces of
    # 7 ring steps at 1 us each.
    fixed = (held + 2 * HEAD) / 8 / BANDWIDTH + LAUNCH + 2 * 2 * 7 * 1e-6
    fit = entry["latency"]["fit"]  # every routed expert read: fixed_s and the experts term
    assert fit["fixed_s"] + fit["experts"]["weights_s"] == pytest.approx(fixed, rel=1e-5)
    assert "MTP" in entry["description"] and "/" not in entry["description"].split()[-1]
    assert "multi-token-prediction module" in doc["provenance"]["notes"]
    assert {a["drafter"] for a in doc["acceptance"]} == {"mtp", "ngram"}


def test_a_target_without_mtp_layers_is_refused_in_one_line(paths, tmp_path, capsys):
    out = tmp_path / "p.yaml"
    assert roofline(paths, out, target=paths["dense"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "num_nextn_predict_layers" in err and "fix:" in err
    assert not out.exists()


def test_mtp_runs_over_the_targets_devices_only(paths, tmp_path, capsys):
    out = tmp_path / "p.yaml"
    assert roofline(paths, out, "--tp", "8", "--weights-dtype", "fp8", "--draft-tp", "1") == 2
    err = capsys.readouterr().err.strip()
    assert "--draft-tp" in err and "MTP" in err and len(err.splitlines()) == 1
    assert not out.exists()


def test_measuring_an_mtp_drafter_on_a_target_without_one_is_refused_before_it_loads(
    paths, tmp_path, capsys
):
    # An 8B target from its config.json alone: refused from the config, before 8 B random
    # weights are made.
    out = tmp_path / "p.yaml"
    code = main(
        [
            "profile",
            "measure",
            "--target",
            str(paths["dense"]),
            "--drafter",
            "m=mtp",
            "--out",
            str(out),
        ]
    )
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert "no multi-token-prediction layers" in err and "\n" not in err
    assert not out.exists()
