"""EAGLE-3 head: draft extend over target features, tree drafting in the head's own vocabulary
against a brute-force beam search, the d2t map, and checkpoints in SGLang's EAGLE-3 layout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from relayc.engine.core.attention import dense_causal_attention
from relayc.engine.core.forward_batch import ForwardBatch, ForwardMode
from relayc.engine.draft.eagle3 import Eagle3Head, capture_layers
from relayc.engine.errors import CheckpointError
from relayc.engine.model.llama import LlamaForCausalLM
from relayc.engine.model.weights import random_model
from tests.engine.draft.helpers import MAX_CONTEXT, SMALL, NoHostSync, padded, padded_states
from tests.engine.draft.test_eagle import brute_force_tree
from tests.engine.helpers import PagedDriver
from tests.tolerance import forward_atol

PROMPTS = [[3, 5, 7, 9, 11], [1, 2, 30, 4, 8, 16, 32, 9, 2]]
DRAFT_VOCAB = 24  # of the target's 40


@pytest.fixture(scope="module")
def target() -> LlamaForCausalLM:
    return random_model(SMALL.replace(num_layers=4), seed=1)


@pytest.fixture(scope="module")
def head(target: LlamaForCausalLM) -> Eagle3Head:
    return Eagle3Head.random(target, seed=2, draft_vocab_size=DRAFT_VOCAB, layer_ids=[0, 1, 2])


class Prefilled:
    """The prompts in the target's cache, with their three-layer features and first tokens."""

    def __init__(self, target: LlamaForCausalLM, capture: tuple[int, ...]) -> None:
        self.driver = PagedDriver(target, kv_size=512, req_slots=4, max_context=MAX_CONTEXT)
        self.reqs = [self.driver.new_request() for _ in PROMPTS]
        self.features: list[torch.Tensor] = []
        self.next_tokens: list[int] = []
        for req, prompt in zip(self.reqs, PROMPTS, strict=True):
            slots = self.driver._alloc(len(prompt))
            batch = ForwardBatch.build(
                ForwardMode.EXTEND,
                [prompt],
                [req],
                [0],
                slots,
                self.driver.req_pool.req_to_token,
                self.driver.kv_cache,
                return_all_logits=True,
            )
            out = target(batch, capture=capture)
            self.driver._commit([req], [len(prompt)], slots)
            assert out.aux_hidden_states is not None
            self.features.append(out.aux_hidden_states)
            self.next_tokens.append(int(out.logits[-1].argmax()))
        self.ids = [[*p[1:], t] for p, t in zip(PROMPTS, self.next_tokens, strict=True)]
        self.req_to_token = self.driver.req_pool.req_to_token
        self.seq_lens = torch.tensor([len(p) for p in PROMPTS])


def extend(  # type: ignore[no-untyped-def]
    head: Eagle3Head, pre: Prefilled, topk: int, out_cache_loc: torch.Tensor | None = None
):
    kv = head.make_kv_cache(pre.driver.kv_cache.size)
    out = head.extend(
        padded(pre.ids),
        padded_states(pre.features),
        pre.seq_lens,
        torch.zeros(len(pre.ids), dtype=torch.int64),
        torch.tensor(pre.reqs),
        pre.req_to_token,
        kv,
        topk=topk,
        max_prefix_len=MAX_CONTEXT,
        out_cache_loc=out_cache_loc,
    )
    return kv, out


def draft(  # type: ignore[no-untyped-def]
    head: Eagle3Head,
    pre: Prefilled,
    kv,
    out,
    slots: torch.Tensor,
    num_steps: int,
    n: int,
    topk_index: torch.Tensor | None = None,
):
    """``head.draft_tree`` after :func:`extend`'s ``kv`` and ``out`` (``topk_index``: the
    relayed top-k to draft from instead of ``out``'s)."""
    return head.draft_tree(
        out.topk_p,
        out.topk_index if topk_index is None else topk_index,
        out.hidden_states,
        pre.seq_lens,
        torch.tensor(pre.reqs),
        pre.req_to_token,
        kv,
        slots,
        num_steps=num_steps,
        num_draft_tokens=n,
        max_prefix_len=MAX_CONTEXT,
    )


class DenseHead:
    """A cache-free run of the head over target-id prompts followed by draft-id paths, for
    ``brute_force_tree``: its hidden inputs are already projected (``fc(features)``, then g)."""

    def __init__(self, head: Eagle3Head, prompt_len: int) -> None:
        self.head, self.prompt_len = head, prompt_len

    def forward_dense(self, ids: torch.Tensor, hidden: torch.Tensor):  # type: ignore[no-untyped-def]
        head = self.head
        ids = torch.cat([ids[: self.prompt_len], head.to_target_ids(ids[self.prompt_len :])])

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return dense_causal_attention(q, k, v)

        positions = torch.arange(ids.numel())
        out = head.midlayer(head.target.embed_tokens(ids), hidden, positions, head.rotary, attend)
        return head.logits(out), out


def test_capture_layers_follow_sglang() -> None:
    assert capture_layers(32) == (2, 16, 29)
    assert capture_layers(6, [1, 3, 4]) == (2, 4, 5)
    assert capture_layers(6, [3, 1, 2]) == (2, 3, 4)  # layer order, as SGLang captures them
    with pytest.raises(ValueError, match=r"default .* gives \[2, 2, 1\].*eagle_aux_hidden"):
        capture_layers(4)
    with pytest.raises(ValueError, match=r"in 0\.\.3; .* gives \[1, 2, 4\]"):
        capture_layers(4, [0, 1, 3])


def test_extend_matches_the_cache_free_head(target: LlamaForCausalLM, head: Eagle3Head) -> None:
    pre = Prefilled(target, head.capture)
    _, out = extend(head, pre, topk=3)
    assert out.hidden_states.shape == (2, SMALL.hidden_size)
    assert int(out.topk_index.max()) < DRAFT_VOCAB  # draft ids
    for b, ids in enumerate(pre.ids):
        logits, g = head.forward_dense(torch.tensor(ids), pre.features[b])
        torch.testing.assert_close(g[-1], out.hidden_states[b])
        p, index = torch.softmax(logits[-1], -1).topk(3)
        torch.testing.assert_close(p, out.topk_p[b])
        assert torch.equal(index, out.topk_index[b])


@pytest.mark.parametrize(("topk", "num_steps", "n"), [(1, 4, 5), (2, 3, 6), (3, 2, 7)])
def test_tree_drafting_in_draft_ids_matches_brute_force(
    target: LlamaForCausalLM, head: Eagle3Head, topk: int, num_steps: int, n: int
) -> None:
    pre = Prefilled(target, head.capture)
    kv, out = extend(head, pre, topk)
    slots = pre.driver._alloc(2 * topk * (num_steps - 1)).view(2, -1)
    with NoHostSync():
        tree = draft(head, pre, kv, out, slots, num_steps, n)
    for b, ids in enumerate(pre.ids):
        dense = DenseHead(head, len(ids))
        states = head.fc(pre.features[b])
        parents, selected, tokens = brute_force_tree(dense, ids, states, topk, num_steps, n)  # type: ignore[arg-type]
        assert tree.parent_list[b].tolist() == parents
        assert tree.top_scores_index[b].tolist() == selected
        assert tree.draft_tokens[b].tolist() == tokens  # draft ids
    mapped = head.to_target_ids(tree.draft_tokens)
    assert bool(head.t2d[mapped].all()), "every mapped draft is a target id the head holds"
    hot = head.t2d.nonzero()[:, 0]
    assert torch.equal(mapped, hot[tree.draft_tokens])  # d2t: the i-th hot target id


def test_checkpoint_uses_sglang_layout_and_round_trips(
    target: LlamaForCausalLM, head: Eagle3Head, tmp_path: Path
) -> None:
    directory = head.save(tmp_path / "head")
    config = json.loads((directory / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["draft_vocab_size"] == DRAFT_VOCAB and config["num_hidden_layers"] == 1
    assert config["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": [0, 1, 2]}
    tensors = load_file(str(directory / "model.safetensors"))
    assert {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"} <= set(tensors)
    assert tensors["fc.weight"].shape == (SMALL.hidden_size, 3 * SMALL.hidden_size)
    assert tensors["midlayer.self_attn.q_proj.weight"].shape[1] == 2 * SMALL.hidden_size
    assert "midlayer.hidden_norm.weight" in tensors
    loaded = Eagle3Head.load(directory, target)
    assert loaded.capture == head.capture
    for name, value in head.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], value), name
    # A real head may carry its own embed_tokens (SGLang ignores it) and no t2d.
    tensors["embed_tokens.weight"] = torch.zeros(SMALL.vocab_size, SMALL.hidden_size)
    del tensors["t2d"]
    save_file(tensors, str(directory / "model.safetensors"))
    assert torch.equal(Eagle3Head.load(directory, target).t2d, head.t2d)


def _edit(directory: Path, **changes: object) -> None:
    path = directory / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


@pytest.mark.parametrize(
    ("config", "tensors", "message"),
    [
        ({"architectures": ["LlamaForCausalLM"]}, {}, r"not an EAGLE-3 head"),
        ({"norm_before_fc": True}, {}, r"does not implement `norm_before_fc: true`"),
        ({"eagle_config": {}}, {}, r"default \[2, L // 2, L - 3\].*gives \[2, 2, 1\]"),
        ({"draft_vocab_size": 30}, {}, r"`d2t` .* has shape \[24\], the config needs \[30\]"),
        ({}, {"drop": "d2t"}, r"lacks tensor `d2t`"),
        ({}, {"d2t": torch.full((DRAFT_VOCAB,), 100)}, r"maps draft id 0 to target id 100"),
        ({}, {"t2d": torch.ones(SMALL.vocab_size, dtype=torch.bool)}, r"`t2d` does not mark"),
    ],
)
def test_bad_checkpoints_say_what_is_wrong(
    target: LlamaForCausalLM,
    head: Eagle3Head,
    tmp_path: Path,
    config: dict[str, object],
    tensors: dict[str, object],
    message: str,
) -> None:
    directory = head.save(tmp_path / "head")
    _edit(directory, **config)
    if tensors:
        stored = load_file(str(directory / "model.safetensors"))
        for name, value in tensors.items():
            if name == "drop":
                del stored[str(value)]
            else:
                stored[name] = value  # type: ignore[assignment]
        save_file(stored, str(directory / "model.safetensors"))
    with pytest.raises(CheckpointError, match=message):
        Eagle3Head.load(directory, target)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_native_draft_logits_match_the_modules(dtype: torch.dtype) -> None:
    """On the CPU the head's norm + LM head (most of its weights) run on the native
    decoder's head; the modules give the same logits up to the kernels' summation order."""
    from relayc.engine.core.config import ModelConfig
    from relayc.engine.model.llama import use_cpu_matmul_layout
    from relayc.engine.native import library as native

    if native.native_decoder() is None:
        pytest.skip("no C compiler: the native decoder is not built (the modules run)")
    target = random_model(ModelConfig(dtype=dtype), seed=2)
    head = Eagle3Head.random(target, seed=4, draft_vocab_size=200, layer_ids=[0, 1, 2])
    use_cpu_matmul_layout(head)
    g = torch.randn(5, target.config.hidden_size).to(dtype)
    with torch.no_grad():
        got = head.logits(g)
        assert head._native_head is not None  # it ran natively
        expected = head.lm_head(head.norm(g)).float()
        alone = head.logits(g[:1])
    tolerance = 1e-4 if dtype == torch.float32 else 0.05 * expected.abs().max().item()
    assert got.shape == (5, 200) and (got - expected).abs().max().item() < tolerance
    assert torch.equal(alone, got[:1])  # rows do not depend on the batch


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_native_draft_layer_matches_the_modules(
    dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the CPU the head's layer runs as one native call (layer.c's relayc_decoder_ex:
    q/k/v read [norm(embed); hidden_norm(hidden)], the hidden input the residual) -- in
    float32 the whole draft extend does (relayc_draft_extend) -- and draft extend gives
    what the modules give, up to the kernels' summation order."""
    from relayc.engine.decoder.draft_layer import NativeDraftLayer
    from relayc.engine.draft.native_draft import NativeDraft
    from relayc.engine.native import library as native

    if native.native_decoder() is None:
        pytest.skip("no C compiler: the native decoder is not built (the modules run)")
    target = random_model(SMALL.replace(num_layers=4, dtype=dtype), seed=1)
    head = Eagle3Head.random(target, seed=2, draft_vocab_size=DRAFT_VOCAB, layer_ids=[0, 1, 2])
    pre = Prefilled(target, head.capture)
    calls: list[bool] = []
    real = NativeDraftLayer.__call__

    def counted(self: NativeDraftLayer, *args: object) -> torch.Tensor | None:
        out = real(self, *args)  # type: ignore[arg-type]
        calls.append(out is not None)
        return out

    monkeypatch.setattr(NativeDraftLayer, "__call__", counted)
    real_extend = NativeDraft.extend  # in float32, the whole extend runs as one native call

    def whole(self: NativeDraft, *args: object) -> object:
        out = real_extend(self, *args)  # type: ignore[arg-type]
        if out is not None:
            calls.append(True)
        return out

    monkeypatch.setattr(NativeDraft, "extend", whole)
    kv_native, got = extend(head, pre, topk=3)
    assert calls == [True]  # it ran natively
    monkeypatch.setattr(native, "native_decoder", lambda: None)
    kv_eager, expected = extend(head, pre, topk=3)
    assert calls == [True, False]
    # float32: the head's one layer within its summation order's rounding bound
    atol = forward_atol(head.config, expected.hidden_states)
    tol = {"atol": atol, "rtol": 0.0} if dtype == torch.float32 else {"atol": 0.05, "rtol": 0.05}
    torch.testing.assert_close(got.hidden_states.float(), expected.hidden_states.float(), **tol)
    torch.testing.assert_close(got.topk_p, expected.topk_p, **tol)
    torch.testing.assert_close(kv_native.k[0].float(), kv_eager.k[0].float(), **tol)
    if dtype == torch.float32:
        assert torch.equal(got.topk_index, expected.topk_index)


def test_native_draft_layer_follows_changed_weights() -> None:
    """A parameter changed in place (a training step) repacks the native weights."""
    from relayc.engine.native import library as native

    if native.native_decoder() is None:
        pytest.skip("no C compiler: the native decoder is not built (the modules run)")
    target = random_model(SMALL.replace(num_layers=4), seed=1)
    head = Eagle3Head.random(target, seed=2, draft_vocab_size=DRAFT_VOCAB, layer_ids=[0, 1, 2])
    pre = Prefilled(target, head.capture)
    _, before = extend(head, pre, topk=3)
    with torch.no_grad():
        head.midlayer.mlp.down_proj.weight.mul_(0.5)
    _, after = extend(head, pre, topk=3)
    for b, ids in enumerate(pre.ids):
        _, g = head.forward_dense(torch.tensor(ids), pre.features[b])
        torch.testing.assert_close(g[-1], after.hidden_states[b])
    assert not torch.allclose(before.hidden_states, after.hidden_states)


def test_the_native_attention_input_is_the_two_norms(
    head: Eagle3Head, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`[input_layernorm(embeds); hidden_norm(hidden)]` in one native call (relayc_norm_pair)
    where the layer runs natively: the modules' values, each row on its own."""
    from relayc.engine.native import library as native

    lib = native.native_decoder()
    assert lib is not None
    layer = head.midlayer
    monkeypatch.setattr(type(layer.native), "_runnable", lambda self, hidden, attend: (lib,))
    g = torch.Generator().manual_seed(4)
    width = layer.input_layernorm.weight.shape[0]
    with torch.no_grad():
        for norm in (layer.input_layernorm, layer.hidden_norm):
            norm.weight.copy_(torch.rand(width, generator=g) + 0.5)
    embeds, hidden = (torch.randn(5, width, generator=g) * 3 for _ in range(2))
    got = layer.native.attn_in(embeds, hidden, None)
    assert got is not None and got.shape == (5, 2 * width)
    want = torch.cat([layer.input_layernorm(embeds), layer.hidden_norm(hidden)], dim=-1)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    rows = torch.cat(
        [layer.native.attn_in(embeds[i : i + 1], hidden[i : i + 1], None) for i in range(5)]
    )
    assert torch.equal(rows, got)
    # bfloat16 inputs and weights: the float32 norms of their values (exact widenings), which
    # the modules round to bfloat16 twice (the normalised row, then times the weight)
    bf16 = {n: n.weight.detach().clone() for n in (layer.input_layernorm, layer.hidden_norm)}
    with torch.no_grad():
        for norm in bf16:
            norm.weight.data = norm.weight.data.to(torch.bfloat16)
        half = layer.native.attn_in(embeds.bfloat16(), hidden.bfloat16(), None)
        exact = torch.cat(
            [
                n.weight.float() * F.rms_norm(x.bfloat16().float(), (width,), eps=n.eps)
                for n, x in ((layer.input_layernorm, embeds), (layer.hidden_norm, hidden))
            ],
            dim=-1,
        )
        modules = torch.cat(
            [layer.input_layernorm(embeds.bfloat16()), layer.hidden_norm(hidden.bfloat16())], dim=-1
        )
        for norm, weight in bf16.items():
            norm.weight.data = weight
    assert half is not None and half.dtype == torch.float32
    torch.testing.assert_close(half, exact, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(half, modules.float(), atol=0.0, rtol=2**-7)
    assert layer.native.attn_in(embeds.double(), hidden.double(), None) is None  # no such dtype
    monkeypatch.undo()
    assert layer.native.attn_in(embeds, hidden, None) is None  # not a native call: the modules
