"""The greedy accept of a verify in one native call (verify.c's ``relayc_accept_greedy``,
``relayc.engine.ops.verify._native_greedy``): the outputs of the kernel's host loop and
``_accept_outputs``, for random trees and chains; trees it cannot read go the kernel's way."""

from __future__ import annotations

import pytest
import torch

from relayc.engine.native.library import native_decoder
from relayc.engine.ops.verify import _accept_outputs, _native_greedy
from relayc.kernels.verify_greedy import verify_tree_greedy_reference
from tests.kernels.test_verify_greedy import agreeing_targets
from tests.kernels.trees import DraftTrees, random_trees


def _kernel_way(trees: DraftTrees, target: torch.Tensor) -> dict[str, torch.Tensor]:
    batch, n = trees.candidates.shape
    predicts = torch.zeros(batch * n, dtype=torch.int32)
    accept_index = torch.full((batch, n), -1, dtype=torch.int32)
    count = torch.zeros(batch, dtype=torch.int32)
    verify_tree_greedy_reference(
        predicts,
        accept_index,
        count,
        trees.candidates,
        trees.retrive_index,
        trees.retrive_next_token,
        trees.retrive_next_sibling,
        target.view(batch, n),
    )
    return _accept_outputs(predicts, accept_index, count)


def _tree(trees: DraftTrees) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return trees.retrive_index, trees.retrive_next_token, trees.retrive_next_sibling


@pytest.mark.parametrize(
    ("batch", "n", "depth", "vocab"),
    [(1, 1, 1, 4), (3, 7, 8, 3), (4, 5, 8, 2), (2, 16, 3, 4), (8, 9, 8, 3)],
)
@pytest.mark.parametrize("agree", [0.3, 0.9])
def test_native_accept_is_the_kernel_way(
    batch: int, n: int, depth: int, vocab: int, agree: float
) -> None:
    assert native_decoder() is not None, "the native decoder should build here"
    gen = torch.Generator().manual_seed(100 * batch + n)
    trees = random_trees(batch, n, vocab, gen, max_depth=depth)
    target = agreeing_targets(trees, vocab, agree=agree, gen=gen).reshape(-1)
    got = _native_greedy(trees.candidates, _tree(trees), target)
    want = _kernel_way(trees, target)
    assert got is not None
    assert got.keys() == want.keys()
    for name, value in want.items():
        assert got[name].dtype == value.dtype and got[name].shape == value.shape, name
        assert torch.equal(got[name], value), name


def test_trees_it_cannot_read_go_the_kernel_way() -> None:
    gen = torch.Generator().manual_seed(3)
    trees = random_trees(2, 5, 3, gen)
    target = agreeing_targets(trees, 3, agree=0.9, gen=gen).reshape(-1)
    bad = trees.retrive_next_token.clone()
    bad[1, 2] = 5  # a child past the tree
    assert _native_greedy(trees.candidates, (trees.retrive_index, bad, bad), target) is None
    outside = trees.retrive_index.clone()
    outside[0, 0] = 10  # a global id past the batch
    tree = (outside, trees.retrive_next_token, trees.retrive_next_sibling)
    assert _native_greedy(trees.candidates, tree, target) is None
    narrow = trees.candidates.to(torch.int32)
    assert _native_greedy(narrow, _tree(trees), target) is None  # the kernel widens these
