"""`build_tree` of a chain that keeps every draft (topk 1, N = num_steps + 1) is laid out
directly: the same outputs as the general build, bit for bit."""

from __future__ import annotations

import pytest
import torch

import relayc.engine.ops.verify as verify_ops
from relayc.engine.draft.tree import chain_tree
from relayc.engine.ops.context import StepContext
from relayc.engine.ops.verify import impl_build_tree


def _context(topk: int, num_steps: int, n: int) -> StepContext:
    dims = {"topk": topk, "num_steps": num_steps, "num_draft_tokens": n}
    return StepContext(model=None, kv_cache=None, req_to_token=torch.zeros(1, 1), dims=dims)  # type: ignore[arg-type]


@pytest.mark.parametrize(("batch", "num_steps"), [(1, 1), (1, 3), (4, 2), (3, 7)])
def test_a_kept_chain_is_built_as_the_general_build_builds_it(
    batch: int, num_steps: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    g = torch.Generator().manual_seed(batch * 10 + num_steps)
    drafts = torch.randint(0, 50000, (batch, num_steps), generator=g)
    tree = chain_tree(drafts)
    inputs = {
        "bonus_tokens": torch.randint(0, 50000, (batch,), generator=g),
        "parent_list": tree.parent_list,
        "top_scores_index": tree.top_scores_index,
        "draft_tokens": tree.draft_tokens,
        "seq_lens": torch.randint(0, 900, (batch,), generator=g),
    }
    ctx = _context(1, num_steps, num_steps + 1)
    got = impl_build_tree(ctx, **inputs)
    monkeypatch.setattr(verify_ops, "CHAIN_SHORTCUT", False)
    general = impl_build_tree(ctx, **inputs)  # the layout of any tree
    assert got.keys() == general.keys()
    for name, value in got.items():
        want = general[name]
        assert value.dtype == want.dtype and value.shape == want.shape, name
        assert value.is_contiguous(), name
        assert torch.equal(value, want), name
