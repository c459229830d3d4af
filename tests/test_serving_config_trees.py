"""The engines' writers for a tree: SGLang's three knobs, TensorRT-LLM's eagle_choices, and a
one-line refusal where an engine cannot express the tree (vLLM 0.33, chain-only decoding).

Settings are built by hand (as ``test_serving_config``); ``test_plan_emit_trees`` runs a plan.
"""

from __future__ import annotations

import ast
import shlex

import pytest
import yaml

from specsim.errors import SpecsimError
from specsim.serving import sglang_config, trtllm_config, vllm_config
from specsim.serving.setting import GIVEN, EngineSetting, ModelRef, Speculative
from specsim.tree import TreeShape

HEADER = ["specsim 9.9: `plan window` of scenario 'demo' (demo.yaml) with profile 'p' (p.yaml)."]
TARGET = ModelRef("target", "org/target-8b", GIVEN)
DRAFT = ModelRef("small", "org/draft-1b", GIVEN)
HEADS = ModelRef("heads", "org/EAGLE3-target-8b", GIVEN)
FOUR = TreeShape.from_paths([[0], [1], [0, 0], [0, 1]])  # depth 2, two beams, 4 nodes
FULL = TreeShape.branching([2, 2, 1])  # 4 nodes at depth 2 expand


def tree_setting(shape: TreeShape, kind="draft_model", model=DRAFT, **changes) -> EngineSetting:
    rates = (0.9, 0.6)[: shape.depth] + (0.3,) * max(0, shape.depth - 2)
    spec = Speculative(
        "small", kind, shape.depth, model, rates, tree=shape, tree_drafts="top-k", **changes
    )
    return EngineSetting(TARGET, 64, 2048, spec)


def options(text: str) -> list[str]:
    return shlex.split(text, comments=True)


def test_sglang_writes_a_searched_trees_own_knobs():
    item = tree_setting(FOUR, sglang_knobs=(3, 2, 5))
    assert sglang_config.refuses(item) is None
    args = options(sglang_config.render(item, HEADER).files["sglang.args"])
    assert args[args.index("--speculative-num-steps") + 1] == "3"
    assert args[args.index("--speculative-eagle-topk") + 1] == "2"
    assert args[args.index("--speculative-num-draft-tokens") + 1] == "5"
    assert "--disable-overlap-schedule" in args


def test_sglang_knobs_of_a_given_shape_are_its_depth_widest_node_and_nodes_plus_one():
    item = tree_setting(FOUR)
    assert sglang_config.tree_knobs(item.speculation) == (2, 2, 5)
    rendered = sglang_config.render(item, HEADER)
    assert rendered.written["speculative_eagle_topk"] == 2
    assert rendered.written["disable_overlap_schedule"] is True
    assert any("static tree it stands for" in note for note in rendered.notes)


def test_sglang_refuses_a_tree_its_beams_cannot_hold_in_one_line():
    reason = sglang_config.refuses(tree_setting(FULL))
    assert reason == (
        "4 nodes at depth 2 have children, but SGLang expands only its topk = 2 best nodes per "
        "depth (§4.5)"
    )


def test_sglang_check_refuses_more_draft_tokens_than_the_tree_drafts():
    planted = [
        ("--speculative-algorithm", "STANDALONE"),
        ("--speculative-draft-model-path", "org/draft-1b"),
        ("--speculative-num-steps", "2"),
        ("--speculative-eagle-topk", "2"),
        ("--speculative-num-draft-tokens", "6"),
        ("--max-running-requests", "64"),
    ]
    with pytest.raises(SpecsimError, match="above steps x topk"):
        sglang_config.check(planted)
    sglang_config.check([*planted[:4], ("--speculative-num-draft-tokens", "5"), planted[5]])


def test_vllm_refuses_a_tree_and_names_the_old_keys_literal():
    item = tree_setting(FOUR)
    reason = vllm_config.refuses(item)
    literal = "[(0,), (1,), (0, 0), (0, 1)]"
    assert vllm_config.token_tree(FOUR) == literal
    assert literal in reason and "num_speculative_tokens 4" in reason
    assert "no speculative_token_tree" in reason and "\n" not in reason
    # The literal is what vLLM 0.10.2 read back with ast.literal_eval, breadth-first.
    back = sorted(ast.literal_eval(literal), key=lambda t: (len(t), t))
    assert TreeShape.from_paths(back) == FOUR


def test_trtllm_writes_eagle_choices_for_decoding_heads():
    item = tree_setting(FULL, kind="heads", model=HEADS)
    assert trtllm_config.refuses(item) is None
    rendered = trtllm_config.render(item, HEADER)
    config = yaml.safe_load(rendered.files["trtllm.yaml"])["speculative_config"]
    assert config["decoding_type"] == "Eagle3"
    assert config["max_draft_len"] == 3
    assert config["eagle_choices"] == FULL.to_paths()
    assert any("deprecated" in note for note in rendered.notes)


def test_trtllm_refuses_a_tree_for_a_draft_model_and_check_holds_the_choices():
    reason = trtllm_config.refuses(tree_setting(FOUR))
    assert reason.startswith("TensorRT-LLM's Draft_Target decoding drafts a chain only")
    document, _ = trtllm_config.options(tree_setting(FOUR, kind="heads", model=HEADS))
    document["speculative_config"]["eagle_choices"] = [[0], [1, 0]]  # (1,) missing
    with pytest.raises(SpecsimError, match="connected"):
        trtllm_config.check(document)


def test_chains_are_written_as_before():
    chain = Speculative("small", "draft_model", 3, DRAFT, (0.9, 0.6, 0.3))
    item = EngineSetting(TARGET, 64, 2048, chain)
    for writer in (sglang_config, vllm_config, trtllm_config):
        assert writer.refuses(item) is None
    args = options(sglang_config.render(item, HEADER).files["sglang.args"])
    assert "--disable-overlap-schedule" not in args
    assert args[args.index("--speculative-num-draft-tokens") + 1] == "4"
