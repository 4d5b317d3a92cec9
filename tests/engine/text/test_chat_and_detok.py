"""Chat templates render in a sandbox with transformers' variables; bad chats and bad
templates are ChatErrors; streamed text never splits a character and adds up to the
full decode."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from relayc.engine import Engine, SamplingParams
from relayc.engine.core.config import ModelConfig
from relayc.engine.model.weights import random_model, save_checkpoint
from relayc.engine.text.bytes import ByteTokenizer
from relayc.engine.text.chat import ChatError, check_messages, render_chat
from relayc.engine.text.detok import Detokenizer
from relayc.engine.text.tokenizer import TokenizerError, tokenizer_from_dir

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_render_chatml() -> None:
    text = render_chat(CHATML, [{"role": "user", "content": "hi"}])
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert render_chat(CHATML, [{"role": "user", "content": "x"}], add_generation_prompt=False)


@pytest.mark.parametrize(
    ("messages", "message"),
    [
        ([], "the chat is empty"),
        ("hello", "a chat must be a list"),
        ([{"content": "no role"}], "chat message 0 needs a `role`"),
        ([{"role": "user", "content": "ok"}, {"role": "user"}], "chat message 1 needs a `content`"),
        ([["user", "hi"]], "chat message 0 must be a dict"),
    ],
)
def test_bad_chats(messages: object, message: str) -> None:
    with pytest.raises(ChatError, match=message):
        check_messages(messages)


def test_templates_are_data_not_code() -> None:
    escape = "{{ messages.__class__.__mro__[1].__subclasses__() }}"
    with pytest.raises(ChatError, match="chat template failed"):
        render_chat(escape, [{"role": "user", "content": "x"}])
    mutate = "{% set _ = messages.append(1) %}{{ messages }}"
    with pytest.raises(ChatError, match="chat template failed"):
        render_chat(mutate, [{"role": "user", "content": "x"}])
    refuse = "{{ raise_exception('only user and assistant roles') }}"
    with pytest.raises(ChatError, match="refused the messages: only user and assistant"):
        render_chat(refuse, [{"role": "user", "content": "x"}])
    with pytest.raises(ChatError, match="does not parse"):
        render_chat("{% for %}", [{"role": "user", "content": "x"}])


def test_byte_stream_holds_a_split_character() -> None:
    tokenizer = ByteTokenizer()
    text = "añ🙂b"
    detok = Detokenizer(tokenizer.decode)
    pieces = [detok.push([t]) for t in tokenizer.encode(text)] + [detok.push([], final=True)]
    assert "".join(pieces) == text
    assert "\ufffd" not in "".join(pieces)
    assert pieces[:3] == ["a", "", "ñ"]  # the second byte of ñ completes it


def test_broken_utf8_is_released_at_the_end_as_the_full_decode_shows_it() -> None:
    tokenizer = ByteTokenizer()
    ids = [0xF0, 0x9F, 65]  # a cut-off 4-byte character, then "A"
    detok = Detokenizer(tokenizer.decode)
    pieces = [detok.push([t]) for t in ids] + [detok.push([], final=True)]
    assert "".join(pieces) == tokenizer.decode(ids)


def _hf_folder(tmp_path: Path) -> Path:
    """A tiny random model with a real BPE tokenizer.json and a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {c: i for i, c in enumerate(["<|im_end|>", "<s>", *"abcdefghij ", "ab", "abc"])}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[("a", "b"), ("ab", "c")]))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.decoder = decoders.BPEDecoder()
    backend.add_special_tokens(["<|im_end|>", "<s>"])
    model = random_model(ModelConfig(vocab_size=len(vocab) + 3), seed=0)  # padded vocabulary
    save_checkpoint(model, tmp_path)
    backend.save(str(tmp_path / "tokenizer.json"))
    settings = {"chat_template": CHATML.replace("<|im_start|>", ""), "eos_token": "<|im_end|>"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(settings))
    return tmp_path


def test_checkpoint_folder_tokenizer(tmp_path: Path) -> None:
    folder = _hf_folder(tmp_path)
    tokenizer = tokenizer_from_dir(folder, 16)
    assert tokenizer is not None
    assert tokenizer.encode("abc ab") == [14, 13]
    assert tokenizer.eog_ids == (0,) and tokenizer.eos_id == 0
    engine = Engine(model=folder)
    assert engine.tokenizer is not None
    out = engine.chat([{"role": "user", "content": "abc"}], SamplingParams(max_new_tokens=4))[0]
    # "user" has only "e" in this vocabulary; then "abc" and <|im_end|> as its special id
    assert out.error is None and out.prompt_token_ids[:3] == [6, 14, 0]
    assert isinstance(out.text, str)


def test_broken_tokenizer_files_name_the_file(tmp_path: Path) -> None:
    folder = _hf_folder(tmp_path)
    (folder / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(TokenizerError, match=r"tokenizer_config\.json is not valid JSON"):
        tokenizer_from_dir(folder, 16)
    engine = Engine(model=folder)  # the model still loads: token ids run
    assert engine.tokenizer is None
    out = engine.generate(["abc", [1, 2]], SamplingParams(max_new_tokens=2))
    assert "tokenizer_config.json is not valid JSON" in (out[0].error or "")
    assert out[1].finish_reason == "length"
    assert torch.is_tensor(engine.model.lm_head.weight)
