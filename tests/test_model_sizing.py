"""Model sizes by family, hand-worked and checked against the published parameter counts, and
the roofline of a mixture of experts (every expert in memory, the active ones computing).

Each hand count is written out below; ``published`` is the figure its source states, to the
precision stated there (exact counts where the source gives them). The roofline's shape
(``profiling.flops``, no torch) and the loader's config (``models.config``) size each model
independently, and must agree.
"""

from __future__ import annotations

import json

import pytest

from specsim.cli import main
from specsim.models import ModelConfig
from specsim.profile import load_profile
from specsim.profiling.flops import pass_cost
from specsim.profiling.model_configs import load_shape, shape_from_object

MIXTRAL_ATTENTION = 4096 * (4096 + 2 * 1024) + 4096 * 4096  # q, k, v, o: 41,943,040
MIXTRAL_EXPERT = 3 * 4096 * 14336  # gate, up, down: 176,160,768
MIXTRAL_LAYER_FIXED = MIXTRAL_ATTENTION + 4096 * 8 + 2 * 4096  # + router + two norms
MIXTRAL_EMBEDDINGS = 2 * 32000 * 4096 + 4096  # embedding, untied LM head, final norm
MIXTRAL_TOTAL = 32 * (MIXTRAL_LAYER_FIXED + 8 * MIXTRAL_EXPERT) + MIXTRAL_EMBEDDINGS
MIXTRAL_ACTIVE = 32 * (MIXTRAL_LAYER_FIXED + 2 * MIXTRAL_EXPERT) + MIXTRAL_EMBEDDINGS

# DeepSeek-V3: latent attention, 3 dense layers then 58 of 256 routed experts (8 per token) and
# one shared expert.
DEEPSEEK_ATTENTION = (
    7168 * 1536  # q_a_proj (query bottleneck)
    + 1536 * 128 * (128 + 64)  # q_b_proj: 128 heads of 128 plain + 64 rotary dims
    + 7168 * (512 + 64)  # kv_a_proj_with_mqa: the latent and the shared rotary key
    + 512 * 128 * (128 + 128)  # kv_b_proj: each head's key and value from the latent
    + 128 * 128 * 7168  # o_proj
)  # 187,105,280
DEEPSEEK_NORMS = 2 * 7168 + 1536 + 512  # two layer norms, the query's and the latent's
DEEPSEEK_EXPERT = 3 * 7168 * 2048  # 44,040,192
DEEPSEEK_ROUTER = 7168 * 256 + 256  # router and its score-correction bias
DEEPSEEK_DENSE = 3 * 7168 * 18432
DEEPSEEK_EMBEDDINGS = 2 * 129280 * 7168 + 7168  # embedding, untied LM head, final norm


def deepseek_v3(experts: int) -> int:
    """DeepSeek-V3's parameters with ``experts`` routed experts counted per MoE layer."""
    layers = 61 * (DEEPSEEK_ATTENTION + DEEPSEEK_NORMS) + 3 * DEEPSEEK_DENSE
    moe = 58 * ((experts + 1) * DEEPSEEK_EXPERT + DEEPSEEK_ROUTER)
    return layers + moe + DEEPSEEK_EMBEDDINGS


QWEN3_MOE_LAYER_FIXED = (
    2048 * (4096 + 2 * 512)
    + 4096 * 2048  # q, k, v, o: 18,874,368
    + 2048 * 128  # router
    + 2 * 2048  # two norms
    + 2 * 128  # q and k norms
)
QWEN3_MOE_EXPERT = 3 * 2048 * 768
QWEN3_MOE_EMBEDDINGS = 2 * 151936 * 2048 + 2048

# name: (hand-worked total, hand-worked active, [(published figure, what it counts, its
# precision)], source)
SIZES = {
    "deepseek-v3": (
        deepseek_v3(256),  # 671,026,419,200
        deepseek_v3(8),  # 37,552,297,472
        # 37.55 B with the embedding, 36.63 B without it: the report's 37 B is within 0.6 B
        # of both. The MTP module is not counted here (test_model_sizing_deepseek).
        [(671e9, "total", 0.5e9), (37e9, "active", 0.6e9)],
        "DeepSeek-AI, 'DeepSeek-V3 Technical Report' (2024): 671B total parameters, 37B "
        "activated for each token",
    ),
    "mixtral-8x7b": (
        MIXTRAL_TOTAL,  # 46,702,792,704
        MIXTRAL_ACTIVE,  # 12,879,925,248
        [(46.7e9, "total", 0.05e9), (12.9e9, "active", 0.05e9)],
        "Mistral AI, 'Mixtral of experts' (2023-12-11): 46.7B total, 12.9B used per token",
    ),
    "qwen3-30b-a3b": (
        48 * (QWEN3_MOE_LAYER_FIXED + 128 * QWEN3_MOE_EXPERT) + QWEN3_MOE_EMBEDDINGS,
        48 * (QWEN3_MOE_LAYER_FIXED + 8 * QWEN3_MOE_EXPERT) + QWEN3_MOE_EMBEDDINGS,
        # The card's 3.3B activated is 3.35B written to one decimal without rounding up.
        [(30.5e9, "total", 0.05e9), (29.9e9, "non-embedding", 0.05e9), (3.3e9, "active", 0.06e9)],
        "Qwen/Qwen3-30B-A3B model card: 30.5B total, 3.3B activated, 29.9B non-embedding",
    ),
    "qwen3-8b": (
        36 * (4096 * (4096 + 2 * 1024) + 4096 * 4096 + 3 * 4096 * 12288 + 2 * 4096 + 2 * 128)
        + 2 * 151936 * 4096
        + 4096,
        None,
        [(8.2e9, "total", 0.05e9), (6.95e9, "non-embedding", 0.005e9)],
        "Qwen/Qwen3-8B model card: 8.2B parameters, 6.95B non-embedding",
    ),
    "gemma-7b": (
        # Tied embeddings (Gemma's default) and head_dim 256: 16 heads x 256 = 4096 != 3072.
        28 * (3072 * 4096 * 2 + 3072 * 4096 * 2 + 3 * 3072 * 24576 + 2 * 3072)
        + 256000 * 3072
        + 3072,
        None,
        [(786_432_000, "embedding", 0), (7_751_248_896, "non-embedding", 0)],
        "Gemma Team, 'Gemma: Open Models Based on Gemini Research and Technology' (2024), "
        "Table 2: 7B has 786,432,000 embedding and 7,751,248,896 non-embedding parameters",
    ),
    "gemma-2-9b": (
        # Four norms per layer (pre and post attention and MLP).
        42 * (3584 * 4096 * 2 + 3584 * 2048 * 2 + 3 * 3584 * 14336 + 4 * 3584)
        + 256000 * 3584
        + 3584,
        None,
        [(917_504_000, "embedding", 0), (8_324_201_984, "non-embedding", 0)],
        "Gemma Team, 'Gemma 2: Improving Open Language Models at a Practical Size' (2024), "
        "Table 1: 9B has 917,504,000 embedding and 8,324,201,984 non-embedding parameters",
    ),
    "gemma-3-1b": (
        # q/k norms over each 256-wide head, four norms per layer.
        26 * (1152 * 1024 * 2 + 1152 * 256 * 2 + 3 * 1152 * 6912 + 4 * 1152 + 2 * 256)
        + 262144 * 1152
        + 1152,
        None,
        [(302e6, "embedding", 0.5e6), (698e6, "non-embedding", 0.5e6)],
        "Gemma Team, 'Gemma 3 Technical Report' (2025), Table 1: 1B has 302M embedding and "
        "698M non-embedding parameters",
    ),
    "phi-3-mini-4k": (
        32 * (4 * 3072 * 3072 + 3 * 3072 * 8192 + 2 * 3072) + 2 * 32064 * 3072 + 3072,
        None,
        [(3.8e9, "total", 0.05e9)],
        "Abdin et al., 'Phi-3 Technical Report' (2024): phi-3-mini, 3.8 billion parameters",
    ),
}


def embedding_params(path) -> int:
    """The embedding tables, as the sources count them: the input one and an untied LM head."""
    config = json.loads(path.read_text())
    tied = config.get("tie_word_embeddings", config["model_type"].startswith("gemma"))
    return (1 if tied else 2) * config["vocab_size"] * config["hidden_size"]


@pytest.mark.parametrize("name", sorted(SIZES))
def test_sizes_are_the_hand_counts_and_the_published_figures(repo, name):
    total, active, published, _source = SIZES[name]
    path = repo / "profiles" / "models" / f"{name}.json"
    shape = load_shape(path)
    assert shape.param_count() == total
    assert shape.active_param_count() == (total if active is None else active)
    counted = {
        "total": total,
        "active": shape.active_param_count(),
        "embedding": embedding_params(path),
        "non-embedding": total - embedding_params(path),
    }
    for figure, what, precision in published:
        assert abs(counted[what] - figure) <= precision, (name, what)
    # The loader sizes it the same way, on its own.
    config = ModelConfig.from_file(path)
    assert (config.param_count(), config.active_param_count()) == (
        shape.param_count(),
        shape.active_param_count(),
    )
    assert config.flops_per_token() == shape.flops_per_token()
    assert shape_from_object(config) == shape_from_object(config, config.name)
    assert shape_from_object(config).param_count() == total


def test_mixtral_weights_all_experts_but_computes_with_two(repo):
    shape = load_shape(repo / "profiles" / "models" / "mixtral-8x7b.json")
    assert shape.weight_bytes(2) == 2 * MIXTRAL_TOTAL  # 93.4 GB in bf16
    assert round(shape.weight_bytes(2) / 1e9, 1) == 93.4
    # Matmuls per token: attention, router, two experts and the LM head (no embedding gather).
    matmuls = 32 * (MIXTRAL_ATTENTION + 4096 * 8 + 2 * MIXTRAL_EXPERT) + 32000 * 4096
    assert shape.flops_per_token() == 2 * matmuls
    # One token reads its two experts of each layer; 64 tokens nearly all eight.
    one = pass_cost(shape, batch=1, context=0, new_tokens=1, dtype_bytes=2)
    assert one.weight_bytes == 2 * (MIXTRAL_TOTAL - 32 * 6 * MIXTRAL_EXPERT)
    many = pass_cost(shape, batch=8, context=0, new_tokens=8, dtype_bytes=2)
    touched = 8 * (1 - (6 / 8) ** 64)  # uniform routing: 8 - 8 x 0.75^64
    assert many.weight_bytes == round(2 * (MIXTRAL_TOTAL - 32 * (8 - touched) * MIXTRAL_EXPERT))


def roofline(repo, tmp_path, hardware: str, target: str, *options: str) -> tuple[int, str]:
    out = tmp_path / f"{target}-{hardware}.yaml"
    argv = [
        "profile",
        "roofline",
        "--hardware",
        str(repo / "profiles" / "hardware" / f"{hardware}.yaml"),
        "--target",
        str(repo / "profiles" / "models" / f"{target}.json"),
        "--drafter",
        "ngram",
        "--out",
        str(out),
        *options,
    ]
    return main(argv), out


def test_mixtral_roofline_profile_holds_every_expert_and_computes_the_active_ones(
    repo, tmp_path, capsys
):
    code, out = roofline(repo, tmp_path, "h200-sxm", "mixtral-8x7b")
    assert code == 0
    profile = load_profile(out).profile
    target = profile.target
    assert target.params == MIXTRAL_TOTAL and target.weight_bytes == 2 * MIXTRAL_TOTAL
    shape = load_shape(repo / "profiles" / "models" / "mixtral-8x7b.json")
    # The profile writes six significant digits.
    assert target.flops_per_token == pytest.approx(shape.flops_per_token(), rel=1e-5)
    bandwidth = 4.8e12 * 0.8  # h200-sxm.yaml: datasheet bandwidth x stated efficiency
    # A pass reads the dense part always and the routed experts its tokens pick: all of them
    # together are the whole model's bytes (8 experts, 2 per token).
    fit = target.latency.fit
    assert (fit.experts.experts, fit.experts.experts_per_token) == (8, 2)
    assert fit.fixed_s + fit.experts.weights_s == pytest.approx(
        2 * MIXTRAL_TOTAL / bandwidth + 32e-5, rel=1e-5
    )
    notes = profile.provenance.notes
    assert "mixture of experts: 46.7 B parameters in memory, 12.9 B active" in notes
    # 93.4 GB of weights do not fit in an H100's 72 GB usable: refused, nothing written.
    code, out = roofline(repo, tmp_path, "h100-sxm", "mixtral-8x7b")
    err = capsys.readouterr().err.strip()
    assert code == 2 and "do not fit" in err and "93.4 GB" in err and "\n" not in err
    assert not out.exists()
