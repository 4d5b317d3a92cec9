"""The native decoder with bfloat16 weights against the eager bfloat16 layers.

The native bfloat16 path rounds each GEMM's input activations to bfloat16 (as torch's bf16
matmul does) and sums the exact products in float32, but keeps the residual stream, norms,
rotary and attention in float32; the K/V cache is bfloat16 (shared with the eager layers).
So it should sit at least as near the float32 computation as the eager bfloat16 path
(which rounds every activation), and keep the float32 path's contract: a token's logits do
not depend on the batch it is computed in. Its GEMM kernels one by one:
tests/engine/test_cpu_decoder_bf16_kernels.py.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import relayc.engine.decoder.head as head_module
import relayc.engine.native.library as native_module
from relayc.engine import Engine, SamplingParams
from relayc.engine.core.config import ModelConfig
from relayc.engine.core.forward_batch import ForwardBatch, ForwardMode
from relayc.engine.model.llama import LlamaForCausalLM, use_cpu_matmul_layout
from relayc.engine.model.weights import random_model
from tests.engine.helpers import PagedDriver, record_native_forwards
from tests.engine.test_cpu_decoder import _session, _tokens
from tests.tolerance import assert_same_argmax_where_decided, gemm_atol

BF16 = ModelConfig(dtype=torch.bfloat16)  # hidden 128, q/k/v 256, gate/up 704: whole panels


@pytest.fixture
def native_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, torch.dtype]]:
    """(tokens, dtype) of every forward the native decoder ran."""
    assert native_module.native_decoder() is not None, "the native decoder should build here"
    calls: list[tuple[int, torch.dtype]] = []
    record_native_forwards(monkeypatch, lambda tokens, dtype: calls.append((tokens, dtype)))
    return calls


def _float32_twin(model: LlamaForCausalLM, seed: int) -> LlamaForCausalLM:
    """The same (bfloat16-rounded) weights in float32: the computation both bfloat16 paths
    approximate."""
    twin = random_model(seed=seed, config=model.config.replace(dtype=torch.float32))
    with torch.no_grad():
        for mine, theirs in zip(twin.parameters(), model.parameters(), strict=True):
            mine.copy_(theirs.float())
    use_cpu_matmul_layout(twin, scripted=False)
    return twin


def test_bf16_native_is_as_near_float32_as_eager_bf16(
    native_calls: list[tuple[int, torch.dtype]],
) -> None:
    native = random_model(BF16, seed=21)
    eager = random_model(BF16, seed=21)
    use_cpu_matmul_layout(native)
    use_cpu_matmul_layout(eager, scripted=False)
    reference = _session(_float32_twin(native, seed=21))
    got, expected = _session(native), _session(eager)
    # the mixed prefill is not uniform: eager; the chunk, decodes and verify run natively
    # (and read the K/V the eager prefill wrote to the shared bfloat16 cache)
    assert native_calls == [(n, torch.bfloat16) for n in (8, 3, 3, 3, 8)], native_calls
    scale = max(r.abs().max().item() for r in reference)
    native_total = eager_total = 0.0
    for step, (a, b, r) in enumerate(zip(got, expected, reference, strict=True)):
        assert a.dtype == b.dtype == torch.float32
        native_error = (a - r).abs().max().item()
        eager_error = (b - r).abs().max().item()
        assert native_error < 0.05 * scale, (step, native_error, scale)
        assert (a - b).abs().max().item() < 0.1 * scale, step
        if step > 0:  # step 0's layers ran eagerly in both; only its LM head differs
            native_total += native_error
            eager_total += eager_error
        assert torch.equal(a.argmax(-1), b.argmax(-1)), step
        assert_same_argmax_where_decided(a, r)
    # Over the steps, not at each: since the native GEMMs round their inputs to bfloat16
    # as the eager ones do, both make the same products, and the native path's float32
    # norms, residual and attention only make it nearer on the whole (seed 21: 0.127 vs
    # 0.177 of the scale summed over five steps; one step 0.025 vs 0.020).
    assert native_total < eager_total, (native_total, eager_total)


def test_bf16_rows_do_not_depend_on_the_batch(
    native_calls: list[tuple[int, torch.dtype]],
) -> None:
    """One-token decodes, the same tokens beside other requests, and an 8-row verify of
    the chain give the same bits per token."""
    model = random_model(BF16, seed=5)
    use_cpu_matmul_layout(model)
    prompt, chain = _tokens(9, seed=3), [17, 250, 3, 99, 4, 4, 180, 61]
    alone = PagedDriver(model)
    req = alone.new_request()
    alone.extend([req], [prompt])
    decoded = torch.cat([alone.decode([req], [t]) for t in chain])
    crowd = PagedDriver(model)
    reqs = [crowd.new_request() for _ in range(2)]
    crowd.extend(reqs[:1], [prompt])
    crowd.extend(reqs[1:], [_tokens(12, seed=9)])
    beside = torch.cat([crowd.decode(reqs, [t, 1])[:1] for t in chain])
    verify = PagedDriver(model)
    vreq = verify.new_request()
    verify.extend([vreq], [prompt])
    causal = torch.ones(1, len(chain), len(chain), dtype=torch.bool).tril()
    verified = verify.verify([vreq], [chain], [list(range(len(chain)))], causal)
    assert [n for n, _ in native_calls] == [9, *[1] * 8, 9, 12, *[2] * 8, 9, 8]
    assert torch.equal(decoded, beside)
    assert torch.equal(decoded, verified)


@pytest.mark.parametrize("requests", [12])  # 12 x 8 = 96 rows: above the prefill limit
def test_bf16_large_verify_rows_do_not_depend_on_the_batch(
    requests: int, native_calls: list[tuple[int, torch.dtype]]
) -> None:
    """A verify of more rows than a prefill runs natively (``native_max_tokens(bf16,
    decode=True)``) still runs natively: each request's rows are the bits it gets verified
    alone. The library GEMM's rows depend on the rows beside them, which in bfloat16 made
    ``eagle3`` differ from ``none`` on 11 of 24 chat prompts verified together."""
    model = random_model(BF16, seed=5)
    use_cpu_matmul_layout(model)
    chains = [[(7 * r + 13 * i) % 250 + 1 for i in range(8)] for r in range(requests)]
    causal = torch.ones(requests, 8, 8, dtype=torch.bool).tril()
    depths = [list(range(8))] * requests
    crowd = PagedDriver(model, kv_size=4096, req_slots=requests + 1)
    reqs = [crowd.new_request() for _ in range(requests)]
    for r, req in enumerate(reqs):  # one prefill each: the prompts' K/V as alone
        crowd.extend([req], [_tokens(5 + r, seed=r)])
    together = crowd.verify(reqs, chains, depths, causal)
    assert (8 * requests, torch.bfloat16) in native_calls
    for r in range(requests):
        alone = PagedDriver(model, kv_size=4096, req_slots=2)
        req = alone.new_request()
        alone.extend([req], [_tokens(5 + r, seed=r)])
        rows = alone.verify([req], chains[r : r + 1], depths[:1], causal[:1])
        assert torch.equal(rows, together[8 * r : 8 * (r + 1)]), r


def test_bf16_greedy_ngram_equals_none(native_calls: list[tuple[int, torch.dtype]]) -> None:
    """Speculative greedy decoding on a bfloat16 model gives plain greedy decoding's tokens:
    its verifies run natively, row for row the bits of a decode."""
    prompts = [[5, 6, 7, 8] * 4 + _tokens(3, seed=1), _tokens(7, seed=2) * 2]
    params = SamplingParams(max_new_tokens=16)
    outs = {}
    for name in ("ngram", "none"):
        engine = Engine("random", algorithm=name, dtype=torch.bfloat16, overlap=False)
        assert engine.model.config.dtype == torch.bfloat16
        outs[name] = [o.token_ids for o in engine.generate(prompts, params)]
        engine.close()
        if name == "ngram":
            assert any(n > len(prompts) for n, _ in native_calls), native_calls  # verifies
            assert {dtype for _, dtype in native_calls} == {torch.bfloat16}
    assert outs["ngram"] == outs["none"]
    assert all(len(tokens) > 0 for tokens in outs["none"])


def test_bf16_odd_width_falls_back_to_eager_layers_and_a_native_head(
    native_calls: list[tuple[int, torch.dtype]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """hidden 41 is no whole number of 16-column panels: the layers run eagerly (bfloat16
    has no TorchScript path); the LM head, whose output is padded and whose reduction may
    be odd (padded with zeros to 64), still runs natively and matches the float32 product
    of its (widened) weights and its bfloat16-rounded input (the native GEMMs round their
    activations as torch's bfloat16 matmul does)."""
    heads: list[int] = []
    real = head_module.NativeHead.logits

    def logits(self: Any, lib: Any, hidden: torch.Tensor) -> torch.Tensor:
        heads.append(hidden.shape[0])
        return real(self, lib, hidden)

    monkeypatch.setattr(head_module.NativeHead, "logits", logits)
    config = ModelConfig(hidden_size=41, intermediate_size=96, head_dim=10, dtype=torch.bfloat16)
    model = random_model(config, seed=3)
    eager = random_model(config, seed=3)
    use_cpu_matmul_layout(model)
    use_cpu_matmul_layout(eager, scripted=False)
    got, expected = _session(model), _session(eager)
    assert model.scripted is not None and model.scripted._native is None
    assert native_calls == []
    assert heads and model._native_head is not None
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, atol=0.05 * b.abs().max().item(), rtol=0)
    hidden = torch.randn(5, 41, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    with torch.no_grad():
        native_logits = model._logits(hidden)
        x = hidden.float()
        normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + model.model.norm.eps)
        normed = normed * model.model.norm.weight.float()
        want = normed.to(torch.bfloat16).float() @ model.lm_head.weight.float().t()
    atol = gemm_atol(hidden.shape[-1], want)  # float32 sums of the same bfloat16 inputs
    torch.testing.assert_close(native_logits, want, atol=atol, rtol=0)


def test_bf16_slot_outside_the_cache_is_an_error_not_a_stray_write(
    native_calls: list[tuple[int, torch.dtype]],
) -> None:
    model = random_model(BF16, seed=2)
    use_cpu_matmul_layout(model)
    driver = PagedDriver(model, kv_size=64)
    req = driver.new_request()
    driver.extend([req], [_tokens(5, seed=1)])
    before = driver.kv_cache.buffer.clone()
    rows = driver.kv_cache.k[0].shape[0]
    batch = ForwardBatch.build(
        ForwardMode.DECODE,
        [[9]],
        [req],
        [5],
        torch.tensor([rows + 3]),
        driver.req_pool.req_to_token,
        driver.kv_cache,
    )
    with pytest.raises(IndexError, match="outside the cache"):
        model(batch)
    assert torch.equal(before, driver.kv_cache.buffer)
    assert [n for n, _ in native_calls] == [5, 1]
