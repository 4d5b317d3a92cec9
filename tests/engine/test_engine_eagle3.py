"""`Engine(algorithm="eagle3")`: the generated eagle3 step on an EAGLE-3 head (random,
saved in SGLang's checkpoint layout) is lossless -- greedy outputs equal plain greedy
decoding with overlap on and off, tree and chain, and through the static graph path --
and relays what SGLang relays: draft-vocabulary top-k ids and the head's own hidden state.

The target has a 16-token vocabulary and the head drafts from 10 of them, so even an
untrained head has some drafts accepted (a test where every draft is rejected would not
exercise draft extend over several tokens or the KV compaction), and some target tokens
can never be drafted."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from relayc.engine import Engine, LlamaForCausalLM, ModelConfig, SamplingParams, random_model
from relayc.engine.draft import Eagle3Head
from tests.engine.engine_helpers import (
    assert_idle,
    naive_outputs,
    one_intra_op_thread,  # noqa: F401 - autouse fixture
    random_workload,
)

CONFIG = ModelConfig(
    vocab_size=16, hidden_size=32, intermediate_size=64, num_layers=4, num_heads=2,
    num_kv_heads=1, head_dim=16,
)  # fmt: skip
DRAFT_VOCAB = 10
SIZES = {
    "chain": {"num_steps": 3, "topk": 1, "num_draft_tokens": 4},
    "tree": {"num_steps": 3, "topk": 3, "num_draft_tokens": 6},
    # one draft step: the tree's parent list is the root's -1 alone
    "one step": {"num_steps": 1, "topk": 2, "num_draft_tokens": 2},
}


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    return random_model(CONFIG, seed=3)


@pytest.fixture(scope="module")
def head_dir(model: LlamaForCausalLM, tmp_path_factory: pytest.TempPathFactory) -> Path:
    head = Eagle3Head.random(model, seed=8, draft_vocab_size=DRAFT_VOCAB, layer_ids=[0, 1, 2])
    return head.save(tmp_path_factory.mktemp("eagle3") / "head")


@pytest.mark.parametrize("shape", list(SIZES))
def test_greedy_outputs_equal_plain_decoding(
    model: LlamaForCausalLM, head_dir: Path, shape: str
) -> None:
    sizes = SIZES[shape]
    work = random_workload(5, 16, max_prompt=12, max_new=10, last_arrival=4, vocab=16)
    expected = naive_outputs(model, work.prompts, work.params)
    for overlap in (True, False):
        engine = Engine(
            model, algorithm="eagle3", draft_model=head_dir, overlap=overlap, debug=True, **sizes
        )
        outs = engine.generate(work.prompts, work.params, arrivals=work.arrivals)
        assert [o.token_ids for o in outs] == expected, f"{shape} overlap={overlap}"
        accepted = [a for o in outs for a in o.accept_lengths]
        assert all(1 <= a <= sizes["num_draft_tokens"] for a in accepted)
        assert max(accepted) > 1, "no draft was ever accepted: the test checks little"
        relay = engine.algorithm.relay.buffers
        # SGLang's EAGLE3 relay: top-k in draft ids, the head's [hidden] output.
        assert int(relay["topk_index"][1:].max()) < DRAFT_VOCAB
        assert relay["hidden_states"].shape[1] == CONFIG.hidden_size
        assert_idle(engine)
        engine.close()


def test_static_graph_path_matches_eager(model: LlamaForCausalLM, head_dir: Path) -> None:
    engines = {
        mode: Engine(
            model,
            algorithm="eagle3",
            draft_model=head_dir,
            graphs=mode,
            capture_batch_sizes=(1, 2, 4),
            max_batch_size=8,
            kv_pool_tokens=1024,
            max_context=48,
            **SIZES["tree"],
        )
        for mode in ("off", "static")
    }
    for n in (1, 3, 5):  # 5: above the largest bucket, eager
        work = random_workload(n, n, max_prompt=9, max_new=8, last_arrival=0, vocab=16)
        outs = {
            mode: [o.token_ids for o in e.generate(work.prompts, work.params)]
            for mode, e in engines.items()
        }
        assert outs["static"] == outs["off"], f"{n} requests"
    assert engines["static"].algorithm.graphs.runners[True].replays > 0
    for engine in engines.values():
        engine.close()


def test_a_missing_or_unfit_head_is_a_clear_error(model: LlamaForCausalLM, head_dir: Path) -> None:
    with pytest.raises(ValueError, match=r"no EAGLE-3 head ships .* pass draft_model=DIR"):
        Engine(model, algorithm="eagle3")
    # The spec's rule `topk <= draft_vocab`, the head supplying its draft vocabulary.
    with pytest.raises(ValueError) as caught:
        Engine(model, algorithm="eagle3", draft_model=head_dir, topk=12, num_draft_tokens=8)
    message = str(caught.value)
    assert "rule `topk <= draft_vocab` (relayc/specs/eagle3.yaml:" in message
    assert f"topk=12, draft_vocab=10 (the EAGLE-3 head's draft_vocab_size, {head_dir})" in message
    assert "the EAGLE-3 head's draft vocabulary: lower `topk`" in message
    assert message.endswith("(`topk` must be at most 10)")
    with pytest.raises(
        ValueError, match=r"`eagle3` cannot run .* \(`num_draft_tokens` must be at most 3\)"
    ):
        Engine(model, algorithm="eagle3", draft_model=head_dir, num_steps=1, topk=2,
               num_draft_tokens=6)  # fmt: skip
    out = Engine(model, algorithm="eagle3", draft_model=head_dir).generate(
        [[1, 2, 3]], SamplingParams(max_new_tokens=4)
    )[0]
    assert len(out.token_ids) == 4


def test_requests_reaching_the_context_end_equal_plain_decoding(
    model: LlamaForCausalLM, head_dir: Path
) -> None:
    """Near `max_context` a request finishes with one-token tail steps through the prefill
    hook: eagle3's captured prefill over a cached prefix keeps the outputs lossless."""
    prompts = [[1, 2, 3, 4, 5], [3, 4], [7] * 10]
    params = SamplingParams(max_new_tokens=40)
    runs = {
        name: Engine(model, algorithm=name, max_context=24, **extra).generate(prompts, params)
        for name, extra in (("none", {}), ("eagle3", {"draft_model": head_dir, **SIZES["tree"]}))
    }
    # Every request ran into the context (the last sampled token needs no KV slot).
    assert [len(p) + len(o.token_ids) for p, o in zip(prompts, runs["eagle3"], strict=True)] == [
        25
    ] * 3
    assert [o.token_ids for o in runs["eagle3"]] == [o.token_ids for o in runs["none"]]


def test_bfloat16_eagle3_equals_plain_decoding(tmp_path: Path) -> None:
    """bfloat16 on the native decoder: eagle3's verify and prefill capture three layers (the
    layers run in segments), `none` runs them in one call; the outputs must still agree."""
    model = random_model(CONFIG.replace(dtype=torch.bfloat16), seed=3)
    head = Eagle3Head.random(model, seed=8, draft_vocab_size=DRAFT_VOCAB, layer_ids=[0, 1, 2])
    head_dir = head.save(tmp_path / "head")
    work = random_workload(4, 16, max_prompt=12, max_new=10, last_arrival=2, vocab=16)
    outs = {
        name: [o.token_ids for o in Engine(model, algorithm=name, **extra).generate(
            work.prompts, work.params, arrivals=work.arrivals)]
        for name, extra in (("none", {}), ("eagle3", {"draft_model": head_dir, **SIZES["tree"]}))
    }  # fmt: skip
    assert outs["eagle3"] == outs["none"]


def test_the_engine_packs_the_native_weights_while_it_loads(
    model: LlamaForCausalLM, head_dir: Path
) -> None:
    """``Engine(...)`` packs what the native CPU decoder runs -- the target's layers and LM
    head, the head's layer and LM head -- before its first request (a GGUF model's block
    checks are loading time, not the first request's), and requests reuse those packs."""
    from relayc.engine.native.library import native_decoder

    if native_decoder() is None:
        pytest.skip("the native library does not build here")
    engine = Engine(model, algorithm="eagle3", draft_model=head_dir, overlap=False)
    head = engine.algorithm.drafter
    assert isinstance(head, Eagle3Head) and engine.model.scripted is not None

    def packs() -> tuple[object, ...]:
        return (
            engine.model.scripted._native,  # type: ignore[union-attr]
            engine.model._native_head,
            head.midlayer.native._weights,
            head._native_head,
        )

    before = packs()
    assert all(p is not None for p in before)
    engine.generate([[1, 2, 3, 4, 5]], SamplingParams(max_new_tokens=6))
    assert all(a is b for a, b in zip(before, packs(), strict=True))
    engine.close()
