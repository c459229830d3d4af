"""Tree acceptance: the tree walk, the scores it walks, the profile's tree table and the model
for shapes that were not measured.

- The walk against an independent exact recursion (over step outcomes, memoised per start) on
  random fractional scores, and against the chain walk on chain-shaped trees.
- The i.i.d. score (SpecInfer's rule given the emitted token) against exact enumeration of two
  children drafted i.i.d. from q on a 4-token vocabulary.
- Measured on the built-in pairs: chain-shaped trees reproduce the chain entries (greedy and
  exact), wider trees accept more, and the entries go through a written profile and back; the
  greedy walk predicts the engine's own tree steps step for step.
"""

from __future__ import annotations

import functools
import itertools

import numpy as np
import pytest
import torch
import yaml
from test_engine_common import model, model_spec, prompt_bank, prompts_path

from specsim.errors import SpecsimError
from specsim.profile import load_profile
from specsim.profile.acceptance import derive_tree_acceptance
from specsim.profiling.acceptance import Scored, walk_all
from specsim.profiling.tree_acceptance import tree_walk
from specsim.profiling.tree_scoring import iid_accept, top_k_accept
from specsim.tree import TreeShape

LOPSIDED = TreeShape.parse("[[0], [1], [2], [0, 0], [1, 0], [0, 0, 0], [0, 0, 1]]")


def random_scores(rng, lengths, width):
    """Joint child-acceptance rows that sum to at most 1."""
    out = []
    for n in lengths:
        raw = rng.dirichlet(np.ones(width + 1), size=n)[:, :width]
        out.append(raw)
    return out


def recursive_histogram(accept: np.ndarray, shape: TreeShape) -> tuple[float, np.ndarray]:
    """Expected (counted steps, accepted-count histogram) by recursion over each step's
    outcomes: an implementation independent of the walk's forward pass."""
    length = len(accept)

    def outcomes(node: int, s: int, depth: int, prob: float):
        left = prob
        for rank, child in enumerate(shape.children(node)):
            a = accept[s + depth, rank] if s + depth < length else 0.0
            yield from outcomes(child, s, depth + 1, prob * a)
            left -= prob * a
        yield depth, left

    @functools.cache
    def from_start(s: int) -> tuple[float, tuple]:
        if s >= length:
            return 0.0, (0.0,) * (shape.depth + 1)
        counted = s + shape.depth <= length
        steps, hist = float(counted), np.zeros(shape.depth + 1)
        for depth, prob in outcomes(-1, s, 0, 1.0):
            if counted:
                hist[depth] += prob
            later_steps, later = from_start(s + depth + 1)
            steps += prob * later_steps
            hist += prob * np.array(later)
        return steps, tuple(hist)

    steps, hist = from_start(0)
    return steps, np.array(hist)


@pytest.mark.parametrize("spec", ["2,2,1", "3,1", LOPSIDED])
def test_the_walk_equals_an_exact_recursion_over_step_outcomes(spec):
    shape = spec if isinstance(spec, TreeShape) else TreeShape.parse(spec)
    rng = np.random.default_rng(4)
    requests = random_scores(rng, [9, 14, 3], 3)
    totals = tree_walk(requests, shape)
    steps, hist = 0.0, np.zeros(shape.depth + 1)
    for accept in requests:
        s, h = recursive_histogram(accept, shape)
        steps, hist = steps + s, hist + h
    assert totals.steps == pytest.approx(steps, rel=1e-12)
    np.testing.assert_allclose(totals.accepted_hist, hist, rtol=1e-12, atol=1e-12)


def test_a_chain_shaped_tree_walks_as_the_chain_walk():
    rng = np.random.default_rng(7)
    betas = [rng.uniform(0, 1, n) for n in (30, 12, 5)]
    for k in (1, 3, 6):
        chain = walk_all([Scored.from_beta(b) for b in betas], k)
        tree = tree_walk([b[:, None] for b in betas], TreeShape.chain(k))
        assert tree.steps == pytest.approx(chain.steps, rel=1e-12)
        assert tree.mean_acceptance_length == pytest.approx(chain.mean_acceptance_length, 1e-12)
        rates = [r[0] for r in tree.conditional_rates()]
        assert rates == pytest.approx(chain.conditional_rates(), rel=1e-12)


def specinfer_given_token(p: np.ndarray, q: np.ndarray, children: int) -> np.ndarray:
    """[V, children]: P(child r accepted holding t) / p(t), by enumerating every i.i.d. draw of
    the children and following SpecInfer's rule (accept x with min(1, p'(x)/q(x)); after a
    rejection p' <- norm(max(0, p' - q)))."""
    vocab = len(p)
    joint = np.zeros((vocab, children))
    for draws in itertools.product(range(vocab), repeat=children):
        residual, reach = p.copy(), np.prod(q[list(draws)])
        for rank, x in enumerate(draws):
            accept = min(1.0, residual[x] / q[x])
            joint[x, rank] += reach * accept
            reach *= 1.0 - accept
            left = np.maximum(residual - q, 0.0)
            residual = left / left.sum() if left.sum() > 0 else left
    return joint / p[:, None]


def test_the_iid_score_is_specinfers_acceptance_given_the_emitted_token():
    rng = np.random.default_rng(2)
    for _ in range(5):
        p_logits, q_logits = rng.normal(size=(2, 4)) * 1.5
        p, q = np.exp(p_logits) / np.exp(p_logits).sum(), np.exp(q_logits) / np.exp(q_logits).sum()
        expected = specinfer_given_token(p, q, 3)
        tokens = list(range(4))
        rows = [torch.from_numpy(np.tile(x, (4, 1))) for x in (p_logits, q_logits)]
        got = iid_accept(*rows, 1.0, tokens, 3)
        np.testing.assert_allclose(got, expected, atol=1e-12)


def test_the_iid_score_agrees_with_the_sampling_cores_tree_verifier():
    # 200,000 rows of one node with three i.i.d. children (seed 3): each cell's frequency of
    # (child r accepted, token t emitted) has a standard error <= 0.0012, and the test allows
    # five of them, so a wrong residual update (off by several percent) fails it.
    from specsim.sampling.randomness import draw_randomness
    from specsim.sampling.tree_verifiers import verify_tree_rejection

    rows, vocab, shape = 200_000, 5, TreeShape.parse("3")
    generator = torch.Generator().manual_seed(3)
    p_logits, q_logits = torch.randn((2, vocab), generator=generator, dtype=torch.float64) * 1.5
    p, q = torch.softmax(p_logits, -1), torch.softmax(q_logits, -1)
    drafts = torch.multinomial(q, rows * 3, replacement=True, generator=generator).view(rows, 3)
    p_rows = p.expand(rows, shape.num_nodes + 1, vocab)
    q_rows = q.expand(rows, shape.num_nodes + 1, vocab)
    randomness = draw_randomness(generator, rows, shape.num_nodes)
    result = verify_tree_rejection(p_rows, q_rows, drafts, shape, randomness, validate=False)
    seen = np.zeros((vocab, 3))
    accepted = result.accepted == 1
    np.add.at(seen, (result.tokens[accepted, 0].numpy(), result.path[accepted, 0].numpy()), 1)
    seen /= rows
    tokens = list(range(vocab))
    scored = iid_accept(p_logits.expand(vocab, -1), q_logits.expand(vocab, -1), 1.0, tokens, 3)
    expected = scored * p.numpy()[:, None]
    error = np.sqrt(expected * (1 - expected) / rows)
    assert np.all(np.abs(seen - expected) <= 5 * error + 1e-9), (seen, expected)


def test_the_top_k_score_marks_the_drafters_rank_of_the_text_token():
    q = torch.tensor([[0.1, 3.0, 2.0, -1.0], [0.1, 3.0, 2.0, -1.0]])
    got = top_k_accept(q, [2, 3], width=2)
    np.testing.assert_array_equal(got, [[0, 1], [0, 0]])  # rank 1, then rank 3: past the width


def test_a_derived_tree_follows_the_stated_model():
    # Root: rank 0 at 0.6, rank 1 at 0.5 given rank 0 failed; depth 1: rank 0 at 0.3.
    rates = [[0.6, 0.5], [0.3]]
    dist = derive_tree_acceptance(rates, TreeShape.parse("2,1"))
    reach = 0.6 + 0.4 * 0.5
    assert dist == pytest.approx([1 - reach, reach * 0.7, reach * 0.3])
    # Depths past the rates take the deepest's; ranks without a rate accept nothing.
    dist = derive_tree_acceptance([[0.5]], TreeShape.parse("2,1,1"))
    assert dist == pytest.approx([0.5, 0.25, 0.125, 0.125])


@functools.cache
def measured():
    from specsim.profiling.acceptance_measure import measure_acceptance
    from specsim.profiling.specs import parse_drafters

    target = model("specsim-target")
    ids = [prompt_bank().prompt(i, 20) for i in range(8)]
    shapes = [TreeShape.chain(3), TreeShape.parse("2,2,1"), TreeShape.parse("4,2,1")]
    return measure_acceptance(
        target,
        {"small": model("specsim-draft-small")},
        parse_drafters(["small=specsim-draft-small"]),
        ids,
        [1.0],
        max_new_tokens=24,
        seed=0,
        eos_id=None,
        tree_shapes=shapes,
    )


def tree_entry(result, verifier, drafts, spec):
    paths = TreeShape.parse(spec).to_paths() if "," in spec else TreeShape.chain(3).to_paths()
    (entry,) = [
        e
        for e in result.tree_entries
        if (e["verifier"], e["drafts"], e["tree"]) == (verifier, drafts, paths)
    ]
    return entry


def test_built_in_pairs_chain_shaped_trees_reproduce_the_chain_entries():
    result = measured()
    chains = {e["verifier"]: e for e in result.entries}
    greedy = tree_entry(result, "greedy", "top-k", "chain")
    exact = tree_entry(result, "rejection", "iid", "chain")
    assert greedy["mean_acceptance_length"] == pytest.approx(
        chains["greedy"]["mean_acceptance_length"][3], rel=1e-9
    )
    # The chain scores p and q in float32, the tree in float64: equal to float32 rounding.
    assert exact["mean_acceptance_length"] == pytest.approx(
        chains["rejection"]["mean_acceptance_length"][3], rel=1e-6
    )
    # With one child per node the draws are one draw from q: the same chain.
    without = tree_entry(result, "rejection", "without-replacement", "chain")
    assert without["accepted_length"] == pytest.approx(exact["accepted_length"], rel=1e-12)
    runs = [("greedy", "top-k"), ("rejection", "top-k"), ("rejection", "iid")]
    for verifier, drafts in [*runs, ("rejection", "without-replacement")]:
        lengths = [
            tree_entry(result, verifier, drafts, s)["mean_acceptance_length"]
            for s in ("chain", "2,2,1", "4,2,1")
        ]
        print(verifier, drafts, [round(x, 3) for x in lengths])
        # A tree holds its rank-0 chain, so per step it accepts at least as much; over the text
        # the steps start elsewhere, so this is a measured fact of these pairs, not a law.
        assert lengths[0] < lengths[1] < lengths[2]


def profile_with_trees(tmp_path, entries):
    from specsim.profiling.writer import build_profile, profile_yaml

    path = tmp_path / "hand.yaml"
    from test_engine_common import hand_profile

    hand_profile(path)
    data = yaml.safe_load(path.read_text())
    data["tree_acceptance"] = [{**e, "drafter": "small"} for e in entries]
    path.write_text(profile_yaml(build_profile(data, str(path))))
    return load_profile(path)


def test_tree_acceptance_is_stored_per_shape_and_read_back(tmp_path):
    result = measured()
    loaded = profile_with_trees(tmp_path, result.tree_entries)
    profile = loaded.profile
    assert len(profile.tree_acceptance) == len(result.tree_entries) == 12
    shape = TreeShape.parse("2,2,1")
    back = profile.tree_acceptance_for("small", "rejection", 1.0, shape, "iid")
    original = tree_entry(result, "rejection", "iid", "2,2,1")
    assert back.source == "measured"
    assert back.accepted_length == pytest.approx(original["accepted_length"], rel=1e-5)
    assert back.mean_acceptance_length == pytest.approx(original["mean_acceptance_length"], 1e-5)
    # Without-replacement scores of the 4-child root are estimated and say so; 2,2,1's are exact.
    wide = profile.tree_acceptance_for(
        "small", "rejection", 1.0, TreeShape.parse("4,2,1"), "without-replacement"
    )
    assert wide.monte_carlo.seed == 0 and wide.monte_carlo.samples == 64
    assert 0 < wide.monte_carlo.standard_error < 0.01
    narrow = profile.tree_acceptance_for("small", "rejection", 1.0, shape, "without-replacement")
    assert narrow.source == "measured" and narrow.monte_carlo is None
    # A shape that was not measured is derived from the widest measured tree, and says so.
    derived = profile.tree_acceptance_for("small", "greedy", 0.0, TreeShape.parse("3,2"), "top-k")
    assert derived.source == "derived"
    assert str(TreeShape.parse("4,2,1").to_paths()) in derived.derived_from
    assert sum(derived.accepted_length) == pytest.approx(1.0)


def test_without_a_measured_tree_the_chain_rates_are_the_best_childs(tmp_path):
    loaded = profile_with_trees(tmp_path, [])
    shape = TreeShape.parse("2,1")
    derived = loaded.profile.tree_acceptance_for("small", "rejection", 1.0, shape, "top-k")
    assert derived.source == "derived" and "chain" in derived.derived_from
    # hand_profile's chain rates are 0.8, 0.7: the rank-1 child adds nothing.
    assert derived.accepted_length == pytest.approx([0.2, 0.8 * 0.3, 0.8 * 0.7])
    with pytest.raises(SpecsimError, match="no acceptance of drafter 'small' under 'typical'"):
        loaded.profile.tree_acceptance_for("small", "typical", 1.0, shape, "top-k")


BAD_TREE_ENTRIES = [
    ({"accepted_length": [0.5, 0.5]}, "accepted_length has 2 entries for a tree of depth 2"),
    ({"accepted_length": [0.5, 0.4, 0.4]}, "accepted_length sums to 1.3"),
    ({"mean_acceptance_length": 2.5}, "mean_acceptance_length 2.5 but accepted_length gives"),
    ({"tree": [[0], [0, 1]]}, "skips rank 0"),
    ({"drafter": "other"}, "tree_acceptance names drafter 'other'"),
    ({"monte_carlo": {"seed": 0, "samples": 64, "standard_error": -0.1}}, "standard_error"),
    ({"monte_carlo": {"seed": 0, "samples": 0, "standard_error": 0.1}}, "samples"),
]


@pytest.mark.parametrize("change, message", BAD_TREE_ENTRIES)
def test_a_bad_tree_entry_is_refused_in_one_line(tmp_path, change, message):
    from test_engine_common import hand_profile

    path = hand_profile(tmp_path / "p.yaml")
    data = yaml.safe_load(path.read_text())
    entry = {
        "drafter": "small",
        "verifier": "greedy",
        "temperature": 0.0,
        "tree": [[0], [1], [0, 0]],
        "drafts": "top-k",
        "accepted_length": [0.2, 0.3, 0.5],
        "mean_acceptance_length": 2.3,
    }
    data["tree_acceptance"] = [{**entry, **change}]
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecsimError, match=message) as err:
        load_profile(path)
    assert "\n" not in str(err.value)


def test_the_profiler_writes_tree_acceptance_when_shapes_are_asked_for(tmp_path):
    from test_profiling_measure import SMALL_GRID

    from specsim.profiling import measure
    from specsim.profiling.specs import parse_drafters
    from specsim.profiling.writer import write_profile

    options = measure.MeasureOptions(
        target=model_spec("specsim-target"),
        drafters=parse_drafters([f"small={model_spec('specsim-draft-tiny')}"]),
        name="trees",
        grid=SMALL_GRID[1::2],
        repeats=1,
        prompts=prompts_path(),
        max_prompts=3,
        max_new_tokens=12,
        trees=[TreeShape.parse("2,1")],
    )
    report = measure.measure_profile(options)
    written = write_profile(report.profile, tmp_path / "trees.yaml", report.side_files)
    trees = load_profile(written).profile.tree_acceptance
    assert {(t.verifier, t.drafts, t.temperature) for t in trees} == {
        ("greedy", "top-k", 0.0),
        ("rejection", "top-k", 1.0),
        ("rejection", "iid", 1.0),
        ("rejection", "without-replacement", 1.0),
    }
    assert all(t.shape == TreeShape.parse("2,1") and t.source == "measured" for t in trees)


def test_the_greedy_tree_walk_predicts_the_engines_tree_steps(monkeypatch):
    # Greedy verification with top-k children is deterministic, so the walk over the target's
    # greedy text must give, step for step, what the engine's tree steps accept on that text.
    import specsim.engine.generate as generate_module
    from specsim.engine.generate import generate
    from specsim.engine.step import Sampling
    from specsim.profiling.scoring import drafter_logits, generate_target_text

    target, drafter = model("specsim-target"), model("specsim-draft-small")
    shape, n = TreeShape.parse("2,2,1"), 30
    prompts = [prompt_bank().prompt(i, 14) for i in range(4)]
    texts = generate_target_text(target, prompts, 0.0, n, torch.Generator(), None)
    accepted_per_step = []
    step = generate_module.tree_step

    def recording(*args, **kwargs):
        result = step(*args, **kwargs)
        accepted_per_step.append(result.accepted.clone())
        return result

    monkeypatch.setattr(generate_module, "tree_step", recording)
    greedy = Sampling(temperature=0.0, verifier="greedy")
    gen = generate(
        target, drafter, prompts, n + shape.depth + 1, shape.depth, greedy, 0, tree=shape
    )
    engine_hist = np.zeros(shape.depth + 1)
    for row, text in enumerate(texts):
        assert gen.tokens[row, :n].tolist() == text.tokens
        start = 0  # the engine's steps start after the prefill's token: text position 1
        for accepted in accepted_per_step:
            if start + shape.depth <= n - 1:
                engine_hist[int(accepted[row])] += 1
            start += int(accepted[row]) + 1
    scores = [
        top_k_accept(q, text.tokens, 2)[1:]
        for q, text in zip(drafter_logits(drafter, texts), texts, strict=True)
    ]
    walked = tree_walk(scores, shape)
    print(f"steps {engine_hist.sum():.0f}, accepted per step {engine_hist.tolist()}")
    np.testing.assert_array_equal(walked.accepted_hist, engine_hist)


def test_profile_tree_from_the_command_line(tmp_path):
    """``specsim profile measure --tree 2,1 --tree 1,1 --tree-drafts iid --tree-drafts
    without-replacement`` writes those entries for both shapes and no top-k ones (without
    --tree-drafts the same run writes every drafting:
    test_the_profiler_writes_tree_acceptance_when_shapes_are_asked_for)."""
    from test_profiling_measure import SMALL_GRID

    from specsim.cli import main

    out = tmp_path / "cli-trees.yaml"
    argv = [
        *("profile", "measure", "--target", model_spec("specsim-target")),
        *("--drafter", f"small={model_spec('specsim-draft-tiny')}", *SMALL_GRID[2:]),
        *("--repeats", "1", "--prompts", str(prompts_path()), "--max-prompts", "3"),
        *("--max-new-tokens", "12", "--tree", "2,1", "--tree", "1,1", "--tree-drafts", "iid"),
        *("--tree-drafts", "without-replacement", "--out", str(out)),
    ]
    assert main(argv) == 0
    trees = load_profile(out).profile.tree_acceptance
    assert {(t.verifier, t.drafts, t.shape) for t in trees} == {
        (verifier, drafts, TreeShape.parse(shape))
        for verifier, drafts in [("rejection", "iid"), ("rejection", "without-replacement")]
        for shape in ("2,1", "1,1")
    }


def test_tree_acceptance_alone_through_the_public_api():
    from specsim.profiling.measure import MeasureOptions, measure_tree_acceptance
    from specsim.profiling.specs import parse_drafters

    options = MeasureOptions(
        target=model_spec("specsim-target"),
        drafters=parse_drafters([f"small={model_spec('specsim-draft-tiny')}"]),
        name="trees",
        prompts=prompts_path(),
        max_prompts=2,
        max_new_tokens=8,
        trees=[TreeShape.parse("4,1")],
        tree_drafts=["without-replacement"],
    )
    (entry,) = measure_tree_acceptance(options)
    assert (entry["verifier"], entry["drafts"], entry["temperature"]) == (
        "rejection",
        "without-replacement",
        1.0,
    )
    assert entry["monte_carlo"]["seed"] == 0  # the root's fourth child is estimated
