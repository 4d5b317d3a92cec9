"""SmolLM2-135M-Instruct end to end: the GGUF file against transformers' own GGUF loader
(the oracle), its tokenizer and chat template, chat generation that stops at the end of
the turn, streamed text, n-gram speculation lossless on it, and bad requests. Short on
purpose: a few tokens per generation (the model runs ~25-30 tokens/s on one CPU thread)."""

from __future__ import annotations

import json

import pytest
import torch

from relayc.engine import Engine, SamplingParams
from relayc.engine.native.blocks import BLOCKS_Q4, BLOCKS_Q8, float32_path
from relayc.engine.text.detok import Detokenizer
from tests.engine.engine_helpers import one_intra_op_thread  # noqa: F401 - fixture
from tests.engine.real_model import (
    CHATS,
    QUOTING_CHATS,
    smollm2,
    smollm2_file,
    transformers_smollm2,
)

GREEDY = SamplingParams(max_new_tokens=12, temperature=0.0)


def test_config_and_weights_match_transformers() -> None:
    ours, theirs = smollm2().model, transformers_smollm2()
    config = ours.config
    assert (config.num_layers, config.hidden_size, config.num_heads, config.num_kv_heads) == (
        30,
        576,
        9,
        3,
    )
    assert (config.head_dim, config.vocab_size, config.rope_theta) == (64, 49152, 100000.0)
    assert config.tie_word_embeddings
    state = ours.state_dict()
    for name, tensor in theirs.state_dict().items():
        assert torch.equal(state[name], tensor.float()), name


def test_logits_within_1e4_of_transformers() -> None:
    loaded, theirs = smollm2(), transformers_smollm2()
    ids = torch.tensor([*loaded.tokenizer.encode_chat(CHATS[0]), 504, 5356, 314])
    with torch.no_grad():
        expected = theirs(ids[None]).logits[0]
    got = loaded.model.forward_dense(ids).logits
    assert (got - expected).abs().max().item() < 1e-4
    assert torch.equal(got.argmax(-1), expected.argmax(-1))


def test_greedy_tokens_are_transformers_argmax_under_teacher_forcing() -> None:
    loaded, theirs = smollm2(), transformers_smollm2()
    engine = Engine(model=loaded.model, tokenizer=loaded.tokenizer)
    prompts = [loaded.tokenizer.encode_chat(chat) for chat in CHATS]
    outs = engine.generate(prompts, SamplingParams(max_new_tokens=16, ignore_eos=True))
    for prompt, out in zip(prompts, outs, strict=True):
        sequence = torch.tensor(prompt + out.token_ids)
        with torch.no_grad():
            logits = theirs(sequence[None]).logits[0, len(prompt) - 1 : -1]
        top2 = logits.topk(2, dim=-1).values
        clear = (top2[:, 0] - top2[:, 1]) > 1e-3  # not a float32 tie
        assert clear.sum() >= len(out.token_ids) - 1
        got = torch.tensor(out.token_ids)
        assert torch.equal(got[clear], logits.argmax(-1)[clear]), loaded.tokenizer.decode(got)
    # ... decoded over the file's own blocks (relayc.engine.native.blocks): the Q4_1
    # layers and the Q8_0 head, read as stored -- or float32 panels where this CPU's table
    # says they are faster (blocks.FLOAT32_PATHS: AVX2 without AVX-512)
    model = loaded.model
    assert model.scripted is not None and model.scripted._native is not None
    assert model._native_head is not None
    blocks = float32_path() == "blocks"
    assert set(model.scripted._native.formats) == ({BLOCKS_Q4} if blocks else {0})
    assert model._native_head.format == (BLOCKS_Q8 if blocks else 0)


TEXTS = [
    "Hello 12345 world",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "Ünïcödé ✓ 日本語 🙂🌊 emoji, and a tab\there",
    "  leading spaces\t\ttabs\n\n\nnewlines   ",
    "<|im_start|>user\nhi<|im_end|>\n",
    "It's 3.14159 o'clock, isn't it? I'LL SEE YOU'RE RIGHT",
]


def test_tokenizer_and_chat_template_match_transformers() -> None:
    from transformers import AutoTokenizer

    tokenizer = smollm2().tokenizer
    assert tokenizer.source.endswith(".gguf")
    file = smollm2_file()
    theirs = AutoTokenizer.from_pretrained(file.parent, gguf_file=file.name)
    for text in TEXTS:
        ids = tokenizer.encode(text)
        assert ids == theirs.encode(text, add_special_tokens=False), text
        assert tokenizer.decode(ids) == theirs.decode(ids, skip_special_tokens=True)
    for chat in CHATS:
        expected = theirs.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        assert tokenizer.apply_chat_template(chat) == expected
    assert tokenizer.eog_ids == (0, 2)  # <|endoftext|>, <|im_end|>
    assert tokenizer.token(2) == "<|im_end|>"


def test_streamed_text_never_splits_a_character() -> None:
    tokenizer = smollm2().tokenizer
    for text in TEXTS:
        ids = tokenizer.encode(text)
        detok = Detokenizer(tokenizer.decode)
        pieces = [detok.push([t]) for t in ids] + [detok.push([], final=True)]
        assert all("\ufffd" not in p for p in pieces), pieces
        assert "".join(pieces) == tokenizer.decode(ids)


def test_chat_answers_stop_at_the_end_of_the_turn_and_stream_the_same_text() -> None:
    loaded = smollm2()
    engine = Engine(model=loaded.model, tokenizer=loaded.tokenizer)
    params = SamplingParams(max_new_tokens=48)
    chat = [{"role": "user", "content": "What is the capital of France?"}]
    out = engine.chat(chat, params)[0]
    assert out.finish_reason == "stop", out
    assert out.token_ids[-1] in loaded.tokenizer.eog_ids
    assert out.text and "<|im_end|>" not in out.text
    streamed = "".join(d.text for d in engine.chat_stream([chat], params))
    assert streamed == out.text
    # ignore_eos runs past the end of the turn
    longer = engine.chat(
        chat, SamplingParams(max_new_tokens=len(out.token_ids) + 2, ignore_eos=True)
    )
    assert longer[0].finish_reason == "length"
    assert longer[0].token_ids[: len(out.token_ids)] == out.token_ids


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("graphs", ["off", "static"])
def test_ngram_is_lossless_on_the_real_model(overlap: bool, graphs: str) -> None:
    loaded = smollm2()
    prompts = [loaded.tokenizer.encode_chat(chat) for chat in QUOTING_CHATS]
    params = SamplingParams(max_new_tokens=20, ignore_eos=True)
    reference = _none_outputs(tuple(tuple(p) for p in prompts), params)
    engine = Engine(
        model=loaded.model,
        tokenizer=loaded.tokenizer,
        algorithm="ngram",
        num_draft_tokens=6,
        overlap=overlap,
        graphs=graphs,
        max_batch_size=4,
    )
    outs = engine.generate(prompts, params)
    assert [o.token_ids for o in outs] == reference
    accepted = [n for o in outs for n in o.accept_lengths]
    assert sum(accepted) / len(accepted) > 1.5  # the quoted text is drafted and accepted


@pytest.mark.parametrize("overlap", [True, False])
def test_the_shipped_dflash_drafter_is_lossless_and_accepts(overlap: bool) -> None:
    """`draft_model=None` picks the DFlash drafter shipped for SmolLM2 (its draft
    vocabulary included); greedy output is `none`'s, and its drafts are accepted."""
    from relayc.engine.checkpoints.shipped import ASSETS_DIR

    loaded = smollm2()
    prompts = [loaded.tokenizer.encode_chat(chat) for chat in QUOTING_CHATS + CHATS[:2]]
    params = SamplingParams(max_new_tokens=16, ignore_eos=True)
    reference = _none_outputs(tuple(tuple(p) for p in prompts), params)
    engine = Engine(
        model=loaded.model,
        tokenizer=loaded.tokenizer,
        algorithm="dflash",
        num_draft_tokens=4,
        overlap=overlap,
        max_batch_size=4,
    )
    drafter = engine.algorithm.drafter
    assert drafter.vocab_head is not None and drafter.block_size == 8
    shipped = json.loads((ASSETS_DIR / "smollm2" / "dflash" / "draft_vocab.json").read_text())
    assert drafter.vocab_head.tokens.tolist() == shipped["token_ids"]
    outs = engine.generate(prompts, params)
    assert [o.token_ids for o in outs] == reference
    accepted = [n for o in outs for n in o.accept_lengths]
    assert sum(accepted) / len(accepted) > 1.2  # a random drafter: about 1.0


_NONE: dict[object, list[list[int]]] = {}


def _none_outputs(prompts: tuple[tuple[int, ...], ...], params: SamplingParams) -> list[list[int]]:
    if (prompts, params) not in _NONE:
        loaded = smollm2()
        engine = Engine(model=loaded.model, tokenizer=loaded.tokenizer, max_batch_size=4)
        outs = engine.generate([list(p) for p in prompts], params)
        _NONE[(prompts, params)] = [o.token_ids for o in outs]
    return _NONE[(prompts, params)]


def test_bad_requests_get_their_own_errors() -> None:
    loaded = smollm2()
    engine = Engine(model=loaded.model, tokenizer=loaded.tokenizer, max_context=64)
    long_chat = [{"role": "user", "content": "word " * 100}]
    outs = engine.generate(
        [
            "Hi",
            [1, 2, 49152],
            "",
        ],
        SamplingParams(max_new_tokens=2),
    )
    assert outs[0].finish_reason == "length" and outs[0].error is None
    assert "outside the vocabulary [0, 49152)" in (outs[1].error or "")
    assert outs[2].error == "prompt is empty"
    chats = engine.chat(
        [[], long_chat, [{"role": "user"}], CHATS[1]], SamplingParams(max_new_tokens=2)
    )
    assert "the chat is empty" in (chats[0].error or "")
    assert "the context holds 64" in (chats[1].error or "")
    assert "needs a `content` string" in (chats[2].error or "")
    assert chats[3].finish_reason == "length" and len(chats[3].token_ids) == 2


def test_bfloat16_runs_natively_and_speculation_stays_lossless() -> None:
    loaded = smollm2(torch.bfloat16)
    assert loaded.model.lm_head.weight.dtype == torch.bfloat16
    prompts = [loaded.tokenizer.encode_chat(chat) for chat in QUOTING_CHATS + CHATS[:1]]
    params = SamplingParams(max_new_tokens=12, ignore_eos=True)
    outputs = {}
    for algorithm in ("none", "ngram"):
        engine = Engine(
            model=loaded.model, tokenizer=loaded.tokenizer, algorithm=algorithm, max_batch_size=4
        )
        outputs[algorithm] = [o.token_ids for o in engine.generate(prompts, params)]
    assert outputs["ngram"] == outputs["none"]
    # bfloat16 weights keep the float32 model's answer to a plain question
    fp32 = [o.token_ids for o in _fp32_engine().generate(prompts[-1:], params)]
    assert outputs["none"][-1][:4] == fp32[0][:4]


def _fp32_engine() -> Engine:
    loaded = smollm2()
    return Engine(model=loaded.model, tokenizer=loaded.tokenizer)
