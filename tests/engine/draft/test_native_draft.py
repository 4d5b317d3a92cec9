"""An EAGLE-3 head's greedy chain in one native call (relayc.engine.draft.native_draft): the
step-by-step chain's drafts and scratch K/V, bit for bit, in float32 and bfloat16; a near
tie at the top and a bad index hand the chain back to the step-by-step path, which decides
and raises as before."""

from __future__ import annotations

import copy

import pytest
import torch

from relayc.engine.draft.eagle3 import Eagle3Head
from relayc.engine.draft.native_draft import NativeDraft
from relayc.engine.draft.tree import DraftTree
from relayc.engine.model.llama import LlamaForCausalLM
from relayc.engine.model.weights import random_model
from relayc.engine.native.library import native_decoder
from tests.engine.draft import test_eagle3 as eagle3_tests
from tests.engine.draft.helpers import MAX_CONTEXT, SMALL, padded, padded_states
from tests.engine.draft.test_eagle3 import DRAFT_VOCAB, Prefilled, draft, extend

# the EAGLE-3 tests' target and head
target = eagle3_tests.target
head = eagle3_tests.head


@pytest.fixture(scope="module")
def bf16_target() -> LlamaForCausalLM:
    return random_model(SMALL.replace(num_layers=4, dtype=torch.bfloat16), seed=1)


@pytest.fixture(scope="module")
def bf16_head(bf16_target: LlamaForCausalLM) -> Eagle3Head:
    """A bfloat16 head over a bfloat16 target: the calls round where the step-by-step
    path holds bfloat16 tensors (fc's output, the layer's) and widen the embedding."""
    return Eagle3Head.random(bf16_target, seed=2, draft_vocab_size=DRAFT_VOCAB, layer_ids=[0, 1, 2])


@pytest.fixture(params=["float32", "bfloat16"])
def models(request: pytest.FixtureRequest) -> tuple[LlamaForCausalLM, Eagle3Head]:
    """The float32 or the bfloat16 target and head."""
    prefix = "" if request.param == "float32" else "bf16_"
    return request.getfixturevalue(f"{prefix}target"), request.getfixturevalue(f"{prefix}head")


def _recorded(monkeypatch: pytest.MonkeyPatch, name: str) -> list[bool]:
    """Whether each call of ``NativeDraft.<name>`` made its result (True) or handed it back."""
    assert native_decoder() is not None, "the native decoder should build here"
    made: list[bool] = []
    real = getattr(NativeDraft, name)

    def recorded(self: NativeDraft, *args: object) -> object:
        out = real(self, *args)
        made.append(out is not None)
        return out

    monkeypatch.setattr(NativeDraft, name, recorded)
    return made


@pytest.fixture
def chains(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    return _recorded(monkeypatch, "chain")


@pytest.fixture
def extends(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    return _recorded(monkeypatch, "extend")


def _chain(
    head: Eagle3Head,
    pre: Prefilled,
    num_steps: int,
    first: torch.Tensor | None = None,
    sliced: bool = False,
) -> tuple[DraftTree, torch.Tensor, torch.Tensor]:
    """The chain's tree, and the K/V its steps left in their scratch slots (``sliced``: the
    slots a column slice of a wider table, as a decode step's slot table hands them)."""
    kv, out = extend(head, pre, topk=1)
    slots = torch.arange(400, 400 + 2 * (num_steps - 1)).view(2, -1)
    if sliced:
        slots = torch.cat([slots, slots + 100], dim=1)[:, : num_steps - 1]
        assert not slots.is_contiguous()
    index = None if first is None else first[:, None]
    tree = draft(head, pre, kv, out, slots, num_steps, num_steps + 1, topk_index=index)
    return tree, kv.k[0][slots.reshape(-1)].clone(), kv.v[0][slots.reshape(-1)].clone()


def _step_by_step(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(NativeDraft, "chain", lambda self, *args: None)


@pytest.mark.parametrize("num_steps", [2, 5])
def test_the_native_chain_is_the_step_by_step_chain(
    models: tuple[LlamaForCausalLM, Eagle3Head],
    num_steps: int,
    chains: list[bool],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    target, head = models
    pre = Prefilled(target, head.capture)
    tree, k, v = _chain(head, pre, num_steps)
    assert chains == [True]
    assert tree.draft_tokens.shape == (2, num_steps)
    assert int(tree.draft_tokens.max()) < DRAFT_VOCAB  # draft ids
    _step_by_step(monkeypatch)
    want, want_k, want_v = _chain(head, pre, num_steps)
    for got, expected in zip((*tree, k, v), (*want, want_k, want_v), strict=True):
        assert got.dtype == expected.dtype and got.shape == expected.shape
        assert torch.equal(got, expected)


def test_the_chain_takes_its_scratch_slots_as_a_slice_of_a_wider_table(
    target: LlamaForCausalLM, head: Eagle3Head, chains: list[bool], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch of several requests hands the chain a strided view of the step's slot table:
    the native call still drafts (it once declined every batch of more than one request)."""
    pre = Prefilled(target, head.capture)
    tree, k, v = _chain(head, pre, 3, sliced=True)
    assert chains == [True]
    _step_by_step(monkeypatch)
    want, want_k, want_v = _chain(head, pre, 3, sliced=True)
    for got, expected in zip((*tree, k, v), (*want, want_k, want_v), strict=True):
        assert torch.equal(got, expected)


def test_a_tie_at_the_top_is_decided_step_by_step(
    target: LlamaForCausalLM, chains: list[bool], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every draft logit equal: the softmax's top-1 is decided by its tie rule, which the
    native call does not claim to follow; it hands the chain back."""
    head = Eagle3Head.random(target, seed=6, draft_vocab_size=DRAFT_VOCAB, layer_ids=[0, 1, 2])
    with torch.no_grad():
        head.lm_head.weight.copy_(head.lm_head.weight[:1].expand_as(head.lm_head.weight))
    pre = Prefilled(target, head.capture)
    tree, k, v = _chain(head, pre, 3)
    assert chains == [False]
    _step_by_step(monkeypatch)
    want = _chain(head, pre, 3)
    for got, expected in zip((*tree, k, v), (*want[0], want[1], want[2]), strict=True):
        assert torch.equal(got, expected)


def test_a_bad_draft_id_raises_the_step_by_step_error(
    models: tuple[LlamaForCausalLM, Eagle3Head], chains: list[bool]
) -> None:
    target, head = models
    pre = Prefilled(target, head.capture)
    with pytest.raises(IndexError):
        _chain(head, pre, 3, first=torch.tensor([DRAFT_VOCAB, 0]))
    assert chains == [False]


def _extended(
    head: Eagle3Head, pre: Prefilled, topk: int, slots: torch.Tensor | None
) -> list[torch.Tensor]:
    """The extend's relayed top-k and g, and the whole draft cache after it."""
    kv, out = extend(head, pre, topk, slots)
    return [*out, kv.k[0], kv.v[0]]


@pytest.mark.parametrize(("topk", "own_slots"), [(1, False), (3, True)])
def test_the_native_extend_is_the_step_by_step_extend(
    models: tuple[LlamaForCausalLM, Eagle3Head],
    topk: int,
    own_slots: bool,
    extends: list[bool],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two prompts of different lengths (the shorter one's rows past its length are
    padding), the slots req_to_token holds or the caller's own."""
    target, head = models
    pre = Prefilled(target, head.capture)
    width = max(len(i) for i in pre.ids)
    slots = torch.arange(300, 300 + 2 * width).view(2, width) if own_slots else None
    got = _extended(head, pre, topk, slots)
    assert extends == [True]
    monkeypatch.setattr(NativeDraft, "extend", lambda self, *args: None)
    want = _extended(head, pre, topk, slots)
    for a, b in zip(got, want, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a, b)


def test_a_bad_token_id_in_the_extend_raises_the_step_by_step_error(
    models: tuple[LlamaForCausalLM, Eagle3Head], extends: list[bool]
) -> None:
    target, head = models
    pre = Prefilled(target, head.capture)
    pre.ids[0][1] = SMALL.vocab_size  # past the target's vocabulary
    with pytest.raises(IndexError):
        _extended(head, pre, 1, None)
    assert extends == [False]


def _extended_from_rows(head: Eagle3Head, pre: Prefilled, rows_of: str) -> list[torch.Tensor]:
    """The extend of :func:`_extended` with its features read through ``feature_rows`` from a
    verify-like tensor: every real row moved to another place, the rest noise; padding rows'
    entries ``rows_of`` ("noise": out of range, never read; "bad": a real row's too)."""
    features = padded_states(pre.features)  # [B, W, F]
    batch, width, size = features.shape
    g = torch.Generator().manual_seed(9)
    # noise, never read, in the features' dtype
    source = (torch.randn(batch, width + 3, size, generator=g) * 1e6).to(features.dtype)
    order = torch.randperm(batch * (width + 3), generator=g)[: batch * width].view(batch, width)
    source.view(-1, size)[order.view(-1)] = features.reshape(-1, size)
    real = torch.arange(width)[None, :] < pre.seq_lens[:, None]
    rows = torch.where(real, order, 10**6)
    if rows_of == "bad":
        rows[0, 0] = batch * (width + 3)  # one past the last row
    kv = head.make_kv_cache(pre.driver.kv_cache.size)
    out = head.extend(
        padded(pre.ids),
        source,
        pre.seq_lens,
        torch.zeros(batch, dtype=torch.int64),
        torch.tensor(pre.reqs),
        pre.req_to_token,
        kv,
        topk=1,
        max_prefix_len=MAX_CONTEXT,
        feature_rows=rows,
    )
    return [*out, kv.k[0], kv.v[0]]


def test_the_extend_gathers_its_feature_rows(
    models: tuple[LlamaForCausalLM, Eagle3Head],
    extends: list[bool],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``feature_rows``: each real row's features read where they lie (the accepted nodes of
    a verify), natively and step by step: the same as the features handed in place."""
    target, head = models
    pre = Prefilled(target, head.capture)
    want = _extended(head, pre, 1, None)
    got = _extended_from_rows(head, pre, "noise")
    assert extends == [True, True]
    monkeypatch.setattr(NativeDraft, "extend", lambda self, *args: None)
    eager = _extended_from_rows(head, pre, "noise")
    for a, b, c in zip(got, eager, want, strict=True):
        assert torch.equal(a, c) and torch.equal(b, c)


def test_a_bad_feature_row_raises_the_step_by_step_error(
    models: tuple[LlamaForCausalLM, Eagle3Head], extends: list[bool]
) -> None:
    target, head = models
    pre = Prefilled(target, head.capture)
    with pytest.raises(IndexError):
        _extended_from_rows(head, pre, "bad")
    assert extends == [False]


def test_a_head_that_drafted_deep_copies_and_drafts_alike(
    models: tuple[LlamaForCausalLM, Eagle3Head], chains: list[bool], extends: list[bool]
) -> None:
    target, head = models
    pre = Prefilled(target, head.capture)
    tree, _, _ = _chain(head, pre, 3)
    twin = copy.deepcopy(head)
    again, _, _ = _chain(twin, pre, 3)
    assert chains == extends == [True, True]
    assert all(torch.equal(a, b) for a, b in zip(tree, again, strict=True))
