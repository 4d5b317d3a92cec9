"""The CPU decoder paths against the eager layers.

Three paths run a paged forward's decoder layers on the CPU: the native decoder
(native/csrc/, small uniform batches), the TorchScript layers (relayc.engine.native.scripted: the
eager ops, same bits) and the eager layers themselves.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch

import relayc.engine.decoder.head as head_module
import relayc.engine.native.library as native_module
import relayc.engine.native.scripted as scripted_module
from relayc.engine import Engine, SamplingParams
from relayc.engine.core.forward_batch import ForwardBatch, ForwardMode
from relayc.engine.decoder.cpu_decoder import ScriptedLayers
from relayc.engine.model.llama import LlamaForCausalLM, use_cpu_matmul_layout
from relayc.engine.model.weights import random_model
from tests.engine.helpers import PagedDriver
from tests.tolerance import assert_forwards_close


def _tokens(n: int, seed: int) -> list[int]:
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _session(model: LlamaForCausalLM) -> list[torch.Tensor]:
    """Mixed-length prefill (the gathered path), chunked prefill, decode, tree verify."""
    driver = PagedDriver(model, shuffle_seed=7)
    reqs = [driver.new_request() for _ in range(3)]
    out = [driver.extend(reqs, [_tokens(n, seed=n) for n in (5, 11, 2)])]
    out.append(driver.extend(reqs[:2], [_tokens(4, seed=1), _tokens(4, seed=2)]))
    for step in range(3):
        out.append(driver.decode(reqs, [7 + step, 100, 255]))
    mask = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool)
    out.append(
        driver.verify(
            reqs[:2],
            [[3, 4, 5, 6], [9, 8, 7, 6]],
            [[0, 1, 1, 2]] * 2,
            mask[None].expand(2, -1, -1).contiguous(),
        )
    )
    return out


@pytest.fixture
def no_native(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native_module, "native_decoder", lambda: None)


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many forwards ran through the scripted function."""
    calls: list[int] = []
    real = scripted_module.scripted_layers()
    assert real is not None, "TorchScript should take the decoder on this torch"

    def counting() -> Callable[..., torch.Tensor]:
        def run(*args: Any, **kwargs: Any) -> torch.Tensor:
            calls.append(1)
            return real(*args, **kwargs)

        return run

    monkeypatch.setattr(scripted_module, "scripted_layers", counting)
    return calls


def test_scripted_forward_is_bit_identical_to_eager(counted: list[int], no_native: None) -> None:
    scripted = random_model(seed=21)
    eager = random_model(seed=21)
    use_cpu_matmul_layout(scripted)
    use_cpu_matmul_layout(eager, scripted=False)
    assert scripted.scripted is not None and eager.scripted is None
    got, expected = _session(scripted), _session(eager)
    assert len(counted) == len(got)  # every forward took the scripted path
    for a, b in zip(got, expected, strict=True):
        assert torch.equal(a, b)


def test_autograd_and_dense_forwards_stay_eager(counted: list[int]) -> None:
    model = random_model(seed=4)
    use_cpu_matmul_layout(model)
    ids = torch.tensor([256, 1, 2, 3])
    model.forward_dense(ids)  # no paged attention to script
    model.forward_train(ids[None])  # autograd on
    assert counted == []


def test_replaced_weights_are_never_stale(counted: list[int], no_native: None) -> None:
    """A parameter replaced after the layout (new ``.data``, or an assigned Parameter) is
    what the next forward uses: the scripted weights are rebuilt, or the forward runs
    eagerly while a fused weight is stale."""
    model = random_model(seed=8)
    reference = random_model(seed=8)
    use_cpu_matmul_layout(model)
    use_cpu_matmul_layout(reference, scripted=False)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        o_proj = model.model.layers[1].self_attn.o_proj
        new_o = torch.randn(o_proj.weight.shape, generator=gen)
        o_proj.weight.data = new_o.clone()  # not fused: the scripted weights are rebuilt
        reference.model.layers[1].self_attn.o_proj.weight.copy_(new_o)
        norm = model.model.layers[0].post_attention_layernorm
        new_norm = torch.randn(norm.weight.shape, generator=gen)
        norm.weight = torch.nn.Parameter(new_norm.clone())
        reference.model.layers[0].post_attention_layernorm.weight.copy_(new_norm)
    # (close, not equal: the new o_proj weight is row-major, the reference's column-major)
    for a, b in zip(_session(model), _session(reference), strict=True):
        assert_forwards_close(a, b, model.config)
    assert counted  # still scripted
    counted.clear()
    with torch.no_grad():
        k_proj = model.model.layers[0].self_attn.k_proj
        new_k = torch.randn(k_proj.weight.shape, generator=gen)
        k_proj.weight.data = new_k.clone()  # the fused q/k/v copy is stale now
        reference.model.layers[0].self_attn.k_proj.weight.copy_(new_k)
    for a, b in zip(_session(model), _session(reference), strict=True):
        assert_forwards_close(a, b, model.config)  # eager, unfused for k
    assert counted == []
    use_cpu_matmul_layout(model)  # fuse again: scripted again
    _session(model)
    assert counted


def test_a_torch_that_cannot_script_runs_eagerly_with_one_warning(
    monkeypatch: pytest.MonkeyPatch, no_native: None
) -> None:
    def refuse(fn: object) -> object:
        raise RuntimeError("no TorchScript here")

    monkeypatch.setattr(scripted_module, "_compiled", None)
    monkeypatch.setattr(scripted_module, "_failed", False)
    monkeypatch.setattr(torch.jit, "script", refuse)
    model = random_model(seed=21)
    reference = random_model(seed=21)
    use_cpu_matmul_layout(model)
    use_cpu_matmul_layout(reference, scripted=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = _session(model)
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == 1 and "no TorchScript here" in messages[0], messages
    for a, b in zip(got, _session(reference), strict=True):
        assert torch.equal(a, b)


def test_the_native_decoder_does_not_need_torchscript(
    monkeypatch: pytest.MonkeyPatch, native_calls: list[int]
) -> None:
    monkeypatch.setattr(scripted_module, "scripted_layers", lambda: None)
    model = random_model(seed=21)
    reference = random_model(seed=21)
    use_cpu_matmul_layout(model)
    use_cpu_matmul_layout(reference, scripted=False)
    for a, b in zip(_session(model), _session(reference), strict=True):
        assert_forwards_close(a, b, model.config)
    assert native_calls == [8, 3, 3, 3, 8]  # the mixed prefill ran eagerly


def test_shapes_the_native_layers_cannot_take_fall_back_per_part() -> None:
    """A width that is no whole number of 16-column panels (hidden 40) keeps the layers on
    TorchScript; the LM head, whose output is padded, still runs natively."""
    from relayc.engine.core.config import ModelConfig

    config = ModelConfig(hidden_size=40, intermediate_size=96, head_dim=10)
    model = random_model(config, seed=3)
    reference = random_model(config, seed=3)
    use_cpu_matmul_layout(model)
    use_cpu_matmul_layout(reference, scripted=False)
    assert model.scripted is not None and model.scripted.args() is not None
    assert model.scripted._native is None
    for a, b in zip(_session(model), _session(reference), strict=True):
        assert_forwards_close(a, b, model.config)
    assert model._native_head is not None


def test_native_decoder_matches_the_eager_layers(native_calls: list[int]) -> None:
    native = random_model(seed=21)
    eager = random_model(seed=21)
    use_cpu_matmul_layout(native)
    use_cpu_matmul_layout(eager, scripted=False)
    got, expected = _session(native), _session(eager)
    # prefill of mixed lengths is not uniform: TorchScript; the rest runs natively
    assert native_calls == [8, 3, 3, 3, 8], native_calls  # chunk of 2 x 4, decodes, verify
    for a, b in zip(got, expected, strict=True):
        assert_forwards_close(a, b, eager.config)
        assert torch.equal(a.argmax(-1), b.argmax(-1))


def test_native_rows_do_not_depend_on_the_batch(native_calls: list[int]) -> None:
    """A token's logits are the same bits whether it is decoded alone, beside other
    requests, or verified inside a chain: the native GEMMs sum every output in one order
    and attend every row on its own. (MKL's GEMMs differ by row count.)"""
    model = random_model(seed=5)
    use_cpu_matmul_layout(model)
    prompt, chain = _tokens(9, seed=3), [17, 250, 3, 99]
    alone = PagedDriver(model)
    req = alone.new_request()
    alone.extend([req], [prompt])
    decoded = torch.cat([alone.decode([req], [t]) for t in chain])
    crowd = PagedDriver(model)
    reqs = [crowd.new_request() for _ in range(3)]
    crowd.extend(reqs[:1], [prompt])  # the same prefill call as above: the same bits
    crowd.extend(reqs[1:], [_tokens(5, seed=8), _tokens(12, seed=9)])
    beside = torch.cat([crowd.decode(reqs, [t, 1, 2])[:1] for t in chain])
    verify = PagedDriver(model)
    vreq = verify.new_request()
    verify.extend([vreq], [prompt])
    causal = torch.ones(1, len(chain), len(chain), dtype=torch.bool).tril()
    verified = verify.verify([vreq], [chain], [list(range(len(chain)))], causal)
    assert native_calls == [9, 1, 1, 1, 1, 9, 3, 3, 3, 3, 9, 4]  # the mixed prefill: TorchScript
    assert torch.equal(decoded, beside)
    assert torch.equal(decoded, verified)


def test_forwards_over_two_caches_in_turn_use_their_own(native_calls: list[int]) -> None:
    """The native call keeps the last caches' pointers: a forward over other caches (an
    engine sharing the model), then over the first ones again, reads and writes each."""
    model = random_model(seed=5)
    use_cpu_matmul_layout(model)
    prompts, follow = [_tokens(9, seed=3), _tokens(6, seed=4)], [17, 250, 3]
    alone = []
    for prompt in prompts:
        driver = PagedDriver(model)
        req = driver.new_request()
        driver.extend([req], [prompt])
        alone.append(torch.cat([driver.decode([req], [t]) for t in follow]))
    drivers = [PagedDriver(model), PagedDriver(model, kv_size=512, shuffle_seed=1)]
    reqs = [d.new_request() for d in drivers]
    for driver, req, prompt in zip(drivers, reqs, prompts, strict=True):
        driver.extend([req], [prompt])
    turns: list[list[torch.Tensor]] = [[], []]
    for t in follow:
        for i, (driver, req) in enumerate(zip(drivers, reqs, strict=True)):
            turns[i].append(driver.decode([req], [t]))
    assert len(native_calls) == 2 * (1 + len(follow)) * 2
    for got, want in zip(turns, alone, strict=True):
        assert torch.equal(torch.cat(got), want)


def test_native_weights_follow_in_place_updates(native_calls: list[int]) -> None:
    """The native decoder reads a packed copy of the weights: an in-place update of a
    parameter (its version counter moves) repacks before the next forward."""
    model = random_model(seed=8)
    reference = random_model(seed=8)
    use_cpu_matmul_layout(model)
    use_cpu_matmul_layout(reference, scripted=False)
    _session(model)
    with torch.no_grad():
        model.model.layers[2].mlp.down_proj.weight.mul_(0.5)
        reference.model.layers[2].mlp.down_proj.weight.mul_(0.5)
        model.model.layers[0].self_attn.v_proj.weight.add_(0.1)  # a view of the fused q/k/v
        reference.model.layers[0].self_attn.v_proj.weight.add_(0.1)
        model.lm_head.weight.mul_(2.0)  # the native LM head reads a packed copy
        reference.lm_head.weight.mul_(2.0)
    for a, b in zip(_session(model), _session(reference), strict=True):
        assert_forwards_close(a, b, model.config)
    # A write through .data moves no version counter: laying the model out again repacks.
    with torch.no_grad():
        model.model.layers[1].mlp.down_proj.weight.data.mul_(3.0)
        reference.model.layers[1].mlp.down_proj.weight.mul_(3.0)
        model.lm_head.weight.data.mul_(0.5)
        reference.lm_head.weight.mul_(0.5)
    use_cpu_matmul_layout(model)
    for a, b in zip(_session(model), _session(reference), strict=True):
        assert_forwards_close(a, b, model.config)


def test_a_slot_outside_the_cache_is_an_error_not_a_stray_write(
    native_calls: list[int],
) -> None:
    """The native decoder checks every slot it writes or reads before touching memory."""
    model = random_model(seed=2)
    use_cpu_matmul_layout(model)
    driver = PagedDriver(model, kv_size=64)
    req = driver.new_request()
    driver.extend([req], [_tokens(5, seed=1)])
    before = [c.clone() for c in driver.kv_cache.k]
    rows = driver.kv_cache.k[0].shape[0]
    for slots, prefix in (([rows + 3], 5), ([-1], 5), ([7], 5)):
        req_to_token = driver.req_pool.req_to_token.clone()
        if slots == [7]:
            req_to_token[req, 2] = rows  # a prefix slot past the cache
        batch = ForwardBatch.build(
            ForwardMode.DECODE,
            [[9]],
            [req],
            [prefix],
            torch.tensor(slots),
            req_to_token,
            driver.kv_cache,
        )
        with pytest.raises(IndexError, match="outside the cache"):
            model(batch)
    assert all(torch.equal(a, b) for a, b in zip(before, driver.kv_cache.k, strict=True))
    assert len(native_calls) == 4


def test_without_a_compiler_the_scripted_layers_run_with_one_warning(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any, counted: list[int]
) -> None:
    monkeypatch.setattr(native_module, "_lib", None)
    monkeypatch.setattr(native_module, "_tried", False)
    monkeypatch.setenv("RELAYC_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", "no-such-compiler")
    monkeypatch.setattr(native_module.shutil, "which", lambda name: None)
    model = random_model(seed=21)
    use_cpu_matmul_layout(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = _session(model)
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == 1 and "no C compiler" in messages[0], messages
    assert len(counted) == len(got)
    assert not list(tmp_path.iterdir())


def test_the_native_library_is_cached_by_source_and_flags(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any, seeded_cache: Any
) -> None:
    """A cache holding the build of this source and these flags hands it back unbuilt;
    other flags build another file beside it."""
    monkeypatch.setenv("RELAYC_CACHE_DIR", str(tmp_path))
    compiler = native_module._compiler()
    assert compiler is not None
    stamp = seeded_cache.stat().st_mtime_ns
    first = native_module._build(compiler)
    assert first == seeded_cache and first.stat().st_mtime_ns == stamp
    assert native_module._build(compiler) == first and first.stat().st_mtime_ns == stamp
    monkeypatch.setattr(native_module, "FLAGS", [*native_module.FLAGS, "-DRELAYC_TEST"])
    other = native_module._build(compiler)  # other flags: another file, built here
    assert other != first and other.parent == tmp_path and other.stat().st_size > 0
    assert first.stat().st_mtime_ns == stamp
    monkeypatch.setenv("RELAYC_NATIVE", "0")
    monkeypatch.setattr(native_module, "_lib", None)
    monkeypatch.setattr(native_module, "_tried", False)
    assert native_module.native_decoder() is None


@pytest.mark.parametrize("algorithm", ["eagle", "standalone"])
def test_drafting_engines_run_their_drafts_natively_and_stay_lossless(
    algorithm: str, native_calls: list[int]
) -> None:
    """The draft model's stack and the EAGLE head's single layer take the native path as
    well, and the speculative outputs still equal plain greedy decoding's."""
    prompts = [_tokens(n, seed=30 + n) for n in (6, 13, 9)]
    params = SamplingParams(max_new_tokens=12)
    outs = {}
    for name in (algorithm, "none"):
        # eager steps: each forward counted (a replay calls the functions it recorded)
        engine = Engine("random", algorithm=name, overlap=False, graphs="off")
        outs[name] = [o.token_ids for o in engine.generate(prompts, params)]
        engine.close()
        if name == algorithm:
            assert len(native_calls) > 3 * 12 // 2  # target verifies and draft steps
    assert outs[algorithm] == outs["none"]


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_forward_train_without_autograd_takes_batches_of_sequences(
    mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The training tools' held-out loss calls ``forward_train`` ``[B, S]`` under no_grad on
    a model an Engine laid out: the native LM head takes the ``[B, S, H]`` hidden states
    (its rows are independent) and gives the eager logits' shape and values."""
    heads: list[tuple[int, ...]] = []
    real = head_module.NativeHead.logits

    def logits(self: Any, lib: Any, hidden: torch.Tensor) -> torch.Tensor:
        heads.append(tuple(hidden.shape))
        return real(self, lib, hidden)

    monkeypatch.setattr(head_module.NativeHead, "logits", logits)
    model = random_model(seed=13)
    eager = random_model(seed=13)
    use_cpu_matmul_layout(model)
    ids = torch.tensor([_tokens(7, seed=1), _tokens(7, seed=2)])
    expected = eager.forward_train(ids)
    context = torch.no_grad() if mode == "no_grad" else torch.inference_mode()
    with context:
        got = model.forward_train(ids)
    assert heads == [(2, 7, model.config.hidden_size)]  # the native head took it
    assert got.logits.shape == expected.logits.shape == (2, 7, model.config.vocab_size)
    assert_forwards_close(got.logits, expected.logits.detach(), model.config)
    torch.testing.assert_close(got.hidden_states, expected.hidden_states.detach())
    with context:  # more rows than the native head takes: the eager head, same shape
        long = model.forward_train(torch.tensor([_tokens(40, seed=3)] * 2))
    assert len(heads) == 1 and long.logits.shape == (2, 40, model.config.vocab_size)


def _counting(monkeypatch: pytest.MonkeyPatch, name: str) -> list[int]:
    calls: list[int] = []
    real = getattr(ScriptedLayers, name)

    def counted(self: ScriptedLayers) -> Any:
        calls.append(id(self))
        return real(self)

    monkeypatch.setattr(ScriptedLayers, name, counted)
    return calls


def test_generate_checks_the_weights_once_per_call(
    monkeypatch: pytest.MonkeyPatch, native_calls: list[int]
) -> None:
    """`generate` checks every weight when it starts and trusts them for its forwards;
    an in-place change between calls is repacked at the next call's start, and the answer
    is a fresh engine's on the changed model. A stream checks them at every forward."""
    # eager steps: their forwards are the ones counted (a recorded step's replays call the
    # library through the references it recorded)
    engine = Engine(overlap=False, graphs="off")
    prompts, params = ["def fib(n):", "import os"], SamplingParams(max_new_tokens=12)
    before = engine.generate(prompts, params)
    checks, builds = _counting(monkeypatch, "_current"), _counting(monkeypatch, "_build")
    assert engine.generate(prompts, params) == before
    assert checks == [id(engine.model.scripted)] and builds == []
    with torch.no_grad():
        for layer in engine.model.model.layers:
            layer.mlp.down_proj.weight.mul_(-4.0)
    checks.clear()
    forwards = len(native_calls)
    changed = engine.generate(prompts, params)
    assert checks == [id(engine.model.scripted)] and builds == checks  # repacked once
    assert len(native_calls) > forwards + 8  # the forwards ran natively, unchecked
    assert [o.token_ids for o in changed] != [o.token_ids for o in before]
    fresh = Engine(model=engine.model, overlap=False, tokenizer=engine.tokenizer, graphs="off")
    assert [o.token_ids for o in fresh.generate(prompts, params)] == [o.token_ids for o in changed]
    checks.clear()
    forwards = len(native_calls)
    streamed = [d for d in engine.stream(prompts, params)]
    assert streamed and len(checks) >= len(native_calls) - forwards > 8
