"""Tree shapes: the engines' list-of-paths form, full trees by widths, malformed trees refused."""

from __future__ import annotations

import numpy as np
import pytest

from specsim.errors import SpecsimError
from specsim.tree import TreeShape


def test_branching_builds_the_full_tree_breadth_first():
    shape = TreeShape.branching([2, 2, 1])
    assert shape.num_nodes == 2 + 4 + 4
    assert shape.depth == 3
    assert shape.paths[:6] == ((0,), (1,), (0, 0), (0, 1), (1, 0), (1, 1))
    assert shape.parents.tolist() == [-1, -1, 0, 0, 1, 1, 2, 3, 4, 5]
    assert [shape.width_at(d) for d in (1, 2, 3)] == [2, 4, 4]
    assert shape.children(-1) == [0, 1]
    assert shape.children(1) == [4, 5]
    assert not shape.is_chain


def test_a_chain_is_a_tree_of_one_child_per_node():
    shape = TreeShape.chain(3)
    assert shape == TreeShape.branching([1, 1, 1]) == TreeShape.parse("1,1,1")
    assert shape.is_chain
    assert shape.parents.tolist() == [-1, 0, 1]
    # A chain's tree mask is the causal mask.
    assert np.array_equal(shape.ancestors, np.tril(np.ones((3, 3), dtype=bool)))


def test_the_mask_lets_a_node_see_itself_and_its_ancestors_only():
    shape = TreeShape.parse("[[0], [1], [0, 0], [1, 0], [0, 0, 0]]")
    node = shape.paths.index((0, 0, 0))
    assert sorted(np.flatnonzero(shape.ancestors[node]).tolist()) == sorted(
        [shape.paths.index(p) for p in [(0,), (0, 0), (0, 0, 0)]]
    )
    assert not shape.ancestors[shape.paths.index((1, 0)), shape.paths.index((0,))]


def test_paths_in_any_order_are_put_breadth_first_and_round_trip():
    shape = TreeShape.from_paths([(0, 0), (1,), (0,)])
    assert shape.paths == ((0,), (1,), (0, 0))
    assert TreeShape.parse(str(shape.to_paths())) == shape
    assert shape.describe() == "3 nodes, depth 2, nodes per depth 2,1"


@pytest.mark.parametrize(
    "text",
    [
        "",
        "x",
        "0",
        "2,-1",
        "[[0], [0]]",
        "[[0, 0]]",
        "[[1]]",
        "[[0], []]",
        "[1, 2]",
        "[[0.5]]",
        "[[0]",
        "40,40,40",
    ],
)
def test_malformed_trees_are_one_line_errors(text):
    with pytest.raises(SpecsimError) as caught:
        TreeShape.parse(text)
    assert "\n" not in str(caught.value)


def test_unordered_paths_are_refused_by_the_constructor():
    with pytest.raises(SpecsimError, match="breadth-first"):
        TreeShape(((0, 0), (0,)))


def test_a_full_trees_branching_is_recovered_from_its_paths():
    assert TreeShape.parse("2,2,1").full_branching == (2, 2, 1)
    assert TreeShape.chain(3).full_branching == (1, 1, 1)
    # Node (0,) has two children, node (1,) one: not a full tree.
    assert TreeShape.parse("[[0], [1], [0, 0], [0, 1], [1, 0]]").full_branching is None
