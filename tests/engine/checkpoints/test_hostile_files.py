"""Hostile checkpoint files (issue 45): sizes checked before anything is allocated, values
that would decode NaN refused, a file cut short while it loads, and every malformed value
one located ``CheckpointError`` -- never a signal, a huge allocation or a stray exception."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import torch

from relayc.engine.checkpoints import gguf as gguf_module
from relayc.engine.checkpoints.gguf import GGUFError, load_gguf_model, open_gguf, save_gguf
from relayc.engine.checkpoints.gguf_reader import read_whole
from relayc.engine.core.config import MAX_CONTEXT, ModelConfig
from relayc.engine.core.limits import tensor_shapes
from relayc.engine.model.weights import (
    CheckpointError,
    expected_tensors,
    load_checkpoint,
    random_model,
    save_checkpoint,
)

CONFIG = ModelConfig(
    vocab_size=64, hidden_size=64, intermediate_size=96, num_layers=2, num_heads=4, head_dim=16
)
T = gguf.GGUFValueType


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return random_model(CONFIG, seed=5)


@pytest.fixture(scope="module")
def source(model: torch.nn.Module, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_gguf(model, tmp_path_factory.mktemp("gguf") / "good.gguf")


def _rewrite(source: Path, path: Path, changes: dict[str, tuple[Any, T | None]]) -> Path:
    """``source`` with metadata keys replaced: key -> (value, type), type None to drop it."""
    file = open_gguf(source)
    writer = gguf.GGUFWriter(str(path), "llama")
    for key, value in file.metadata.items():
        if key.startswith("llama.") and key not in changes:
            writer.add_key_value(key, value, file.reader.fields[key].types[0])
    for key, (value, kind) in changes.items():
        if kind == T.ARRAY:
            writer.add_array(key, value)
        elif kind is not None:
            writer.add_key_value(key, value, kind)
    for tensor in file.reader.tensors:
        writer.add_tensor(tensor.name, np.array(tensor.data))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture
def never_built(monkeypatch: pytest.MonkeyPatch) -> None:
    """Building a model fails the test: the errors must come from the checks before it."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the model was built before its sizes were checked")

    monkeypatch.setattr(gguf_module, "LlamaForCausalLM", refuse)
    monkeypatch.setattr("relayc.engine.model.weights.LlamaForCausalLM", refuse)


def _gguf_error(path: Path) -> str:
    with pytest.raises(GGUFError) as info:
        load_gguf_model(open_gguf(path))
    assert str(path) in str(info.value)
    return str(info.value)


def test_tensor_shapes_are_the_built_models() -> None:
    for config in (CONFIG, CONFIG.replace(tie_word_embeddings=False)):
        built = {n: tuple(t.shape) for n, t in expected_tensors(random_model(config)).items()}
        assert tensor_shapes(config) == built


@pytest.mark.parametrize(
    ("key", "value", "kind", "message"),
    [
        ("llama.block_count", 2**30, T.UINT32, "`llama.block_count` is 1073741824, but the file"),
        ("llama.context_length", 2**32 - 1, T.UINT32, "`llama.context_length` is 4294967295"),
        ("llama.vocab_size", 2**40, T.UINT64, "needs [1099511627776, 64]"),
        ("llama.embedding_length", 2**31, T.UINT64, "token_embd.weight` has shape [64, 64]"),
        ("llama.feed_forward_length", 2**33, T.UINT64, "ffn_gate.weight` has shape [96, 64]"),
    ],
)
def test_gguf_sizes_are_checked_before_the_model_is_built(
    source: Path, tmp_path: Path, never_built: None, key: str, value: int, kind: T, message: str
) -> None:
    path = _rewrite(source, tmp_path / "big.gguf", {key: (value, kind)})
    assert message in _gguf_error(path)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("llama.rope.freq_base", 0.0),
        ("llama.rope.freq_base", float("nan")),
        ("llama.rope.freq_base", -10000.0),
        ("llama.attention.layer_norm_rms_epsilon", -1.0),
        ("llama.attention.layer_norm_rms_epsilon", 0.0),
        ("llama.attention.layer_norm_rms_epsilon", float("inf")),
    ],
)
def test_values_that_decode_nan_are_refused(
    source: Path, tmp_path: Path, key: str, value: float
) -> None:
    path = _rewrite(source, tmp_path / "nan.gguf", {key: (value, T.FLOAT32)})
    assert f"`{key}` must be a finite positive number" in _gguf_error(path)


def test_model_config_refuses_them_on_every_path() -> None:
    with pytest.raises(ValueError, match="`rope_theta` must be a finite positive"):
        CONFIG.replace(rope_theta=float("nan"))
    with pytest.raises(ValueError, match="`rms_norm_eps` must be a finite positive"):
        CONFIG.replace(rms_norm_eps=-1.0)


@pytest.mark.parametrize(
    ("key", "value", "kind", "message"),
    [
        ("llama.attention.head_count", 0, T.UINT32, "`llama.attention.head_count` is 0"),
        ("llama.context_length", [1, 2], T.ARRAY, "`llama.context_length` has list [1, 2]"),
        ("llama.attention.key_length", "16", T.STRING, "`llama.attention.key_length` has str"),
        ("llama.rope.freq_base", [1.0], T.ARRAY, "`llama.rope.freq_base` has list"),
        ("llama.attention.layer_norm_rms_epsilon", True, T.BOOL, "has bool True, expected"),
    ],
)
def test_malformed_metadata_is_a_located_error(
    source: Path, tmp_path: Path, key: str, value: Any, kind: T, message: str
) -> None:
    path = _rewrite(source, tmp_path / "bad.gguf", {key: (value, kind)})
    assert message in _gguf_error(path)


def test_a_gguf_cut_short_while_it_loads_is_no_signal(source: Path, tmp_path: Path) -> None:
    # The file is opened, then truncated (a copy being rewritten) before its tensors are
    # read: a memory-mapped reader dies of SIGBUS at the first page past the new end.
    path = tmp_path / "shrinking.gguf"
    path.write_bytes(source.read_bytes())
    script = textwrap.dedent(
        f"""
        import os
        from relayc.engine.checkpoints.gguf import load_gguf_model, open_gguf
        file = open_gguf({str(path)!r})
        os.truncate({str(path)!r}, 64)
        load_gguf_model(file)
        print("loaded")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert "loaded" in done.stdout


def test_a_file_that_shrinks_during_the_read_is_an_error(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    from relayc.engine.checkpoints import gguf_reader

    path = tmp_path / "short.gguf"
    path.write_bytes(source.read_bytes())
    real_fstat = os.fstat

    def fstat_then_cut(fd: int) -> os.stat_result:
        info = real_fstat(fd)
        os.truncate(path, 100)  # cut after its size was taken, as a rewrite would
        return info

    monkeypatch.setattr(gguf_reader.os, "fstat", fstat_then_cut)
    with pytest.raises(GGUFError, match=r"short\.gguf.*shrank while it was read"):
        open_gguf(path)


def test_not_a_regular_file(tmp_path: Path) -> None:
    import os

    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    with pytest.raises(CheckpointError, match=r"model\.gguf is not a regular file"):
        open_gguf(fifo)  # must not block waiting for a writer
    with pytest.raises(ValueError, match="not a regular file"):
        read_whole(fifo)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory, model: torch.nn.Module) -> Path:
    return save_checkpoint(model, tmp_path_factory.mktemp("hf") / "good")


def _with_config(folder: Path, where: Path, **changes: Any) -> Path:
    import shutil

    shutil.copytree(folder, where)
    config = json.loads((where / "config.json").read_text())
    (where / "config.json").write_text(json.dumps({**config, **changes}))
    return where


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("vocab_size", 2**40, "the metadata's model needs [1099511627776, 64]"),
        ("num_hidden_layers", 2**30, "`num_hidden_layers` is 1073741824, but the file"),
        ("intermediate_size", 2**36, "mlp.gate_proj.weight` in `model.safetensors` has shape"),
        ("max_position_embeddings", 2**40, "`max_position_embeddings` is 1099511627776"),
    ],
)
def test_hf_sizes_are_checked_before_the_model_is_built(
    folder: Path, tmp_path: Path, never_built: None, key: str, value: int, message: str
) -> None:
    broken = _with_config(folder, tmp_path / "big", **{key: value})
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(broken)
    assert message in str(info.value) and str(broken) in str(info.value)


def test_context_limit_is_what_is_allowed() -> None:
    assert MAX_CONTEXT >= 131072  # Llama 3's context loads


@pytest.mark.parametrize(
    ("key", "value", "kind"),
    [
        ("llama.attention.head_count", 0, T.UINT32),  # was a ZeroDivisionError
        ("llama.context_length", [1, 2], T.ARRAY),  # was a TypeError
        ("llama.rope.freq_base", float("nan"), T.FLOAT32),  # loaded, decoded NaN
    ],
)
def test_the_command_line_gives_one_line_and_exit_2(
    source: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    key: str,
    value: Any,
    kind: T,
) -> None:
    from relayc.cli import main

    path = _rewrite(source, tmp_path / "bad.gguf", {key: (value, kind)})
    argv = ["generate", "--model", str(path), "--prompt-ids", "1,2", "--max-new-tokens", "1"]
    assert main(argv) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]  # after the progress lines
    assert last.startswith(f"relayc generate: error: {path}: ") and f"`{key}`" in last
