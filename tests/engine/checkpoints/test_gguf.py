"""GGUF files: config and weights read back exactly, every quantized type through the
`gguf` package's dequantizers, q/k rows un-permuted, and one located error for each way a
file can be wrong -- on small files written here (the real model: test_real_model.py)."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from relayc.engine import Engine
from relayc.engine.checkpoints.gguf import (
    GGUFError,
    load_gguf_model,
    open_gguf,
    permute_rope_rows,
    save_gguf,
    unpermute_rope_rows,
)
from relayc.engine.core.config import ModelConfig
from relayc.engine.errors import CheckpointError
from relayc.engine.model.weights import random_model

# Widths that are whole blocks of every type (K-quants: 256 values per block).
CONFIG = ModelConfig(
    hidden_size=256, intermediate_size=512, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=64
)


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return random_model(CONFIG, seed=3)


@pytest.fixture(scope="module")
def f32_file(model: torch.nn.Module, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_gguf(model, tmp_path_factory.mktemp("gguf") / "model-f32.gguf")


def test_rope_permutation_round_trips_and_is_llama_cpps() -> None:
    weight = torch.arange(2 * 8 * 3, dtype=torch.float32).reshape(16, 3)  # 2 heads of dim 8
    permuted = permute_rope_rows(weight, heads=2)
    # llama.cpp interleaves each head's halves: rows 0, 4, 1, 5, 2, 6, 3, 7 of head 0.
    assert permuted[:8, 0].tolist() == [0.0, 12.0, 3.0, 15.0, 6.0, 18.0, 9.0, 21.0]
    assert torch.equal(unpermute_rope_rows(permuted, heads=2), weight)


def test_float32_file_is_the_same_model(model: torch.nn.Module, f32_file: Path) -> None:
    loaded = load_gguf_model(open_gguf(f32_file))
    # GGUF stores the epsilon as a float32
    assert loaded.config == CONFIG.replace(rms_norm_eps=float(np.float32(CONFIG.rms_norm_eps)))
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    ids = torch.tensor([1, 5, 9, 200, 7])
    assert torch.equal(loaded.forward_dense(ids).logits, model.forward_dense(ids).logits)


@pytest.mark.parametrize("kind", ["F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"])
def test_quantized_types_load_as_their_dequantized_values(
    model: torch.nn.Module, kind: str, tmp_path: Path
) -> None:
    path = save_gguf(model, tmp_path / f"model-{kind}.gguf", tensor_type=kind)
    file = open_gguf(path)
    loaded = load_gguf_model(file)
    qtype = gguf.GGMLQuantizationType[kind]
    stored = {t.name: t for t in file.reader.tensors}
    q = stored["blk.1.attn_q.weight"]
    assert q.tensor_type == qtype
    expected = torch.from_numpy(gguf.quants.dequantize(q.data, qtype).copy()).reshape(256, 256)
    got = loaded.state_dict()["model.layers.1.self_attn.q_proj.weight"]
    assert torch.equal(got, unpermute_rope_rows(expected, CONFIG.num_heads))
    # and close to the original: the quantization error only
    original = model.state_dict()["model.layers.1.self_attn.q_proj.weight"]
    assert (got - original).abs().max() < 0.1


def _write_raw(
    path: Path,
    model: torch.nn.Module,
    raw: dict[str, tuple[np.ndarray, int]],
    drop_key: str | None = None,
) -> None:
    """``model`` as F32 GGUF except the tensors in ``raw`` -- (bytes, type) written as given,
    in place of the model's or added -- and without the metadata key ``drop_key``."""
    source = open_gguf(save_gguf(model, path.with_suffix(".src.gguf")))
    writer = gguf.GGUFWriter(str(path), "llama")
    for key, value in source.metadata.items():
        if key.startswith("llama.") and key != drop_key:
            writer.add_key_value(key, value, source.reader.fields[key].types[0])
    names = [t.name for t in source.reader.tensors]
    for tensor in source.reader.tensors:
        if tensor.name not in raw:
            writer.add_tensor(tensor.name, np.array(tensor.data))
    for name, (data, qtype) in raw.items():
        writer.add_tensor(name, data, raw_dtype=gguf.GGMLQuantizationType(qtype))
    assert set(raw) <= set(names) or drop_key is None
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize("kind", ["Q4_K", "Q5_K", "Q6_K"])
def test_k_quants_go_through_gguf_dequantizers(
    model: torch.nn.Module, kind: str, tmp_path: Path
) -> None:
    # The gguf package dequantizes K-quants but cannot write them: random blocks with
    # small, finite scales stand in for a real quantizer's output.
    qtype = gguf.GGMLQuantizationType[kind]
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(0)
    data = rng.integers(0, 256, size=(512, 256 // block * size), dtype=np.uint8)
    scales = np.full((*data.shape[:1], 1), 0x1C00, dtype=np.uint16).view(np.uint8)  # 2**-8
    for start in range(0, data.shape[1], size):  # d (and dmin) are the first / last halves
        if kind == "Q6_K":
            data[:, start + size - 2 : start + size] = scales
        else:
            data[:, start : start + 2] = scales
            data[:, start + 2 : start + 4] = scales
    path = tmp_path / f"model-{kind}.gguf"
    _write_raw(path, model, {"blk.0.ffn_up.weight": (data, qtype)})
    loaded = load_gguf_model(open_gguf(path))
    expected = gguf.quants.dequantize(data, qtype).reshape(512, 256)
    got = loaded.state_dict()["model.layers.0.mlp.up_proj.weight"]
    assert np.isfinite(expected).all()
    assert torch.equal(got, torch.from_numpy(expected.copy()))


def _error(path: Path) -> str:
    with pytest.raises(GGUFError) as info:
        load_gguf_model(open_gguf(path))
    message = str(info.value)
    assert str(path) in message  # located: the file is named
    return message


def test_not_a_gguf_file(tmp_path: Path) -> None:
    path = tmp_path / "weights.gguf"
    path.write_bytes(b"PK\x03\x04 a zip file")
    assert "is not a GGUF file" in _error(path)


@pytest.mark.parametrize("keep", [0.01, 0.5, 0.999])
def test_truncated_file(f32_file: Path, tmp_path: Path, keep: float) -> None:
    data = f32_file.read_bytes()
    path = tmp_path / "cut.gguf"
    path.write_bytes(data[: int(len(data) * keep)])
    assert "copy it again" in _error(path)


def test_wrong_architecture(model: torch.nn.Module, tmp_path: Path) -> None:
    path = tmp_path / "other.gguf"
    writer = gguf.GGUFWriter(str(path), "gpt2")
    writer.add_block_count(2)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert "`general.architecture` is 'gpt2'" in _error(path)


def test_tensor_type_gguf_cannot_dequantize(model: torch.nn.Module, tmp_path: Path) -> None:
    path = tmp_path / "int.gguf"
    ints = np.zeros((256, 256), dtype=np.int32)
    _write_raw(path, model, {"blk.0.attn_v.weight": (ints, gguf.GGMLQuantizationType.I32)})
    # attn_v is [128, 256] in this model: the type is reported before the shape would be
    message = _error(path)
    assert "blk.0.attn_v.weight" in message and ("I32" in message or "shape" in message)


def test_wrong_shape_names_the_tensor(model: torch.nn.Module, tmp_path: Path) -> None:
    path = tmp_path / "shape.gguf"
    wrong = np.zeros((512, 256), dtype=np.float32)
    _write_raw(path, model, {"blk.1.attn_output.weight": (wrong, gguf.GGMLQuantizationType.F32)})
    message = _error(path)
    assert "blk.1.attn_output.weight" in message and "[512, 256]" in message
    assert "[256, 256]" in message


def test_unknown_tensor_and_missing_metadata(model: torch.nn.Module, tmp_path: Path) -> None:
    path = tmp_path / "extra.gguf"
    extra = {"blk.0.attn_q_norm.weight": (np.ones(64, dtype=np.float32), 0)}
    _write_raw(path, model, extra)
    assert "unexpected tensor `blk.0.attn_q_norm.weight`" in _error(path)
    path = tmp_path / "nolayers.gguf"
    _write_raw(path, model, {}, drop_key="llama.block_count")
    assert "`llama.block_count` is missing" in _error(path)


def test_engine_takes_a_gguf_path_and_errors_are_checkpoint_errors(
    f32_file: Path, tmp_path: Path
) -> None:
    engine = Engine(model=str(f32_file), algorithm="none")
    assert engine.model.config.hidden_size == 256
    assert engine.tokenizer is None  # this file carries no tokenizer: token ids only
    out = engine.generate(["text"])[0]
    assert out.finish_reason == "error" and "need a tokenizer" in (out.error or "")
    assert engine.generate([[1, 2, 3]])[0].finish_reason == "length"
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(f32_file.read_bytes()[:1000])
    with pytest.raises(CheckpointError, match=r"bad\.gguf"):
        Engine(model=bad)


def _every_value_type(writer: gguf.GGUFWriter) -> None:
    writer.add_array("tokenizer.ggml.tokens", ["<s>", "a", "bé", "ü" * 40, ""])
    writer.add_array("tokenizer.ggml.scores", [0.5, -1.0, 2.25, 0.0, 1e-3])
    writer.add_array("tokenizer.ggml.token_type", [1, 2, 3, 1, 1])
    writer.add_array("tokenizer.empty", [])
    writer.add_array("tokenizer.nested", [[1, 2], [3, 4, 5]])
    writer.add_string("tokenizer.chat_template", "{{ messages }}")
    writer.add_uint32("tokenizer.ggml.bos_token_id", 1)
    writer.add_bool("tokenizer.ggml.add_bos_token", True)
    for kind, value in [
        ("uint8", 200),
        ("int8", -100),
        ("uint16", 60000),
        ("int16", -30000),
        ("int32", -7),
        ("uint64", 2**60),
        ("int64", -(2**60)),
        ("float32", 0.1),
        ("float64", 0.1),
    ]:
        getattr(writer, f"add_{kind}")(f"tokenizer.value.{kind}", value)


@pytest.mark.parametrize("endian", [gguf.GGUFEndian.LITTLE, gguf.GGUFEndian.BIG])
@pytest.mark.parametrize("kind", ["F32", "F16", "Q8_0", "Q4_1"])
def test_our_reader_reads_what_gguf_reads(
    model: torch.nn.Module, tmp_path: Path, kind: str, endian: gguf.GGUFEndian
) -> None:
    """open_gguf's reader (relayc.engine.checkpoints.gguf_reader, a tenth of gguf's time)
    gives every metadata value, value type and tensor gguf's own reader gives: strings,
    arrays of strings, numbers and arrays, each scalar type, and each tensor's type, shape,
    offset and bytes -- in either byte order."""
    from relayc.engine.checkpoints.gguf_reader import read_gguf

    path = save_gguf(
        model, tmp_path / f"{kind}.gguf", tensor_type=kind, tokenizer=_every_value_type
    )
    if endian == gguf.GGUFEndian.BIG:  # the same file, written big-endian
        little = gguf.GGUFReader(path)
        path = tmp_path / f"{kind}-big.gguf"
        writer = gguf.GGUFWriter(str(path), "llama", endianess=endian)
        for key, entry in little.fields.items():
            if key.startswith("GGUF.") or key == "general.architecture":
                continue
            if entry.types[0] == gguf.GGUFValueType.ARRAY:
                if len(entry.types) > 2:  # gguf's writer takes the nested array back flat
                    continue
                writer.add_array(key, entry.contents())
            else:
                writer.add_key_value(key, entry.contents(), entry.types[0])
        for tensor in little.tensors:  # (the writer swaps each tensor's bytes itself)
            writer.add_tensor(tensor.name, np.array(tensor.data), raw_dtype=tensor.tensor_type)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    ours, theirs = read_gguf(path), gguf.GGUFReader(path)
    assert list(ours.fields) == list(theirs.fields)
    for key, entry in theirs.fields.items():
        assert ours.fields[key].contents() == entry.contents(), key
        assert ours.fields[key].types == entry.types, key
    assert ours.data_offset == theirs.data_offset
    assert len(ours.tensors) == len(theirs.tensors) > 0
    for a, b in zip(ours.tensors, theirs.tensors, strict=True):
        assert (a.name, a.tensor_type, list(a.shape)) == (b.name, b.tensor_type, list(b.shape))
        assert (a.n_elements, a.n_bytes, a.data_offset) == (b.n_elements, b.n_bytes, b.data_offset)
        assert a.data.dtype == b.data.dtype and a.data.shape == b.data.shape
        assert a.data.tobytes() == b.data.tobytes()
    if endian == gguf.GGUFEndian.BIG:  # its tokenizer reads; its weights are refused
        assert "big-endian" in _error(path) and "gguf-convert-endian" in _error(path)


def test_a_value_of_unknown_type_names_its_key(f32_file: Path, tmp_path: Path) -> None:
    data = bytearray(f32_file.read_bytes())
    key = b"llama.block_count"
    at = data.index(key) + len(key)  # the value type follows the key
    data[at : at + 4] = (99).to_bytes(4, "little")
    path = tmp_path / "corrupt.gguf"
    path.write_bytes(bytes(data))
    message = _error(path)
    assert "`llama.block_count`" in message and "unknown value type 99" in message
