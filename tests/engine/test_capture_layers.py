"""EAGLE-3's target features: ``forward(batch, capture=...)`` returns the inputs of the named
decoder layers, on every CPU decoder path, without changing the forward's own outputs.

A captured forward runs its layers in segments (one native or scripted call each): the
logits and last hidden states must be the same bits as the uncaptured forward's, and each
captured state the one an eager layer-by-layer loop computes at that point.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import relayc.engine.decoder.cpu_decoder as cpu_module
import relayc.engine.decoder.packing as packing_module
import relayc.engine.native.library as native_module
from relayc.engine.core.config import ModelConfig
from relayc.engine.core.forward_batch import ForwardBatch, ForwardMode
from relayc.engine.model.llama import LlamaForCausalLM, use_cpu_matmul_layout
from relayc.engine.model.weights import random_model
from tests.engine.helpers import PagedDriver, record_native_forwards
from tests.tolerance import assert_forwards_close

CONFIG = ModelConfig(num_layers=5)
CAPTURE = [4, 1, 2]  # any order in; layer order out


def _batch(driver: PagedDriver, model: LlamaForCausalLM, width: int) -> ForwardBatch:
    """Two requests with a cached prefix, then a ``width``-token extend (not committed)."""
    reqs = [driver.new_request() for _ in range(2)]
    driver.extend(reqs, [[5, 9, 11], [7, 1, 3, 200]])
    chunks = [[(17 * i + 3 * r) % 250 for i in range(width)] for r in range(2)]
    return ForwardBatch.build(
        ForwardMode.EXTEND,
        chunks,
        reqs,
        [driver.lens[r] for r in reqs],
        driver._alloc(2 * width),
        driver.req_pool.req_to_token,
        driver.kv_cache,
        return_all_logits=True,
    )


def _eager_layer_inputs(model: LlamaForCausalLM, batch: ForwardBatch) -> list[torch.Tensor]:
    """The input of every layer (and the last output), by the plain module loop."""
    from relayc.engine.core.attention import PagedAttend

    x = model.model.embed_tokens(batch.input_ids)
    rope = model.rotary.tables(batch.positions, x.dtype)
    attend = PagedAttend.build(batch)
    states = [x]
    for index, layer in enumerate(model.model.layers):
        x = layer(x, rope, model.rotary, index, attend)
        states.append(x)
    return states


@pytest.mark.parametrize("path", ["native", "scripted", "eager"])
@pytest.mark.parametrize("width", [1, 3, 70])  # 70 tokens: above the native decoder's limit
def test_captured_forward_keeps_its_outputs_and_returns_the_layer_inputs(
    path: str, width: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    native_runs: list[int] = []
    if path == "native":
        assert native_module.native_decoder() is not None, "the native decoder should build here"
        record_native_forwards(monkeypatch, lambda tokens, dtype: native_runs.append(1))
    else:
        monkeypatch.setattr(native_module, "native_decoder", lambda: None)
    model = random_model(CONFIG, seed=4)
    if path != "eager":
        use_cpu_matmul_layout(model)
    driver = PagedDriver(model, kv_size=512, req_slots=4, max_context=128, shuffle_seed=2)
    batch = _batch(driver, model, width)
    plain = model(batch)
    runs_before = len(native_runs)
    captured = model(batch, capture=CAPTURE)
    assert plain.aux_hidden_states is None
    assert torch.equal(captured.logits, plain.logits)
    assert torch.equal(captured.hidden_states, plain.hidden_states)
    with torch.no_grad():
        states = _eager_layer_inputs(model, batch)
    expected = torch.cat([states[i] for i in sorted(CAPTURE)], dim=-1)
    assert captured.aux_hidden_states is not None
    assert captured.aux_hidden_states.shape == (2 * width, 3 * CONFIG.hidden_size)
    if path == "eager":
        assert torch.equal(captured.aux_hidden_states, expected)
    else:
        # The native GEMMs sum in another order than MKL's: close to the eager bits.
        assert_forwards_close(captured.aux_hidden_states, expected, CONFIG)
    if path == "native" and 2 * width <= packing_module.NATIVE_MAX_TOKENS:
        # The whole stack in one native call that copies the captured inputs out.
        assert len(native_runs) - runs_before == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_native_call_captures_what_the_segments_do(
    dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The captured forward's one native call (layer.c copies each captured layer's input
    out) gives the bits of running the layers in native segments, the captured states
    included; a call that cannot capture natively falls back to the segments."""
    assert native_module.native_decoder() is not None, "the native decoder should build here"
    model = random_model(CONFIG.replace(dtype=dtype), seed=4)
    use_cpu_matmul_layout(model)
    driver = PagedDriver(model, kv_size=512, req_slots=4, max_context=128, shuffle_seed=2)
    batch = _batch(driver, model, 3)
    one = model(batch, capture=CAPTURE)
    calls: list[int] = []
    real = cpu_module.ScriptedLayers.__call__

    def segments_only(self: Any, *args: Any) -> torch.Tensor | None:
        calls.append(len(args))
        return None if len(args) > 4 and args[4] else real(self, *args)

    monkeypatch.setattr(cpu_module.ScriptedLayers, "__call__", segments_only)
    segmented = model(batch, capture=CAPTURE)
    assert len(calls) == 1 + 4  # the refused one-call capture, then four segments
    assert one.aux_hidden_states is not None and segmented.aux_hidden_states is not None
    assert one.aux_hidden_states.dtype == dtype
    assert torch.equal(one.aux_hidden_states, segmented.aux_hidden_states)
    assert torch.equal(one.logits, segmented.logits)
    assert torch.equal(one.hidden_states, segmented.hidden_states)


def test_capture_names_distinct_layers_of_the_model() -> None:
    model = random_model(CONFIG, seed=4)
    driver = PagedDriver(model, kv_size=256, req_slots=4, max_context=64)
    batch = _batch(driver, model, 2)
    for bad in ([1, 1, 2], [0, 5], [-1]):
        with pytest.raises(ValueError, match=r"`capture` names distinct decoder layers in 0\.\.4"):
            model(batch, capture=bad)


def test_bfloat16_captured_forward_keeps_the_bits_of_one_call() -> None:
    """The bfloat16 native layers round the residual stream to bfloat16 at every layer's end,
    so a forward run in segments (EAGLE-3's capture) gives the bits of the one-call forward
    every other algorithm runs -- without that, eagle3 in bfloat16 was not equal to `none`."""
    assert native_module.native_decoder() is not None, "the native decoder should build here"
    model = random_model(CONFIG.replace(dtype=torch.bfloat16), seed=4)
    use_cpu_matmul_layout(model)
    driver = PagedDriver(model, kv_size=512, req_slots=4, max_context=128, shuffle_seed=2)
    batch = _batch(driver, model, 3)
    plain = model(batch)
    captured = model(batch, capture=CAPTURE)
    assert torch.equal(captured.logits, plain.logits)
    assert torch.equal(captured.hidden_states, plain.hidden_states)
