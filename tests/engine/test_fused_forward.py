"""A decode or verify forward in one native call (relayc.engine.decoder.fused_forward): the bits of
the calls made one by one -- logits, hidden states, captured layer inputs, the K/V it
writes, the argmax it leaves -- for float32, bfloat16 and GGUF-block weights; bad indices
still raise the usual path's errors and write nothing; a replaced embedding or another
set of caches is followed."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

from relayc.engine.checkpoints.gguf import load_gguf_model, open_gguf, save_gguf
from relayc.engine.core.config import ModelConfig
from relayc.engine.core.forward_batch import ForwardBatch, ForwardMode
from relayc.engine.decoder.fused_forward import FusedForward
from relayc.engine.model.llama import LlamaForCausalLM, use_cpu_matmul_layout
from relayc.engine.model.weights import random_model
from relayc.engine.native import head_argmax
from relayc.engine.native.library import native_decoder
from tests.engine.helpers import PagedDriver
from tests.tolerance import assert_forwards_close

# whole 32-weight blocks for the GGUF case; 3 layers so a capture can skip one
CONFIG = ModelConfig(
    hidden_size=128, intermediate_size=256, num_layers=3, num_heads=4, num_kv_heads=2, head_dim=32
)
TREE = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool)


@pytest.fixture
def fused_runs(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether each FusedForward.run made the forward (True) or handed it back (False)."""
    assert native_decoder() is not None, "the native decoder should build here"
    runs: list[bool] = []
    real = FusedForward.run

    def run(self: FusedForward, *args: object) -> object:
        made = real(self, *args)  # type: ignore[arg-type]
        runs.append(made is not None)
        return made

    monkeypatch.setattr(FusedForward, "run", run)
    return runs


def _tokens(n: int, seed: int) -> list[int]:
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _forward(
    driver: PagedDriver,
    mode: ForwardMode,
    reqs: Sequence[int],
    tokens: Sequence[Sequence[int]],
    capture: Sequence[int],
    commit: bool,
) -> list[torch.Tensor]:
    width = len(tokens[0])
    slots = driver._alloc(len(reqs) * width)
    prefix = [driver.lens[r] for r in reqs]
    batch = ForwardBatch.build(
        mode,
        tokens,
        reqs,
        prefix,
        slots,
        driver.req_pool.req_to_token,
        driver.kv_cache,
        positions=[[p + d for d in (0, 1, 1, 2)[:width]] for p in prefix],
        tree_mask=TREE[None].expand(len(reqs), -1, -1).contiguous() if width > 1 else None,
    )
    out = driver.model(batch, capture=capture)
    if driver.model.scripted is not None:  # the native head leaves each row's argmax
        greedy = head_argmax.lookup(out.logits)
        assert greedy is not None and torch.equal(greedy, out.logits.argmax(-1))
    if commit:
        driver._commit(reqs, [1] * len(reqs), slots)
    else:
        driver.kv_pool.free(slots)
    parts = [out.logits, out.hidden_states]
    return parts if out.aux_hidden_states is None else [*parts, out.aux_hidden_states]


def _session(
    model: LlamaForCausalLM, capture: Sequence[int]
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Mixed prefills, decodes of three requests, a tree verify of two: every output
    (logits, hidden states, captured inputs), and the K/V caches at the end."""
    driver = PagedDriver(model, shuffle_seed=5)
    reqs = [driver.new_request() for _ in range(3)]
    driver.extend(reqs, [_tokens(n, seed=n) for n in (6, 13, 3)])
    out: list[torch.Tensor] = []
    for step in range(3):
        tokens = [[7 + step], [100], [255 - step]]
        out += _forward(driver, ForwardMode.DECODE, reqs, tokens, capture, commit=True)
    chains = [[3, 4, 5, 6], [9, 8, 7, 6]]
    out += _forward(driver, ForwardMode.VERIFY, reqs[:2], chains, capture, commit=False)
    return out, [*driver.kv_cache.k, *driver.kv_cache.v]


def _same(got: list[torch.Tensor], want: list[torch.Tensor]) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("capture", [(), (0, 2)])
def test_one_call_gives_the_bits_of_the_calls_one_by_one(
    dtype: torch.dtype,
    capture: tuple[int, ...],
    fused_runs: list[bool],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = random_model(CONFIG.replace(dtype=dtype), seed=11)
    use_cpu_matmul_layout(model)
    got, got_kv = _session(model, capture)
    assert fused_runs == [True] * 4  # three decodes and the verify, each one call
    assert len(got) == 4 * (3 if capture else 2)
    with monkeypatch.context() as patch:
        patch.setattr(FusedForward, "takes", staticmethod(lambda batch, layers: False))
        want, want_kv = _session(model, capture)
    assert len(fused_runs) == 4
    _same(got + got_kv, want + want_kv)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_loose_prefix_bound_gives_the_same_bits(
    dtype: torch.dtype, fused_runs: list[bool], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A recorded step (graphs="tape") passes the KV table's width as max_prefix_len; the
    one call sizes its attention by the batch's longest prefix, so the bits are those of
    the tight bound (and of the calls one by one)."""
    model = random_model(CONFIG.replace(dtype=dtype), seed=12)
    use_cpu_matmul_layout(model)
    tight, tight_kv = _session(model, (0, 2))
    real_build = ForwardBatch.build

    def loose(*args: object, **kwargs: object) -> ForwardBatch:
        batch = real_build(*args, **kwargs)  # type: ignore[arg-type]
        if batch.mode is ForwardMode.EXTEND:  # a prefill (the usual path) keeps its bound
            return batch
        width = batch.req_to_token.shape[1] - batch.max_extend_len
        return dataclasses.replace(batch, max_prefix_len=width)

    with monkeypatch.context() as patch:
        patch.setattr(ForwardBatch, "build", staticmethod(loose))
        got, got_kv = _session(model, (0, 2))
    assert all(fused_runs) and len(fused_runs) == 8
    _same(got + got_kv, tight + tight_kv)


@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0"])
def test_gguf_blocks_in_one_call(
    kind: str, tmp_path: Path, fused_runs: list[bool], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GGUF file's blocks (and its quantized head) read by the one call: the bits of the
    same model reading float32 panels one call at a time."""
    path = save_gguf(random_model(CONFIG, seed=3), tmp_path / "m.gguf", tensor_type=kind)
    blocks = load_gguf_model(open_gguf(path))
    use_cpu_matmul_layout(blocks)
    got, got_kv = _session(blocks, (1,))
    weights = blocks.scripted.native_weights() if blocks.scripted is not None else None
    assert weights is not None and weights.blocks
    assert blocks._native_head is not None and blocks._native_head.format != 0
    assert fused_runs == [True] * 4
    with monkeypatch.context() as patch:
        patch.setattr(FusedForward, "takes", staticmethod(lambda batch, layers: False))
        want, want_kv = _session(blocks, (1,))
    _same(got + got_kv, want + want_kv)


def test_bad_indices_raise_the_usual_errors_and_write_nothing(fused_runs: list[bool]) -> None:
    model = random_model(CONFIG, seed=2)
    use_cpu_matmul_layout(model)
    driver = PagedDriver(model, kv_size=64)
    req = driver.new_request()
    driver.extend([req], [_tokens(5, seed=1)])
    before = [c.clone() for c in (*driver.kv_cache.k, *driver.kv_cache.v)]
    table = driver.req_pool.req_to_token

    def decode(token: int, slot: int, position: int, row: int = req) -> ForwardBatch:
        return ForwardBatch.build(
            ForwardMode.DECODE,
            [[token]],
            [row],
            [5],
            torch.tensor([slot]),
            table,
            driver.kv_cache,
            positions=[[position]],
        )

    rows = driver.kv_cache.k[0].shape[0]
    cases = [
        (decode(CONFIG.vocab_size, 9, 5), "index out of range"),  # a token past the vocabulary
        (decode(-1, 9, 5), "index out of range"),
        (decode(3, 9, CONFIG.max_position), "out of range"),  # a position past the tables
        (decode(3, rows + 2, 5), "outside the cache"),  # a slot past the cache
    ]
    for batch, message in cases:
        with pytest.raises(IndexError, match=message):
            model(batch)
    assert fused_runs == [False] * len(cases)  # each handed back before any write
    after = [*driver.kv_cache.k, *driver.kv_cache.v]
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


def test_a_replaced_embedding_and_other_caches_are_followed(fused_runs: list[bool]) -> None:
    model, reference = random_model(CONFIG, seed=4), random_model(CONFIG, seed=4)
    use_cpu_matmul_layout(model)
    use_cpu_matmul_layout(reference, scripted=False)
    first, _ = _session(model, ())
    _close(first, _session(reference, ())[0])
    with torch.no_grad():
        for m in (model, reference):  # new storage: the one call must not read the old
            m.model.embed_tokens.weight.data = m.model.embed_tokens.weight.data * 1.5
    second, _ = _session(model, ())  # and a new driver: other K/V caches
    assert fused_runs == [True] * 8
    assert not torch.equal(first[0], second[0])
    _close(second, _session(reference, ())[0])


def _close(got: list[torch.Tensor], want: list[torch.Tensor]) -> None:
    """Within float32 rounding of the eager layers (which sum in other orders), with the
    same greedy tokens: ``got`` and ``want`` alternate logits and hidden states."""
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert_forwards_close(a, b, CONFIG)
    for a, b in zip(got[::2], want[::2], strict=True):
        assert torch.equal(a.argmax(-1), b.argmax(-1))


def test_a_used_model_deep_copies_and_decodes_alike(fused_runs: list[bool]) -> None:
    """The packs and the one call's struct hold raw pointers, which do not copy: a copy of
    a model that has decoded packs its own and gives the same bits."""
    model = random_model(CONFIG, seed=7)
    use_cpu_matmul_layout(model)
    first, _ = _session(model, (0,))
    twin = copy.deepcopy(model)
    again, _ = _session(twin, (0,))
    assert fused_runs == [True] * 8
    _same(again, first)
