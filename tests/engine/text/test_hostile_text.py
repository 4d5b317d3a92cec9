"""Hostile tokenizers and chat templates (issue 45): a template renders under a time and
size budget, whatever its code raises is a ChatError, and a tokenizer's malformed keys,
ids and files are one TokenizerError naming the file and the key."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import gguf
import pytest

from relayc.cli import main
from relayc.engine.checkpoints.gguf import open_gguf, save_gguf
from relayc.engine.core.config import ModelConfig
from relayc.engine.model.weights import random_model, save_checkpoint
from relayc.engine.text.chat import ChatError, render_chat
from relayc.engine.text.tokenizer import TokenizerError, tokenizer_from_dir, tokenizer_from_gguf

USER = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("template", "message"),
    [
        (
            "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}",
            "ran past its time budget",
        ),
        (  # rebinding the name changes nothing: the loops call an imported function
            "{% set budgeted_loop = none %}{% for a in range(100000) %}"
            "{% for b in range(100000) %}{% endfor %}{% endfor %}",
            "ran past its time budget",
        ),
        ("{{ lipsum(n=2000000) }}", "2000000"),
        ("{{ 'x' * 100000000 }}", "a repeat to 100000000, past its budget"),
        ("{% set x = 'x' * 1000 %}{{ x * 100000 }}", "a repeat to 100000000"),
        (
            "{% set ns = namespace(s='x') %}{% for i in range(64) %}"
            "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
            "built a value of 1048576 characters",
        ),
        ("{{ 'x'|center(999999999) }}", "`center` the number 999999999"),
        ("{{ '%0999999999d' % 1 }}", "a format width 999999999"),
        ("{{ '{:>999999999}'.format(1) }}", "a format width 999999999"),
        ("{{ 2 ** 100000000 }}", r"computes 2 \*\* 100000000"),
        ("{% for i in range(100000) %}{{ 'y' * 1000 }}{% endfor %}", "wrote more than"),
    ],
)
def test_a_template_renders_within_its_budget(template: str, message: str) -> None:
    with pytest.raises(ChatError, match=message):
        render_chat(template, USER, time_limit=0.5, max_chars=1_000_000)


@pytest.mark.parametrize(
    ("template", "kind"),
    [
        ("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", "RecursionError"),
        ("{{ (2 ** 2000) * 1.0 }}", "OverflowError"),
        ("{{ 1 // 0 }}", "ZeroDivisionError"),
        ("{{ '%d' % 'text' }}", "TypeError"),
        ("{{ lipsum(2, min=20, max=20) }}", "ValueError"),
    ],
)
def test_what_template_code_raises_is_a_chat_error(template: str, kind: str) -> None:
    with pytest.raises(ChatError, match=f"chat template failed: {kind}"):
        render_chat(template, USER)


def test_a_real_template_still_renders() -> None:
    chatml = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
        "{% if loop.last %}{{ loop.length }}{% endif %}{% endfor %}"
        "{{ '%s-%d' % ('a', 2) }}{{ 'x' * 3 }}{{ 'ab'|center(6) }}{{ lipsum(1)|length > 0 }}"
    )
    text = render_chat(chatml, [*USER, {"role": "assistant", "content": "yo"}])
    assert text.startswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo")
    assert text.endswith("2a-2xxx  ab  True")
    long = [{"role": "user", "content": "z" * 3_000_000}]  # longer than the size budget
    assert len(render_chat("{{ messages[0].content }}", long, max_chars=1000)) == 3_000_000


def _tokenizer_gguf(tmp_path: Path, **changes: tuple[Any, gguf.GGUFValueType]) -> Path:
    tokens = ["<s>", "</s>", "a", "b", "ab", "<|im_end|>"]
    good: dict[str, tuple[Any, gguf.GGUFValueType]] = {
        "tokenizer.ggml.model": ("gpt2", gguf.GGUFValueType.STRING),
        "tokenizer.ggml.tokens": (tokens, gguf.GGUFValueType.ARRAY),
        "tokenizer.ggml.merges": (["a b"], gguf.GGUFValueType.ARRAY),
        "tokenizer.ggml.token_type": ([3, 3, 1, 1, 1, 3], gguf.GGUFValueType.ARRAY),
        "tokenizer.ggml.bos_token_id": (0, gguf.GGUFValueType.UINT32),
        "tokenizer.ggml.eos_token_id": (1, gguf.GGUFValueType.UINT32),
    }

    def write(writer: gguf.GGUFWriter) -> None:
        for key, (value, kind) in {**good, **changes}.items():
            if kind == gguf.GGUFValueType.ARRAY:
                writer.add_array(key, value)
            else:
                writer.add_key_value(key, value, kind)

    model = random_model(ModelConfig(vocab_size=8, num_layers=1), seed=0)
    return save_gguf(model, tmp_path / "tok.gguf", tokenizer=write)


def test_a_good_gguf_tokenizer(tmp_path: Path) -> None:
    tokenizer = tokenizer_from_gguf(open_gguf(_tokenizer_gguf(tmp_path)))
    assert tokenizer.encode("ab") == [4] and tokenizer.bos_id == 0
    assert set(tokenizer.eog_ids) == {1, 5}


A = gguf.GGUFValueType.ARRAY


@pytest.mark.parametrize(
    ("key", "value", "kind", "message"),
    [
        ("tokenizer.ggml.tokens", [1, 2, 3], A, r"`tokenizer\.ggml\.tokens\[0\]` is int 1"),
        ("tokenizer.ggml.merges", [7], A, r"`tokenizer\.ggml\.merges\[0\]` is int"),
        ("tokenizer.ggml.token_type", [3, 3], A, "has 2 entries for 6 tokens"),
        ("tokenizer.ggml.token_type", ["x"] * 6, A, r"`tokenizer\.ggml\.token_type\[0\]` is str"),
        ("tokenizer.ggml.tokens", "abc", gguf.GGUFValueType.STRING, "has str 'abc', expected"),
        ("tokenizer.ggml.bos_token_id", -1, gguf.GGUFValueType.INT32, "`tokenizer.ggml.bos_"),
        ("tokenizer.ggml.eos_token_id", "1", gguf.GGUFValueType.STRING, "`tokenizer.ggml.eos_"),
        ("tokenizer.ggml.pre", [1], A, r"`tokenizer\.ggml\.pre` has list"),
        ("tokenizer.chat_template", 5, gguf.GGUFValueType.UINT32, "`tokenizer.chat_template`"),
        ("tokenizer.ggml.add_bos_token", 1, gguf.GGUFValueType.UINT8, "add_bos_token` has int"),
    ],
)
def test_malformed_gguf_tokenizer_keys_name_the_file_and_key(
    tmp_path: Path, key: str, value: Any, kind: gguf.GGUFValueType, message: str
) -> None:
    path = _tokenizer_gguf(tmp_path, **{key: (value, kind)})
    with pytest.raises(TokenizerError, match=message) as info:
        tokenizer_from_gguf(open_gguf(path))
    assert str(path) in str(info.value)


def _folder(tmp_path: Path) -> Path:
    from tokenizers import Tokenizer, models

    folder = save_checkpoint(random_model(ModelConfig(vocab_size=8, num_layers=1)), tmp_path)
    vocab = {"a": 0, "b": 1, "<|im_end|>": 2}
    Tokenizer(models.BPE(vocab=vocab, merges=[])).save(str(folder / "tokenizer.json"))
    return folder


def test_a_non_utf8_chat_template_names_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _folder(tmp_path / "ckpt")
    (folder / "chat_template.jinja").write_bytes(b"{{ messages }}\xff\xfe")
    with pytest.raises(TokenizerError, match=r"chat_template\.jinja: not UTF-8 text"):
        tokenizer_from_dir(folder, 8)
    argv = ["generate", "--model", str(folder), "--chat", "hi", "--max-new-tokens", "1"]
    assert main(argv) == 2
    assert "chat_template.jinja: not UTF-8 text" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("name", "raw"),
    [
        ("tokenizer_config.json", b'{"a": ' + b"9" * 5000 + b"}"),
        ("generation_config.json", b"[" * 100_000),
    ],
)
def test_json_past_its_limits_names_the_file(tmp_path: Path, name: str, raw: bytes) -> None:
    folder = _folder(tmp_path / "ckpt")
    (folder / name).write_bytes(raw)
    with pytest.raises(TokenizerError, match=name.replace(".", r"\.")):
        tokenizer_from_dir(folder, 8)


@pytest.mark.parametrize(
    ("settings", "config", "message"),
    [
        ({}, {"bos_token_id": -5}, "bos token's id is -5"),
        ({"eos_token": {"content": "a"}}, {}, None),
    ],
)
def test_negative_special_ids_are_refused(
    tmp_path: Path, settings: dict[str, Any], config: dict[str, Any], message: str | None
) -> None:
    folder = _folder(tmp_path / "ckpt")
    (folder / "tokenizer_config.json").write_text(json.dumps(settings))
    hf = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**hf, **config}))
    if message is None:
        assert tokenizer_from_dir(folder, 8) is not None
        return
    with pytest.raises(TokenizerError, match=message) as info:
        tokenizer_from_dir(folder, 8)
    assert str(folder) in str(info.value)


def test_a_hostile_template_fails_its_request_naming_the_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _folder(tmp_path / "ckpt")
    (folder / "chat_template.jinja").write_text("{{ lipsum(n=2000000) }}")
    argv = ["generate", "--model", str(folder), "--chat", "hi", "--max-new-tokens", "1"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "ckpt: the model's chat template calls lipsum(n=2000000" in err


def test_a_huge_token_id_builds_no_huge_list(tmp_path: Path) -> None:
    # One id of 1.5e9 once sized a list of every id up to it (12 GB): under a 3 GiB
    # address-space limit that is a MemoryError; the vocabulary is walked as it is now.
    from tokenizers import Tokenizer, models

    vocab = {"a": 0, "b": 1, "<|im_end|>": 1_500_000_000}
    Tokenizer(models.BPE(vocab=vocab, merges=[])).save(str(tmp_path / "tokenizer.json"))
    script = textwrap.dedent(
        f"""
        import resource
        from pathlib import Path
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
        from relayc.engine.text.tokenizer import tokenizer_from_dir
        print(tokenizer_from_dir(Path({str(tmp_path)!r}), 16).eog_ids)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "()"  # the id is past the model's 16: not an end id
