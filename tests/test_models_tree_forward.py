"""The decoder under a tree attention mask: every node's logits are those of a causal pass over
the committed sequence plus the node's path, for every model variant (a sliding window
included), ragged rows, and a pass that feeds one depth after the nodes above it are cached;
keeping a path's keys moves it to where a causal pass would have put it."""

from __future__ import annotations

import pytest
import torch
from test_models_forward import VARIANTS, assert_rounding_close, make_model, tokens_for

from specsim.engine.tree_attention import region_attention, verification_attention
from specsim.errors import SpecsimError
from specsim.tree import TreeShape

SHAPE = TreeShape.parse("2,2,1")  # 10 nodes, depth 3
COMMITTED = (9, 6)  # ragged rows; 9 > the sliding window of 5


@pytest.fixture(params=sorted(VARIANTS), scope="module")
def model(request):
    return make_model(VARIANTS[request.param])


def path_tokens(nodes: torch.Tensor, shape: TreeShape, node: int) -> list[int]:
    """Tokens from the root's child down to ``node``."""
    chain = []
    while node >= 0:
        chain.append(int(nodes[node]))
        node = int(shape.parents[node])
    return chain[::-1]


def causal_last(model, tokens: list[int]) -> torch.Tensor:
    return model(torch.tensor([tokens]))[0, -1]


def setup_rows(model):
    """A cache holding each row's sequence but its last token, and random tree nodes."""
    seqs = [tokens_for(1, n, seed=n)[0].tolist() for n in COMMITTED]
    width = max(COMMITTED) - 1
    cache = model.new_cache(2, 40)
    padded = torch.zeros(2, width, dtype=torch.long)
    for b, s in enumerate(seqs):
        padded[b, : len(s) - 1] = torch.tensor(s[:-1])
    model(padded, cache, torch.tensor([len(s) - 1 for s in seqs]))
    nodes = tokens_for(2, SHAPE.num_nodes, seed=5)
    return seqs, cache, nodes


@torch.no_grad()
def test_verification_pass_gives_each_node_the_logits_of_its_path(model):
    seqs, cache, nodes = setup_rows(model)
    start = cache.lengths.clone()
    attention = verification_attention(start, SHAPE, model.config.sliding_window)
    last = torch.tensor([s[-1] for s in seqs])
    logits = model(torch.cat([last[:, None], nodes], 1), cache, tree=attention)
    for b, seq in enumerate(seqs):
        assert_rounding_close(logits[b, 0], causal_last(model, seq), model.config)
        for i in range(SHAPE.num_nodes):
            expected = causal_last(model, seq + path_tokens(nodes[b], SHAPE, i))
            assert_rounding_close(logits[b, 1 + i], expected, model.config)


@torch.no_grad()
def test_a_depth_fed_after_the_nodes_above_it_sees_them_in_the_cache(model):
    # The drafter's layout: the committed sequence whole, then the tree's nodes depth by depth.
    seqs, cache, nodes = setup_rows(model)
    last = torch.tensor([[s[-1]] for s in seqs])
    model(last, cache)
    start = cache.lengths.clone()
    first = [0, 1]  # depth 1
    model(nodes[:, first], cache, tree=_attention(start, first, first, model))
    second = [2, 3, 4, 5]  # depth 2, under nodes 0 and 1
    fed = first + second
    logits = model(nodes[:, second], cache, tree=_attention(start, fed, second, model))
    for b, seq in enumerate(seqs):
        for column, i in enumerate(second):
            expected = causal_last(model, seq + path_tokens(nodes[b], SHAPE, i))
            assert_rounding_close(logits[b, column], expected, model.config)


def _attention(start, fed, queries, model):
    ancestors = SHAPE.ancestors[torch.tensor(fed)][:, fed]
    at = [fed.index(q) for q in queries]
    return region_attention(
        start, ancestors, SHAPE.depths[fed] - 1, at, model.config.sliding_window
    )


@torch.no_grad()
def test_a_kept_path_continues_as_a_causal_pass_would(model):
    seqs, cache, nodes = setup_rows(model)
    start = cache.lengths.clone()
    attention = verification_attention(start, SHAPE, model.config.sliding_window)
    last = torch.tensor([s[-1] for s in seqs])
    model(torch.cat([last[:, None], nodes], 1), cache, tree=attention)
    # Row 0 keeps (1,), (1, 1), (1, 1, 0); row 1 (0,), (0, 1), (0, 1, 0).
    path = torch.tensor([[1, 5, 9], [0, 3, 7]])
    cache.copy_slots(start[:, None] + 1 + path, start[:, None] + 1 + torch.arange(3))
    cache.rollback(start + 4)
    nxt = tokens_for(2, 1, seed=9)
    logits = model(nxt, cache)
    for b, seq in enumerate(seqs):
        kept = path_tokens(nodes[b], SHAPE, int(path[b, -1]))
        expected = causal_last(model, seq + kept + [int(nxt[b, 0])])
        assert_rounding_close(logits[b, 0], expected, model.config)


def test_a_tree_call_without_a_cache_is_refused():
    model = make_model(VARIANTS["llama-gqa-untied"])
    attention = verification_attention(torch.zeros(1, dtype=torch.long), SHAPE)
    with pytest.raises(SpecsimError, match="tree call needs a cache"):
        model(tokens_for(1, SHAPE.num_nodes + 1), tree=attention)
