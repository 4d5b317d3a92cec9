"""bench/peers.py's llama.cpp rows for the real model, with a stand-in ``llama_cpp`` module
(llama-cpp-python builds from source for a long time, so it is not a test dependency): the
CPU backend's extra buffer types are off while each model loads, a request stops at an
end-of-generation token or after its new-token budget, and the same-weights file is a GGUF
written from relayc's weights with the shipped file's tokenizer."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def _peers_module(monkeypatch: pytest.MonkeyPatch) -> Any:
    spec = importlib.util.spec_from_file_location("bench_peers", ROOT / "bench" / "peers.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_peers", module)  # its dataclasses look it up
    spec.loader.exec_module(module)
    return module


class _Params:
    use_extra_bufts = True


class _FakeLlama:
    made: ClassVar[list[tuple[str, bool]]] = []

    def __init__(self, path: str, **kwargs: Any) -> None:
        params = sys.modules["llama_cpp"].llama_cpp.llama_model_default_params()
        self.path = path
        _FakeLlama.made.append((Path(path).name, params.use_extra_bufts))
        self.closed = False

    def generate(self, prompt: list[int], **kwargs: Any) -> Any:
        assert kwargs["temp"] == 0.0 and kwargs["top_k"] == 1
        yield from [prompt[-1] + 1, 7, 2, 9, 9]  # 2: end of generation in the test

    def close(self) -> None:
        self.closed = True


def test_llama_cpp_rows_load_without_extra_bufts_and_stop_like_relayc(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    low = types.SimpleNamespace(llama_model_default_params=_Params)
    fake = types.ModuleType("llama_cpp")
    fake.llama_cpp = low  # type: ignore[attr-defined]
    fake.Llama = _FakeLlama  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "llama_cpp", fake)
    peers = _peers_module(monkeypatch)

    import relayc.engine.checkpoints.gguf as gguf_module
    import relayc.engine.checkpoints.loader as loader_module
    import relayc.engine.checkpoints.named as named_module
    import relayc.engine.text.tokenizer as tokenizer_module

    source = tmp_path / "model.Q4_1.gguf"
    source.write_bytes(b"")
    saved: list[tuple[str, str]] = []
    monkeypatch.setattr(named_module, "named_model_file", lambda name: source)
    monkeypatch.setattr(gguf_module, "open_gguf", lambda path: "the file")
    monkeypatch.setattr(gguf_module, "copy_tokenizer_fields", lambda file: ("tokenizer of", file))
    monkeypatch.setattr(
        tokenizer_module,
        "tokenizer_from_gguf",
        lambda file: types.SimpleNamespace(eog_ids=(2,)),
    )
    monkeypatch.setattr(
        loader_module,
        "load_model",
        lambda name, device, dtype: types.SimpleNamespace(model=f"{name} {dtype}"),
    )

    def save(model: Any, path: Path, *, tensor_type: str, tokenizer: Any) -> Path:
        assert model == f"smollm2 {torch.float32}" and tokenizer == ("tokenizer of", "the file")
        saved.append((Path(path).name, tensor_type))
        Path(path).write_bytes(b"gguf")
        return Path(path)

    monkeypatch.setattr(gguf_module, "save_gguf", save)
    _FakeLlama.made = []
    rows = peers.llama_cpp_real_peers(4, 1, "bfloat16", tmp_path)
    assert [r.label for r in rows] == [
        "llama.cpp greedy Q4_1 bfloat16",
        "llama.cpp greedy bfloat16",
    ]
    assert saved == [("smollm2-bfloat16.gguf", "BF16")]
    # extra buffer types off while each model loaded, the default restored afterwards
    assert _FakeLlama.made == [(source.name, False), ("smollm2-bfloat16.gguf", False)]
    assert low.llama_model_default_params is _Params
    outputs, accepts = rows[0].run([[5, 6], [40]], 1)
    assert outputs == [[7, 7, 2], [41, 7, 2]] and accepts == []  # the stop token kept
    outputs, _ = rows[1].run([[1]], 1)
    assert outputs == [[2]]
    short = peers.llama_cpp_real_peers(2, 1, "float32", tmp_path)
    assert saved[-1] == ("smollm2-float32.gguf", "F32")
    assert short[0].run([[5]], 1)[0] == [[6, 7]]  # the new-token budget
    assert all(r.max_batch == 1 for r in rows)


def test_no_llama_cpp_no_rows(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    assert _peers_module(monkeypatch).llama_cpp_real_peers(4, 1, "float32", tmp_path) == []
