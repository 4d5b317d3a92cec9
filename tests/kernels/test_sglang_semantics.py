"""Conformance with SGLang 0.5.23's verify-kernel semantics, rule by rule, on every backend.

Each test states one rule in words, cites where SGLang has it, and checks it with inputs
built by hand from that rule (no SGLang code is copied; SGLang was read for semantics
only). Sources, all in the sglang 0.5.23 wheel unless a PR is named:

- ``kernels/jit/include/sgl_kernel/speculative/sampling.cuh``: the target-only tree
  sampler (``tree_speculative_sampling_target_only``), with PR #35798's strict coin test
  and ``has_target_mass`` guard (sglang issue #35771);
- ``kernels/ops/speculative/reject_sampling.py``: chain rejection sampling
  (``speculative_sampling_classic_kernel``) and its ``BLOCK_VERIFICATION`` mode (Sun et
  al. 2024, "Block Verification Accelerates Speculative Decoding", Algorithm 2);
- ``srt/speculative/eagle_utils.py`` (``build_tree_kernel_efficient``) and
  ``kernels/jit/include/sgl_kernel/speculative/eagle.cuh``
  (``build_tree_efficient_partial_packed``): the tree builder's signature and the
  ``QLEN_ONLY_BITPACKING`` layout; ``kernels/ops/speculative/spec_tree.py``
  (``TreeMaskMode``).

Where relayc deliberately differs (the 1e-3 slack on a draft ``q`` above 1; NaN, inf and
negative target entries read as 0; an all-zero residual falling back to the target row),
the test says so. Losslessness of block verification is checked by chi-square in
``test_chain_sampling.py`` (``test_generated_streams_are_lossless``,
``test_chi_square_catches_biased_block_verification``).
"""

from __future__ import annotations

import inspect
import math

import pytest
import torch

from relayc.kernels import (
    TreeMaskMode,
    build_tree,
    build_tree_reference,
    chain_speculative_sampling,
    chain_speculative_sampling_reference,
    tree_speculative_sampling_target_only,
    tree_speculative_sampling_target_only_reference,
)
from relayc.kernels._inverse_cdf import target_mass_torch
from relayc.kernels.build_tree import unpack_tree_mask
from tests.kernels.stats import grid_probs, grid_uniforms
from tests.kernels.tree_utils import draft_eagle_tree
from tests.kernels.trees import random_trees

BACKENDS = ["reference", "torch", "triton", "auto"]
LARGEST_COIN = 1.0 - 2**-24  # the largest float32 below 1


# ---------------------------------------------------------------- helpers


def run_tree(backend: str, candidates, next_token, next_sibling, num_spec_step, coins, final,
             target, draft=None, **kw):  # fmt: skip
    """One call of the tree sampler; returns ``(emitted tokens per request, accepted)``."""
    batch, n = candidates.shape
    predicts = torch.full((batch * n,), -1, dtype=torch.int32)
    accept_index = torch.full((batch, num_spec_step), -99, dtype=torch.int32)
    accept_num = torch.full((batch,), -99, dtype=torch.int32)
    retrive_index = torch.arange(batch * n).view(batch, n)
    if backend == "reference":
        fn = tree_speculative_sampling_target_only_reference
    else:
        fn = tree_speculative_sampling_target_only
        kw = {**kw, "backend": backend}
    draft = torch.zeros_like(target) if draft is None else draft
    fn(predicts, accept_index, accept_num, candidates, retrive_index, next_token, next_sibling,
       coins, final, target, draft, **kw)  # fmt: skip
    emitted = [
        predicts[accept_index[b, : int(k) + 1].long()].tolist() for b, k in enumerate(accept_num)
    ]
    return emitted, accept_num.tolist(), accept_index


def run_chain(backend: str, drafts, coins, final, target, draft, **kw):
    """One call of the chain sampler; returns ``(emitted tokens per request, accepted)``."""
    batch, num_drafts = drafts.shape
    predicts = torch.full((batch * (num_drafts + 1),), -1, dtype=torch.int32)
    accept_index = torch.full((batch, num_drafts + 1), -99, dtype=torch.int32)
    accept_num = torch.full((batch,), -99, dtype=torch.int32)
    if backend == "reference":
        fn = chain_speculative_sampling_reference
    else:
        fn = chain_speculative_sampling
        kw = {**kw, "backend": backend}
    fn(predicts, accept_index, accept_num, drafts, coins, final, target, draft, **kw)
    emitted = [
        predicts[accept_index[b, : int(k) + 1].long()].tolist() for b, k in enumerate(accept_num)
    ]
    return emitted, accept_num.tolist()


def root_with_children(tokens: list[int]):
    """Root (token 0) with children ``tokens`` tried in order; tensors for ``run_tree``."""
    n = len(tokens) + 1
    candidates = torch.tensor([[0, *tokens]])
    next_token = torch.tensor([[1] + [-1] * (n - 1)])
    next_sibling = torch.tensor([[-1, *range(2, n), -1]])
    return candidates, next_token, next_sibling


# ---------------------------------------------------------------- tree sampling


@pytest.mark.parametrize("backend", BACKENDS)
def test_tree_coin_on_the_boundary_goes_to_the_next_sibling(backend):
    """Rule: a child is accepted when ``coin < prob_acc / threshold_acc`` -- strictly less.
    A coin exactly equal to the running sum belongs to the next sibling's interval.
    Source: sampling.cuh (``coin < prob_acc / threshold_acc``), SGLang PR #35798.
    Case from relayc issue 16: children tokens 1, 2, 3, target row [0, .25, 0, .75],
    coin exactly .25, thresholds 1/1: token 3 is emitted (``<=`` would give token 1)."""
    tree = root_with_children([1, 2, 3])
    target = torch.tensor([[0.0, 0.25, 0.0, 0.75]]).expand(4, 4)[None].contiguous()
    final = torch.tensor([0.5])
    emitted, accepted, _ = run_tree(backend, *tree, 2, torch.tensor([[0.25] * 4]), final, target)
    assert accepted == [1] and emitted[0][0] == 3
    below = torch.tensor([[0.25 - 2**-12] * 4])
    emitted, accepted, _ = run_tree(backend, *tree, 2, below, final, target)
    assert accepted == [1] and emitted[0][0] == 1


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("threshold_single", [1.0, 0.0])
def test_tree_zero_target_probability_child_is_never_accepted(backend, threshold_single):
    """Rule: a child whose target probability is 0 is never accepted, not with coin 0
    (``0 < 0`` is false) and not with ``threshold_single <= 0``.
    Source: sampling.cuh's ``has_target_mass`` guard, SGLang PR #35798 / issue #35771."""
    tree = root_with_children([1, 2])
    target = torch.tensor([[0.0, 0.0, 1.0]]).expand(3, 3)[None].contiguous()
    emitted, accepted, _ = run_tree(
        backend,
        *tree,
        2,
        torch.zeros(1, 3),
        torch.tensor([0.0]),
        target,
        threshold_single=threshold_single,
    )
    assert accepted == [1] and emitted[0][0] == 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_tree_degenerate_target_entries_count_as_zero(backend):
    """Rule (relayc's degenerate-input policy; SGLang reads such values as they are):
    NaN, +-inf and negative target entries are no probability mass. A child whose target
    entry is one of them is rejected, and the final draw never lands on it."""
    tree = root_with_children([1, 2, 3])
    for bad in (math.nan, math.inf, -math.inf, -0.5):
        row = torch.tensor([0.0, bad, bad, 1.0])
        target = row.expand(4, 4)[None].contiguous()
        for coin in (0.0, 0.5, LARGEST_COIN):
            emitted, accepted, _ = run_tree(
                backend, *tree, 2, torch.full((1, 4), coin), torch.tensor([coin]), target
            )
            assert accepted == [1] and emitted[0][0] == 3, (bad, coin)


# ---------------------------------------------------------------- chain sampling


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("block_verification", [False, True])
def test_chain_draft_q_rounded_just_above_one_counts_as_one(backend, block_verification):
    """Rule: a drafted token's ``q`` in ``(1, 1 + 1e-3]`` is a peaked softmax rounded up
    and counts as 1, so a draft both models hold with probability ~1 is accepted.
    Source: relayc issue 16's reading of SGLang's chain verify. SGLang 0.5.23's
    reject_sampling.py itself tests ``q <= 1`` with no slack (it would reject here);
    relayc keeps the slack. Beyond ``1 + 1e-3`` the draft is rejected."""
    drafts = torch.tensor([[1]])
    target = torch.tensor([[[0.0, 1.0], [0.5, 0.5]]])
    coins, final = torch.tensor([[1 - 2**-12]]), torch.tensor([0.0])
    mode = {"block_verification": block_verification}
    for q, want in ((1.0, 1), (1.0005, 1), (1.001, 1), (1.002, 0), (1.5, 0)):
        draft = torch.tensor([[[0.0, q]]])
        _, accepted = run_chain(backend, drafts, coins, final, target, draft, **mode)
        assert accepted == [want], q


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("block_verification", [False, True])
def test_chain_draft_with_an_impossible_q_is_rejected(backend, block_verification):
    """Rule: a drafted token whose ``q`` is 0, negative, +-inf or NaN could not have been
    drafted; it is rejected whatever the coin and the target say.
    Source: reject_sampling.py (``q_is_prob = (q > 0) & (q <= 1)``)."""
    drafts = torch.tensor([[1]])
    target = torch.tensor([[[0.0, 0.5, 0.5], [1.0, 0.0, 0.0]]])
    mode = {"block_verification": block_verification}
    for q in (0.0, -0.25, -math.inf, math.inf, math.nan):
        draft = torch.tensor([[[0.0, q, 0.0]]])
        _, accepted = run_chain(
            backend, drafts, torch.zeros(1, 1), torch.tensor([0.0]), target, draft, **mode
        )
        assert accepted == [0], q


@pytest.mark.parametrize("backend", BACKENDS)
def test_chain_nan_in_draft_probs_does_not_reach_the_residual(backend):
    """Rule: in the residual ``relu(p - q)`` a ``q`` that is not a probability subtracts
    nothing (it counts as 0), so a NaN never poisons the draw and never sends it to a
    zero-target token. Source: reject_sampling.py (``q_val`` outside [0, 1] -> 0).
    Case from relayc issue 16: relayc's torch backend used to emit token 3 here (zero
    target probability), the reference token 1."""
    drafts = torch.tensor([[0]])
    target = torch.tensor([[[0.5, 0.5, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]])
    draft = torch.tensor([[[1.0, math.nan, 0.0, 0.0]]])
    emitted, accepted = run_chain(
        backend, drafts, torch.tensor([[0.75]]), torch.tensor([0.5]), target, draft
    )
    # 0.75 * 1 >= 0.5 rejects; relu(p - q) = [0, .5, 0, 0]: token 1.
    assert accepted == [0] and emitted == [[1]]


@pytest.mark.parametrize("backend", BACKENDS)
def test_chain_zero_target_probability_draft_is_never_accepted(backend):
    """Rule: accept only if ``coin * q < p``; with ``p = 0`` that fails even at coin 0.
    Source: reject_sampling.py (``coin * q < p``)."""
    drafts = torch.tensor([[2]])
    target = torch.tensor([[[0.5, 0.5, 0.0], [1.0, 0.0, 0.0]]])
    draft = torch.tensor([[[0.0, 0.0, 1.0]]])
    emitted, accepted = run_chain(
        backend, drafts, torch.zeros(1, 1), torch.tensor([0.0]), target, draft
    )
    assert accepted == [0] and emitted == [[0]]


@pytest.mark.parametrize("backend", BACKENDS)
def test_all_zero_target_row_accepts_nothing_and_falls_back_to_the_last_token(backend):
    """Rule: a target row with no mass (all 0, or all NaN/inf/negative) leaves nothing
    valid to emit; no draft is accepted against it and the draw returns ``V - 1``, the
    fallback SGLang's kernels use. This is the one case where the emitted token has no
    target probability -- there is none to have. Source: reject_sampling.py
    (``final_token = VOCAB_SIZE - 1`` when no CDF bucket is found)."""
    drafts = torch.tensor([[1]])
    draft = torch.tensor([[[0.0, 1.0, 0.0]]])
    for bad in (0.0, math.nan, -1.0):
        target = torch.tensor([[[bad, bad, bad], [1.0, 0.0, 0.0]]])
        emitted, accepted = run_chain(
            backend, drafts, torch.zeros(1, 1), torch.tensor([0.5]), target, draft
        )
        assert accepted == [0] and emitted == [[2]], bad


@pytest.mark.parametrize("backend", BACKENDS)
def test_rows_off_by_rounding_never_emit_a_zero_probability_token(backend):
    """Rule: rows need not sum to exactly 1: the draw scales the coin by the row's own
    sum, and a coin so close to 1 that rounding finds no bucket takes the last token
    with mass, never a zero-probability one. Source: sampling.cuh / reject_sampling.py
    (``u = coin * sum``); the last-positive fallback is relayc's (SGLang: ``V - 1``)."""
    drafts = torch.zeros(1, 0, dtype=torch.int64)
    draft = torch.zeros(1, 0, 3)
    for row in ([0.5, 0.499, 0.0], [0.5, 0.501, 0.0], [0.3, 0.3, 0.3999999]):
        target = torch.tensor([[row]])
        emitted, _ = run_chain(
            backend, drafts, torch.zeros(1, 0), torch.tensor([LARGEST_COIN]), target, draft
        )
        assert row[emitted[0][0]] > 0, row


def degenerate(probs: torch.Tensor, gen: torch.Generator, frac: float) -> torch.Tensor:
    """``probs`` with about ``frac`` of its entries replaced by NaN, +-inf or negatives."""
    bad_values = torch.tensor([math.nan, math.inf, -math.inf, -0.25, -1e-30])
    pick = torch.randint(len(bad_values), probs.shape, generator=gen)
    hit = torch.rand(probs.shape, generator=gen) < frac
    return torch.where(hit, bad_values[pick], probs)


@pytest.mark.parametrize("block_verification", [False, True])
def test_chain_backends_agree_on_degenerate_inputs(block_verification):
    """Rule: every backend emits the same tokens on every input, degenerate ones
    included, and no emitted token has zero (cleaned) target probability where its row
    has any. Source: relayc issue 16 (SGLang has one backend per platform; relayc's
    reference, torch and Triton paths must be interchangeable)."""
    gen = torch.Generator().manual_seed(16)
    batch, num_drafts, vocab = 24, 4, 9
    target = degenerate(grid_probs((batch, num_drafts + 1, vocab), gen), gen, 0.15)
    draft = degenerate(grid_probs((batch, num_drafts, vocab), gen), gen, 0.15)
    drafts = torch.randint(vocab, (batch, num_drafts), generator=gen)
    coins = grid_uniforms((batch, num_drafts), gen)
    final = grid_uniforms((batch,), gen)
    mode = {"block_verification": block_verification}
    results = {b: run_chain(b, drafts, coins, final, target, draft, **mode) for b in BACKENDS}
    assert all(r == results["reference"] for r in results.values()), results
    clean = target_mass_torch(target)
    emitted, _ = results["reference"]
    for b, tokens in enumerate(emitted):
        for k, token in enumerate(tokens):
            if clean[b, k].sum() > 0:
                assert clean[b, k, token] > 0, (b, k, token)


def test_tree_backends_agree_on_degenerate_inputs():
    """Rule: as above, for the tree sampler (random trees, degenerate target and draft
    rows). Source: relayc issue 16."""
    gen = torch.Generator().manual_seed(61)
    batch, num_draft, vocab, num_spec_step = 12, 7, 9, 4
    trees = random_trees(batch, num_draft, max_depth=num_spec_step - 1, vocab=vocab, gen=gen)
    target = degenerate(grid_probs((batch, num_draft, vocab), gen), gen, 0.15)
    draft = degenerate(grid_probs((batch, num_draft, vocab), gen), gen, 0.15)
    coins = grid_uniforms((batch, num_draft), gen)
    final = grid_uniforms((batch,), gen)
    tree = (trees.candidates, trees.retrive_next_token, trees.retrive_next_sibling)
    results = {}
    for backend in BACKENDS:
        emitted, accepted, accept_index = run_tree(
            backend, *tree, num_spec_step, coins, final, target, draft
        )
        results[backend] = (emitted, accepted, accept_index.tolist())
    assert all(r == results["reference"] for r in results.values()), results
    clean = target_mass_torch(target)
    emitted, _, accept_index = results["reference"]
    for b, tokens in enumerate(emitted):
        for k, token in enumerate(tokens):
            node = accept_index[b][k] - b * num_draft
            if clean[b, node].sum() > 0:
                assert clean[b, node, token] > 0, (b, k, token)


# ---------------------------------------------------------------- block verification


@pytest.mark.parametrize("backend", BACKENDS)
def test_block_verification_accepts_the_longest_block_that_passes(backend):
    """Rule: with ``block_verification=True`` the chain accepts ``n = max{i : u_{i-1} <
    h_i}`` drafts, where ``h_S = w_S`` and ``w_i = min(1, w_{i-1} p(x_i) / q(x_i))``: a
    later draft can rescue an earlier one that token-wise verification would reject.
    Source: reject_sampling.py (``BLOCK_VERIFICATION``), Sun et al. 2024 Algorithm 2.
    Here ``w_1 = 0.5``, ``w_2 = 1``: coins [0.75, 0.5] reject draft 1 token-wise but
    accept both drafts as a block."""
    drafts = torch.tensor([[0, 1]])
    target = torch.tensor([[[0.5, 0.5], [0.0, 1.0], [0.25, 0.75]]])
    draft = torch.tensor([[[1.0, 0.0], [0.5, 0.5]]])
    coins, final = torch.tensor([[0.75, 0.5]]), torch.tensor([0.5])
    _, token_wise = run_chain(backend, drafts, coins, final, target, draft)
    _, block = run_chain(backend, drafts, coins, final, target, draft, block_verification=True)
    assert token_wise == [0] and block == [2]


# ---------------------------------------------------------------- build_tree


SGLANG_0_5_23_BUILD_TREE_PARAMETERS = [
    "bonus_tokens",
    "parent_list",
    "top_scores_index",
    "draft_tokens",
    "seq_lens",
    "seq_lens_sum",
    "topk",
    "spec_steps",
    "num_verify_tokens",
    "tree_mask_mode",
    "tree_mask_buf",
    "fill_prefix_mask",
]


def test_build_tree_takes_sglang_0_5_23_parameters_in_order():
    """Rule: ``build_tree_kernel_efficient(bonus_tokens, parent_list, top_scores_index,
    draft_tokens, seq_lens, seq_lens_sum, topk, spec_steps, num_verify_tokens,
    tree_mask_mode=FULL_MASK, tree_mask_buf=None, fill_prefix_mask=True)``; relayc's
    extras are keyword-only. Source: srt/speculative/eagle_utils.py."""
    params = inspect.signature(build_tree).parameters
    positional = [
        name for name, p in params.items() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    assert positional == SGLANG_0_5_23_BUILD_TREE_PARAMETERS
    assert params["tree_mask_mode"].default == TreeMaskMode.FULL_MASK
    assert params["fill_prefix_mask"].default is True
    assert [m.value for m in TreeMaskMode] == [0, 1, 2]  # spec_tree.py's TreeMaskMode


def small_draft(n: int = 6, topk: int = 2, spec_steps: int = 3, batch: int = 3):
    return draft_eagle_tree(batch, topk, spec_steps, n, torch.Generator().manual_seed(n))


def build_args(d, **overrides):
    args = {
        "bonus_tokens": d.verified_id,
        "parent_list": d.parent_list,
        "top_scores_index": d.top_scores_index,
        "draft_tokens": d.draft_tokens,
        "seq_lens": d.seq_lens,
        "seq_lens_sum": d.seq_lens_sum,
        "topk": d.topk,
        "spec_steps": d.spec_steps,
        "num_verify_tokens": d.num_verify_tokens,
    }
    return {**args, **overrides}


def assert_same_tree(got, want):
    for name, g, w in zip(want._fields, got, want, strict=True):
        assert g.dtype == w.dtype and torch.equal(g.to(torch.int64), w.to(torch.int64)), name


@pytest.mark.parametrize("backend", ["torch", "triton", "auto"])
def test_build_tree_verified_id_is_a_deprecated_alias(backend):
    """Rule: SGLang 0.5.23 renamed ``verified_id`` to ``bonus_tokens``; relayc keeps the
    old keyword working, with a DeprecationWarning, and refuses both at once.
    Source: srt/speculative/eagle_utils.py (``bonus_tokens``)."""
    d = small_draft()
    want = build_tree(**build_args(d), backend=backend)
    args = build_args(d)
    bonus = args.pop("bonus_tokens")
    with pytest.warns(DeprecationWarning, match="bonus_tokens"):
        got = build_tree(verified_id=bonus, **args, backend=backend)
    assert_same_tree(got, want)
    with pytest.raises(TypeError, match="both `bonus_tokens` and"):
        build_tree(**build_args(d), verified_id=bonus, backend=backend)


@pytest.mark.parametrize("backend", ["torch", "triton", "auto"])
def test_build_tree_parent_list_may_be_a_list(backend):
    """Rule: ``parent_list`` is typed ``List[torch.Tensor]`` in 0.5.23: the per-step parent
    tensors, concatenated along dim 1 (as ``organize_draft_results`` does); relayc takes
    that list or the concatenated tensor. Source: srt/speculative/eagle_utils.py."""
    d = small_draft(n=7, topk=2, spec_steps=4)
    want = build_tree(**build_args(d), backend=backend)
    steps = [d.parent_list[:, :1], d.parent_list[:, 1:3], d.parent_list[:, 3:]]
    assert_same_tree(build_tree(**build_args(d, parent_list=steps), backend=backend), want)
    one_level = small_draft(n=3, topk=2, spec_steps=1)
    assert_same_tree(
        build_tree(**build_args(one_level, parent_list=[]), backend=backend),
        build_tree(**build_args(one_level), backend=backend),
    )


@pytest.mark.parametrize("backend", ["torch", "triton", "auto"])
def test_build_tree_accepts_int32_index_tensors(backend):
    """Rule: index tensors come as int64 or int32 from SGLang's callers (seq_lens is
    int32 in several paths); both give the same tree, other dtypes are rejected with the
    dtype named. Source: srt/speculative/eagle_utils.py callers."""
    d = small_draft()
    want = build_tree(**build_args(d), backend=backend)
    narrow = {
        name: getattr(d, name).to(torch.int32)
        for name in ("parent_list", "top_scores_index", "seq_lens")
    }
    assert_same_tree(build_tree(**build_args(d, **narrow), backend=backend), want)


@pytest.mark.parametrize("backend", ["torch", "triton", "auto"])
def test_tree_kernels_accept_int32_tree_tensors(backend):
    """Rule: the verify kernels read int32 tree tensors as SGLang's callers may pass them,
    with the same result as int64. Source: sampling.cuh (templated ``IdType``)."""
    tree = root_with_children([1, 2, 3])
    target = torch.tensor([[0.0, 0.25, 0.0, 0.75]]).expand(4, 4)[None].contiguous()
    coins, final = torch.tensor([[0.25] * 4]), torch.tensor([0.5])
    want = run_tree(backend, *tree, 2, coins, final, target)
    narrow = tuple(t.to(torch.int32) for t in tree)
    got = run_tree(backend, *narrow, 2, coins, final, target)
    assert got[:2] == want[:2]


@pytest.mark.parametrize("backend", ["reference", "torch", "triton", "auto"])
def test_qlen_only_bitpacking_packs_each_window_row_into_bits(backend):
    """Rule: ``QLEN_ONLY_BITPACKING`` stores row ``i`` of each request's ``N x N`` window
    as one little-endian integer, bit ``j`` set iff node ``j`` is ``i`` or an ancestor
    (the root, bit 0, always); uint8 for N <= 8, uint16 for N <= 16, uint32 for N <= 32.
    Source: eagle.cuh ``build_tree_efficient_partial_packed``; eagle_utils.py's dtypes.
    Hand-built tree (topk 2, depth 2): nodes 1, 2 are root children, node 3 a child of 1,
    so the rows are {0}, {0,1}, {0,2}, {0,1,3} = 1, 3, 5, 11."""
    args = build_args(
        small_draft(),
        bonus_tokens=torch.tensor([7]),
        parent_list=torch.tensor([[-1, 0, 1]]),
        top_scores_index=torch.tensor([[0, 1, 2]]),
        draft_tokens=torch.tensor([[4, 5, 6]]),
        seq_lens=torch.tensor([10]),
        seq_lens_sum=10,
        topk=2,
        spec_steps=2,
        num_verify_tokens=4,
        tree_mask_mode=TreeMaskMode.QLEN_ONLY_BITPACKING,
    )
    if backend == "reference":
        built = build_tree_reference(*args.values())
    else:
        built = build_tree(**args, backend=backend)
    assert built.tree_mask.dtype == torch.uint8
    assert built.tree_mask.to(torch.int64).tolist() == [1, 3, 5, 11]
    assert built.positions.tolist() == [10, 11, 11, 12]


@pytest.mark.parametrize("backend", ["torch", "triton", "auto"])
@pytest.mark.parametrize(
    ("n", "dtype"), [(8, torch.uint8), (9, torch.uint16), (16, torch.uint16), (17, torch.uint32)]
)
def test_qlen_only_bitpacking_width_follows_n(backend, n, dtype):
    """Rule: the packed element type is the narrowest of uint8/16/32 that holds N bits,
    and unpacked it is exactly the QLEN_ONLY window. Source: eagle_utils.py
    (``packed_dtypes``)."""
    d = small_draft(n=n, topk=4, spec_steps=5)
    packed = build_tree(**build_args(d), tree_mask_mode=2, backend=backend)
    window = build_tree(**build_args(d), tree_mask_mode=TreeMaskMode.QLEN_ONLY, backend=backend)
    assert packed.tree_mask.dtype == dtype
    assert torch.equal(unpack_tree_mask(packed.tree_mask, n), window.tree_mask)


def test_qlen_only_bitpacking_rejects_more_than_32_nodes():
    """Rule: bit-packing holds at most 32 nodes per row (``CHECK_HOST(draft_token_num <=
    32)``). Source: kernels/jit/csrc/speculative/tree.cuh."""
    d = small_draft(n=33, topk=4, spec_steps=5)
    with pytest.raises(ValueError, match="at most 32 nodes"):
        build_tree(**build_args(d), tree_mask_mode=TreeMaskMode.QLEN_ONLY_BITPACKING)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_fill_prefix_mask_false_leaves_the_prefix_columns_alone(backend):
    """Rule: with ``fill_prefix_mask=False`` (FULL_MASK) the prefix columns of the mask
    are not written -- a caller whose attention never reads them skips that memset --
    while every tree cell still is. Source: srt/speculative/eagle_utils.py."""
    d = small_draft()
    want = build_tree(**build_args(d), backend=backend)
    poison = ~want.tree_mask
    got = build_tree(
        **build_args(d), tree_mask_buf=poison.clone(), fill_prefix_mask=False, backend=backend
    )
    n = d.num_verify_tokens
    is_prefix = torch.zeros_like(want.tree_mask)
    start = 0
    for seq_len in d.seq_lens.tolist():
        rows = torch.arange(n)[:, None] * (seq_len + n) + torch.arange(seq_len)
        is_prefix[start + rows.flatten()] = True
        start += n * (seq_len + n)
    assert torch.equal(got.tree_mask[is_prefix], poison[is_prefix])
    assert torch.equal(got.tree_mask[~is_prefix], want.tree_mask[~is_prefix])
