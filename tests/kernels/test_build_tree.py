from __future__ import annotations

import os
from collections.abc import Callable

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

from relayc.kernels._backend import triton_available
from relayc.kernels.build_tree import (
    MAX_BITPACKED_NODES,
    BuiltTree,
    TreeMaskMode,
    build_tree,
    build_tree_reference,
    unpack_tree_mask,
)
from tests.kernels.tree_utils import DraftResult, check_describes_tree, draft_eagle_tree

needs_triton = pytest.mark.skipif(not triton_available(), reason="triton is not installed")

# (batch_size, topk, spec_steps, num_verify_tokens): chains (topk 1), root only (N 1),
# one level (spec_steps 1), full trees (N = every candidate + root) and odd sizes.
SMALL_CASES = [
    (1, 1, 1, 1),
    (3, 1, 5, 6),
    (1, 1, 8, 4),
    (3, 2, 1, 3),
    (3, 2, 3, 5),
    (1, 2, 4, 15),
    (3, 4, 3, 7),
    (1, 4, 8, 64),
    (3, 4, 5, 33),
]
LARGE_CASES = [(64, 1, 7, 8), (64, 2, 6, 16), (64, 4, 8, 64)]


def _draft(case: tuple[int, int, int, int], seed: int) -> DraftResult:
    batch_size, topk, spec_steps, n = case
    return draft_eagle_tree(batch_size, topk, spec_steps, n, torch.Generator().manual_seed(seed))


def _inputs(draft: DraftResult) -> tuple:
    """``build_tree``'s positional inputs before ``tree_mask_mode``."""
    return (
        draft.verified_id,
        draft.parent_list,
        draft.top_scores_index,
        draft.draft_tokens,
        draft.seq_lens,
        draft.seq_lens_sum,
        draft.topk,
        draft.spec_steps,
        draft.num_verify_tokens,
    )


def _poison(mask: torch.Tensor) -> torch.Tensor:
    """A mask that differs from ``mask`` in every element (packed rows: bit 0, the root's
    column, is always set, so flipping it changes every row)."""
    if mask.dtype == torch.bool:
        return ~mask
    return (mask.to(torch.int64) ^ 1).to(mask.dtype)


def _skip_unpackable(case: tuple[int, int, int, int], mode: TreeMaskMode) -> None:
    if mode == TreeMaskMode.QLEN_ONLY_BITPACKING and case[3] > MAX_BITPACKED_NODES:
        pytest.skip(f"bit-packing holds at most {MAX_BITPACKED_NODES} nodes per row")


def _run(draft: DraftResult, mode: TreeMaskMode, backend: str, poison_from: BuiltTree) -> BuiltTree:
    # Every output buffer starts as a value that differs from the expected one in every
    # element, so an element the implementation leaves unwritten fails the comparison.
    retrive = torch.stack(poison_from[2:5]) + 7919
    return build_tree(
        *_inputs(draft),
        mode,
        tree_mask_buf=_poison(poison_from.tree_mask),
        positions_buf=poison_from.positions + 7919,
        retrive_buf=retrive,
        backend=backend,
    )


def _reference(draft: DraftResult, mode: TreeMaskMode) -> BuiltTree:
    return build_tree_reference(*_inputs(draft), mode)


def _assert_same(got: BuiltTree, want: BuiltTree) -> None:
    for name, g, w in zip(BuiltTree._fields, got, want, strict=True):
        assert g.dtype == w.dtype, name
        assert torch.equal(g, w), name


@pytest.mark.parametrize("mode", list(TreeMaskMode))
@pytest.mark.parametrize("case", SMALL_CASES + LARGE_CASES, ids=str)
def test_reference_describes_the_drafted_tree(
    case: tuple[int, int, int, int], mode: TreeMaskMode
) -> None:
    _skip_unpackable(case, mode)
    draft = _draft(case, seed=hash(case) % 1000)
    built = _reference(draft, mode)
    if mode == TreeMaskMode.QLEN_ONLY_BITPACKING:
        window = unpack_tree_mask(built.tree_mask, draft.num_verify_tokens)
        assert torch.equal(window, _reference(draft, TreeMaskMode.QLEN_ONLY).tree_mask)
        built = built._replace(tree_mask=window)
    check_describes_tree(draft, built, mode == TreeMaskMode.FULL_MASK)


@pytest.mark.parametrize("mode", list(TreeMaskMode))
@pytest.mark.parametrize("case", SMALL_CASES + LARGE_CASES, ids=str)
def test_torch_matches_reference(case: tuple[int, int, int, int], mode: TreeMaskMode) -> None:
    _skip_unpackable(case, mode)
    for seed in range(3):
        draft = _draft(case, seed)
        want = _reference(draft, mode)
        _assert_same(_run(draft, mode, "torch", want), want)


@needs_triton
@pytest.mark.parametrize("mode", list(TreeMaskMode))
@pytest.mark.parametrize("case", SMALL_CASES, ids=str)
def test_triton_matches_reference(case: tuple[int, int, int, int], mode: TreeMaskMode) -> None:
    _skip_unpackable(case, mode)
    draft = _draft(case, seed=17)
    want = _reference(draft, mode)
    _assert_same(_run(draft, mode, "triton", want), want)


@pytest.mark.parametrize(
    "backend",
    ["auto", "torch", pytest.param("triton", marks=needs_triton)],
)
def test_unselected_parent_leaves_node_unlinked(backend: str) -> None:
    # NaN logits can select a node without its parent; SGLang then leaves the node out of
    # the links and stops its ancestor walk. Point some beams at a candidate that was never
    # selected and check every implementation agrees with the reference.
    draft = _draft((3, 2, 5, 12), seed=5)
    parent_list = draft.parent_list.clone()
    parent_list[:, 3::2] += 10_000
    broken = DraftResult(**{**draft.__dict__, "parent_list": parent_list})
    for mode in TreeMaskMode:
        want = _reference(broken, mode)
        assert (want.retrive_next_sibling == -1).sum() > (
            _reference(draft, mode).retrive_next_sibling == -1
        ).sum()
        _assert_same(_run(broken, mode, backend, want), want)


def test_int32_seq_lens_give_int64_positions() -> None:
    draft = _draft((3, 2, 3, 6), seed=9)
    narrow = DraftResult(**{**draft.__dict__, "seq_lens": draft.seq_lens.to(torch.int32)})
    want = _reference(draft, TreeMaskMode.FULL_MASK)
    _assert_same(_run(narrow, TreeMaskMode.FULL_MASK, "torch", want), want)


@pytest.mark.parametrize(
    ("field", "bad", "message"),
    [
        (
            "top_scores_index",
            lambda d: d.top_scores_index[:, 1:],
            "`top_scores_index` must have shape",
        ),
        ("draft_tokens", lambda d: d.draft_tokens[:1], "`draft_tokens` must have shape"),
        ("parent_list", lambda d: d.parent_list[:, :-1], "`parent_list` must have shape"),
        ("num_verify_tokens", lambda d: 99, "exceeds the 15 nodes"),
    ],
)
def test_bad_inputs_name_the_argument(
    field: str, bad: Callable[[DraftResult], object], message: str
) -> None:
    draft = _draft((3, 2, 4, 9), seed=1)
    broken = DraftResult(**{**draft.__dict__, field: bad(draft)})
    with pytest.raises(ValueError, match=message):
        _reference_free_build(broken)


@pytest.mark.parametrize("field", ["parent_list", "top_scores_index", "seq_lens"])
def test_float_index_tensors_are_rejected_naming_the_dtype(field: str) -> None:
    draft = _draft((3, 2, 4, 9), seed=1)
    broken = DraftResult(**{**draft.__dict__, field: getattr(draft, field).float()})
    with pytest.raises(TypeError, match=f"`{field}` must be int64 or int32; got torch.float32"):
        _reference_free_build(broken)


def test_wrong_tree_mask_buf_is_rejected() -> None:
    draft = _draft((3, 2, 4, 9), seed=1)
    with pytest.raises(ValueError, match="`tree_mask_buf` must be"):
        _reference_free_build(draft, tree_mask_buf=torch.zeros(5, dtype=torch.bool))


def _reference_free_build(draft: DraftResult, **buffers: torch.Tensor) -> BuiltTree:
    return build_tree(
        *_inputs(draft),
        backend="torch",
        **buffers,
    )


@pytest.mark.parametrize("case", SMALL_CASES + LARGE_CASES, ids=str)
def test_auto_without_buffers_matches_reference(case: tuple[int, int, int, int]) -> None:
    # Small CPU batches take the host loop, larger ones (and graph-safe mode) the torch path.
    from relayc.kernels._backend import graph_safe_paths

    draft = _draft(case, seed=23)
    args = _inputs(draft)
    for mode in TreeMaskMode:
        if mode == TreeMaskMode.QLEN_ONLY_BITPACKING and case[3] > MAX_BITPACKED_NODES:
            continue  # checked in test_bitpacking_rejects_more_than_32_nodes
        want = _reference(draft, mode)
        _assert_same(build_tree(*args, mode, backend="auto"), want)
        with graph_safe_paths():
            _assert_same(build_tree(*args, mode, backend="auto"), want)
