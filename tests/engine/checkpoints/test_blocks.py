"""A GGUF file's Q4_0 / Q4_1 / Q8_0 matrices read as blocks by the native decoder: kept on
the parameters they load into, laid out as quants.c reads them, and a forward over them
gives the same bits as the float32 forward over the dequantized weights -- until a weight
changes, after which it runs the current weights."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from relayc.engine.checkpoints.gguf import load_gguf_model, open_gguf, save_gguf
from relayc.engine.core.config import ModelConfig
from relayc.engine.decoder.packing import _pack
from relayc.engine.model.llama import LlamaForCausalLM, use_cpu_matmul_layout
from relayc.engine.model.weights import random_model
from relayc.engine.native.blocks import (
    BLOCK_TYPES,
    BLOCKS_I8F,
    BLOCKS_Q4,
    BLOCKS_Q4F,
    PANEL_BYTES,
    BlockWeight,
    attach,
    blocks_of,
    exact_word_blocks,
    forget_blocks,
    random_blocks,
)
from relayc.engine.native.library import native_decoder
from tests.engine.checkpoints.test_gguf import _write_raw
from tests.engine.test_cpu_decoder import _session

# Every matrix width a whole number of 32-weight blocks.
CONFIG = ModelConfig(
    hidden_size=256, intermediate_size=512, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=64
)
KINDS = ["Q4_0", "Q4_1", "Q8_0", "Q5_0", "Q5_1"]  # the types the `gguf` package can write


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    model = random_model(CONFIG, seed=3)
    folder = tmp_path_factory.mktemp("blocks")
    return {kind: save_gguf(model, folder / f"{kind}.gguf", tensor_type=kind) for kind in KINDS}


def _load(path: Path, dtype: torch.dtype | None = None) -> LlamaForCausalLM:
    return load_gguf_model(open_gguf(path), dtype=dtype)


def _matrices(model: LlamaForCausalLM) -> dict[str, torch.Tensor]:
    return {
        name: param
        for name, param in model.named_parameters()
        if param.dim() == 2  # every Linear and the (tied) embedding
    }


@pytest.mark.parametrize("kind", KINDS)
def test_every_matrix_keeps_its_blocks(files: dict[str, Path], kind: str) -> None:
    model = _load(files[kind])
    matrices = _matrices(model)
    assert len(matrices) == 1 + CONFIG.num_layers * 7  # the tied head is the embedding
    for name, weight in matrices.items():
        blocks = blocks_of(weight)
        assert blocks is not None, name
        assert blocks.qtype == kind
        assert torch.equal(blocks.dequantize(), weight.detach())  # the file's values exactly
    # re-laid out in memory for the CPU (column-major, fused q/k/v): the values, so the
    # blocks, are unchanged
    use_cpu_matmul_layout(model)
    assert all(blocks_of(w) is not None for w in _matrices(model).values())


def test_a_bfloat16_model_has_no_blocks(files: dict[str, Path]) -> None:
    model = _load(files["Q4_1"], dtype=torch.bfloat16)
    assert all(blocks_of(w) is None for w in _matrices(model).values())


@pytest.mark.parametrize("kind", KINDS)
def test_native_forward_over_blocks_is_bit_identical_to_float32(
    files: dict[str, Path], kind: str
) -> None:
    """Prefill, chunked prefill, decodes and a tree verify: the same logits, bit for bit, as
    the same model reading float32 panels."""
    assert native_decoder() is not None, "the native decoder should build here"
    blocks, dense = _load(files[kind]), _load(files[kind])
    assert forget_blocks(dense) == len(_matrices(dense))
    use_cpu_matmul_layout(blocks)
    use_cpu_matmul_layout(dense)
    got, expected = _session(blocks), _session(dense)
    assert blocks.scripted is not None and blocks.scripted._native is not None
    assert dense.scripted is not None and dense.scripted._native is not None
    assert set(blocks.scripted._native.formats) == {BLOCK_TYPES[kind][2]}
    assert set(dense.scripted._native.formats) == {0}
    assert blocks._native_head is not None and blocks._native_head.format != 0
    for a, b in zip(got, expected, strict=True):
        assert torch.equal(a, b)


def test_an_edited_weight_runs_its_new_values(files: dict[str, Path]) -> None:
    blocks, dense = _load(files["Q4_1"]), _load(files["Q4_1"])
    forget_blocks(dense)
    use_cpu_matmul_layout(blocks)
    use_cpu_matmul_layout(dense)
    _session(blocks)
    with torch.no_grad():
        for model in (blocks, dense):
            model.model.layers[1].self_attn.k_proj.weight.mul_(1.5)  # a view of fused q/k/v
            model.lm_head.weight.add_(0.01)
    assert blocks_of(blocks.model.layers[1].self_attn.k_proj.weight) is None
    assert blocks_of(blocks.model.layers[0].self_attn.k_proj.weight) is not None
    got, expected = _session(blocks), _session(dense)
    assert blocks.scripted is not None and blocks.scripted._native is not None
    # the stale matrix (layer 1's q/k/v) reads float32 panels, every other one its blocks
    assert blocks.scripted._native.formats == [BLOCKS_Q4] * 4 + [0] + [BLOCKS_Q4] * 3
    for a, b in zip(got, expected, strict=True):
        assert torch.equal(a, b)


def _q4_1(d: torch.Tensor, m: torch.Tensor, q: torch.Tensor) -> BlockWeight:
    """Q4_1 blocks of ``q [rows, cols]`` (0..15) with per-block ``d``, ``m [rows, cols / 32]``,
    in GGUF's byte order (q[j] low nibble, q[j + 16] high)."""
    rows, cols = q.shape
    blocks = q.reshape(rows, cols // 32, 32).to(torch.uint8)
    nibbles = blocks[..., :16] | (blocks[..., 16:] << 4)
    halves = torch.stack([d.half(), m.half()], dim=-1).contiguous().view(torch.uint8)
    data = torch.cat([halves, nibbles], dim=-1).reshape(rows, -1).contiguous()
    return BlockWeight("Q4_1", data, cols)


def test_panel_layout() -> None:
    """quants.c's Q4 panel: d[16], m[16] as float16, then byte (r, c) = column c's
    q[2r] | q[2r + 1] << 4; panels of 16 rows (the matrix's rows: output columns)."""
    rows, cols = 20, 64  # two panels (the second padded with zero rows), two blocks
    q = (torch.arange(rows)[:, None] * 3 + torch.arange(cols)[None]) % 16
    d = torch.arange(1, rows * 2 + 1, dtype=torch.float32).reshape(rows, 2) / 8
    m = -torch.arange(rows * 2, dtype=torch.float32).reshape(rows, 2) / 4
    weight = _q4_1(d, m, q)
    expected = d.repeat_interleave(32, dim=1) * q.float() + m.repeat_interleave(32, dim=1)
    assert torch.equal(weight.dequantize(), expected)
    panels = weight.panels()
    assert panels.numel() == 2 * 2 * PANEL_BYTES[weight.format]
    for p in range(2):
        for b in range(2):
            start = (p * 2 + b) * 320
            chunk = panels[start : start + 320]
            got_d = chunk[:32].view(torch.float16).float()
            got_m = chunk[32:64].view(torch.float16).float()
            body = chunk[64:].reshape(16, 16).long()
            for c in range(16):
                row = p * 16 + c
                if row >= rows:  # padding: zero weights
                    assert got_d[c] == 0 and got_m[c] == 0 and int(body[:, c].sum()) == 0
                    continue
                assert got_d[c] == d[row, b] and got_m[c] == m[row, b]
                k = b * 32 + 2 * torch.arange(16)
                assert torch.equal(body[:, c] & 15, q[row, k])
                assert torch.equal(body[:, c] >> 4, q[row, k + 1])


def test_stacks_keep_a_shared_format_else_take_the_8_bit_one() -> None:
    q = torch.randint(0, 16, (16, 32), generator=torch.Generator().manual_seed(0))
    d = torch.full((16, 1), 0.25)
    q4_1 = _q4_1(d, -d, q)
    nibbles = q.to(torch.uint8)[:, :16] | (q.to(torch.uint8)[:, 16:] << 4)
    q4_0 = BlockWeight("Q4_0", torch.cat([d.half().view(torch.uint8), nibbles], dim=1), 32)
    assert torch.equal(q4_0.dequantize(), 0.25 * (q.float() - 8))
    stacked = BlockWeight.cat([q4_1, q4_0])  # Q4_0 is Q4_1 with m = -8d: one format
    assert stacked is not None and stacked.format == BLOCKS_Q4
    assert torch.equal(stacked.dequantize(), torch.cat([q4_1.dequantize(), q4_0.dequantize()]))
    assert torch.equal(stacked.panels(), torch.cat([q4_1.panels(), q4_0.panels()]))
    q8 = BlockWeight("Q8_0", torch.zeros(16, 34, dtype=torch.uint8), 32)
    mixed = BlockWeight.cat([q4_1, q8])
    assert mixed is not None and mixed.format == BLOCKS_I8F
    assert mixed.panels().numel() == 2 * PANEL_BYTES[BLOCKS_I8F]
    odd = BlockWeight("Q8_0", torch.zeros(8, 34, dtype=torch.uint8), 32)
    assert BlockWeight.cat([odd, q8]) is None  # a part would end mid-panel
    assert BlockWeight.cat([q8, odd]) is not None  # the last part may


def test_blocks_that_do_not_fit_are_refused() -> None:
    q = torch.zeros(16, 32, dtype=torch.long)
    weight = _q4_1(torch.full((16, 1), float("inf")), torch.zeros(16, 1), q)
    param = torch.nn.Parameter(weight.dequantize())
    attach(param, weight)
    assert blocks_of(param) is None  # quants.c's float16 conversion takes finite scales
    # infinite weights equal to the parameter's (inf * 1 + 0): refused all the same
    infinite = _q4_1(torch.full((16, 1), float("inf")), torch.zeros(16, 1), q + 1)
    param = torch.nn.Parameter(infinite.dequantize())
    assert torch.isinf(param).all()
    attach(param, infinite)
    assert blocks_of(param) is None
    with pytest.raises(ValueError, match="cannot back"):
        attach(torch.nn.Parameter(torch.zeros(16, 64)), weight)
    with pytest.raises(ValueError, match="whole blocks of 32 columns, not 48"):
        BlockWeight("Q4_1", torch.zeros(16, 20, dtype=torch.uint8), 48)
    with pytest.raises(ValueError, match=r"are \[rows, 40\] uint8, got \[16, 20\]"):
        BlockWeight("Q4_1", torch.zeros(16, 20, dtype=torch.uint8), 64)


def _k_quant(kind: str, rows: int, cols: int, seed: int, scale: float) -> tuple[np.ndarray, int]:
    """Random ``kind`` blocks as ``_write_raw`` takes them: (bytes, type)."""
    data = random_blocks(kind, rows, cols, seed, scale).data.numpy()
    return data, gguf.GGMLQuantizationType[kind]


def test_k_quant_matrices_mixed_with_each_other_and_float32(tmp_path: Path) -> None:
    """A Q4_K_M-like file: most matrices Q4_K, some Q6_K (layer 0's v, layer 1's down, the
    tied embedding and LM head), one Q5_K (layer 1's gate), one float32 (layer 1's v). Each matrix reads its blocks -- a stack of Q4_K and Q6_K parts in
    the 8-bit format, q/k/v only when all three have blocks -- and the forward is
    bit-identical to float32 panels throughout."""
    model = random_model(CONFIG, seed=4)
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    raw = {}
    for layer in range(CONFIG.num_layers):
        for gguf_name, name in (
            ("attn_q", "self_attn.q_proj"),
            ("attn_k", "self_attn.k_proj"),
            ("attn_v", "self_attn.v_proj"),
            ("attn_output", "self_attn.o_proj"),
            ("ffn_gate", "mlp.gate_proj"),
            ("ffn_up", "mlp.up_proj"),
            ("ffn_down", "mlp.down_proj"),
        ):
            if (layer, gguf_name) == (1, "attn_v"):
                continue  # stays float32
            rows, cols = shapes[f"model.layers.{layer}.{name}.weight"]
            # small float16 scales keep the random weights' forward finite
            if (layer, gguf_name) in ((0, "attn_v"), (1, "ffn_down")):
                entry = _k_quant("Q6_K", rows, cols, len(raw), 2**-14)
            elif (layer, gguf_name) == (1, "ffn_gate"):
                entry = _k_quant("Q5_K", rows, cols, len(raw), 2**-13)
            else:
                entry = _k_quant("Q4_K", rows, cols, len(raw), 2**-12)
            raw[f"blk.{layer}.{gguf_name}.weight"] = entry
    vocab, hidden = shapes["model.embed_tokens.weight"]  # the tied head: Q6_K, as Q4_K_M's
    raw["token_embd.weight"] = _k_quant("Q6_K", vocab, hidden, 99, 2**-14)
    path = tmp_path / "q4_k.gguf"
    _write_raw(path, model, raw)
    blocks, dense = _load(path), _load(path)
    q = blocks.model.layers[0].self_attn.q_proj.weight
    found = blocks_of(q)  # the parse of the super-blocks equals gguf's dequantize exactly
    assert found is not None and found.qtype == "Q4_K"
    found = blocks_of(blocks.model.layers[0].self_attn.v_proj.weight)
    assert found is not None and found.qtype == "Q6_K"
    assert blocks_of(blocks.model.layers[1].self_attn.v_proj.weight) is None
    forget_blocks(dense)
    use_cpu_matmul_layout(blocks)
    use_cpu_matmul_layout(dense)
    got, expected = _session(blocks), _session(dense)
    assert blocks.scripted is not None and blocks.scripted._native is not None
    # layer 0: q/k/v mixed (the 8-bit format), o, gate/up and down Q4_K; layer 1: q/k/v
    # float32, o Q4_K, gate/up mixed (Q5_K gate) and down Q6_K (the 8-bit format)
    assert blocks.scripted._native.formats == [
        *(BLOCKS_I8F, BLOCKS_Q4F, BLOCKS_Q4F, BLOCKS_Q4F),
        *(0, BLOCKS_Q4F, BLOCKS_I8F, BLOCKS_I8F),
    ]
    found = blocks_of(blocks.model.layers[1].mlp.gate_proj.weight)
    assert found is not None and found.qtype == "Q5_K"
    assert blocks._native_head is not None and blocks._native_head.format == BLOCKS_I8F
    for a, b in zip(got, expected, strict=True):
        assert torch.isfinite(a).all()
        assert torch.equal(a, b)


@pytest.mark.parametrize("word", ["BF16", "F16"])
def test_exactly_bfloat16_or_float16_weights_read_their_words(word: str) -> None:
    """A float32 model whose weights are all bfloat16 (float16) numbers -- a checkpoint
    stored at that precision, loaded as float32 -- runs over their two-byte words, with the
    same bits as over float32 panels (prefill, chunked prefill, decodes, tree verify)."""
    assert native_decoder() is not None, "the native decoder should build here"
    dtype = torch.bfloat16 if word == "BF16" else torch.float16

    def rounded() -> LlamaForCausalLM:
        model = random_model(CONFIG, seed=5)
        with torch.no_grad():
            for param in model.parameters():
                param.copy_(param.to(dtype).float())
        return model

    words, dense = rounded(), rounded()
    forget_blocks(dense)
    use_cpu_matmul_layout(words)
    use_cpu_matmul_layout(dense)
    got, expected = _session(words), _session(dense)
    format = BLOCK_TYPES[word][2]
    assert words.scripted is not None and words.scripted._native is not None
    assert dense.scripted is not None and dense.scripted._native is not None
    assert set(words.scripted._native.formats) == {format}
    assert set(dense.scripted._native.formats) == {0}
    assert words._native_head is not None and words._native_head.format == format
    for a, b in zip(got, expected, strict=True):
        assert torch.equal(a, b)


def test_word_blocks_only_for_exact_finite_float32_matrices() -> None:
    weight = torch.randn(16, 64).bfloat16().float()
    blocks = exact_word_blocks(weight)
    assert blocks is not None and blocks.qtype == "BF16"
    assert torch.equal(blocks.dequantize(), weight)
    half = torch.randn(16, 64).half().float()
    half[0, :4] = torch.tensor([1.0, 3.0, 1023.0, -5.0]) * 2**-24  # float16 subnormals
    blocks = exact_word_blocks(half)
    assert blocks is not None and blocks.qtype == "F16"
    assert torch.equal(blocks.dequantize(), half)
    assert exact_word_blocks(torch.randn(16, 64)) is None  # float32 values
    assert exact_word_blocks(torch.randn(16, 48).bfloat16().float()) is None  # not 32-wide
    assert exact_word_blocks(weight.bfloat16()) is None  # bfloat16 models run their own
    weight[3, 5] = float("inf")
    assert exact_word_blocks(weight) is None
    # mixed with another format, the words fit none: the stack is float32 panels
    q8 = BlockWeight("Q8_0", torch.zeros(16, 68, dtype=torch.uint8), 64)
    assert BlockWeight.cat([q8, exact_word_blocks(half)]) is None  # type: ignore[list-item]


NATIVE_KINDS = ["Q4_0", "Q4_1", "Q8_0"]  # gguf.c reads these types' bytes itself


def _special_bytes(kind: str, rows: int, cols: int, seed: int) -> torch.Tensor:
    """Random ``kind`` bytes whose float16 scales (and Q4_1's offsets) take every kind of
    value: zeros of both signs, subnormals, the largest finite, infinities and NaN among
    ordinary ones."""
    size = BLOCK_TYPES[kind][1]
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, (rows, cols // 32, size), np.uint8)
    specials = np.array(
        [0.0, -0.0, 6e-8, -3e-5, 65504.0, -65504.0, np.inf, -np.inf, np.nan, 0.5, -1.25],
        dtype=np.float16,
    )
    for start in [0, 2] if kind == "Q4_1" else [0]:
        halves = rng.choice(specials, size=(rows, cols // 32)).astype(np.float16)
        ordinary = rng.random((rows, cols // 32)) < 0.5
        halves[ordinary] = (rng.standard_normal(ordinary.sum()) * 0.01).astype(np.float16)
        data[..., start : start + 2] = halves.view(np.uint8).reshape(rows, cols // 32, 2)
    return torch.from_numpy(data.reshape(rows, -1))


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # gguf's inf * 0
@pytest.mark.parametrize("kind", NATIVE_KINDS)
def test_native_dequantize_is_the_gguf_package_bit_for_bit(kind: str) -> None:
    if native_decoder() is None:
        pytest.skip("no native library here")
    from relayc.engine.native.blocks import dequantize_gguf

    raw = _special_bytes(kind, 48, 96, seed=len(kind))
    got = dequantize_gguf(raw, kind, 48, 96)
    assert got is not None
    want = gguf.quants.dequantize(raw.numpy(), gguf.GGMLQuantizationType[kind])
    want = torch.from_numpy(np.ascontiguousarray(want)).reshape(48, 96)
    # the same bits: signed zeros, infinities and NaN payloads included
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    assert dequantize_gguf(raw, "Q5_0", 48, 96) is None  # a type it does not read


@pytest.mark.parametrize("kind", NATIVE_KINDS)
def test_native_block_check_agrees_with_the_torch_one(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """blocks_of through gguf.c says what the torch comparison says: kept for the
    file's values (a zero of either sign, as torch.equal compares), refused for one
    changed weight and for blocks with non-finite weights -- row-major, column-major (the
    CPU GEMMs' layout, compared in place) or a block of rows of a fused column-major
    weight (q of q/k/v)."""
    if native_decoder() is None:
        pytest.skip("no native library here")
    import relayc.engine.native.library as native_module

    ordinary = BlockWeight(kind, random_blocks(kind, 32, 64, seed=5).data, 64)
    special = BlockWeight(kind, _special_bytes(kind, 32, 64, seed=7), 64)
    values = ordinary.dequantize()
    changed = values.clone()
    changed[5, 17] = torch.nextafter(changed[5, 17], torch.tensor(1e30))
    signed = values.clone()  # a zero weight (Q4_0's q = 8, Q8_0's q = 0) of the other sign
    zeros = (values == 0).nonzero()
    assert len(zeros) or kind == "Q4_1"  # Q4_1's small positive offsets make no zeros
    for at in zeros[:4]:
        signed[tuple(at)] = -signed[tuple(at)]
    cases = {
        "as loaded": (ordinary, values, True),
        "one weight changed": (ordinary, changed, False),
        "non-finite blocks": (special, special.dequantize(), False),
        "a zero's sign": (ordinary, signed, True),  # equal values to torch.equal
    }
    layouts = {
        "row-major": lambda v: v.clone(),
        "column-major": lambda v: v.t().contiguous().t(),
        "fused": lambda v: torch.cat([v, torch.ones(16, 64)]).t().contiguous().t()[:32],
    }
    params = {}
    for name, (blocks, v, _) in cases.items():
        for layout, lay_out in layouts.items():
            weight = lay_out(v)
            assert weight.is_contiguous() == (layout == "row-major")
            params[name, layout] = torch.nn.Parameter(weight)
            attach(params[name, layout], blocks)
    found = {key: blocks_of(p) is not None for key, p in params.items()}
    monkeypatch.setattr(native_module, "native_decoder", lambda: None)
    torch_found = {key: blocks_of(p) is not None for key, p in params.items()}
    assert found == torch_found
    for (name, layout), got in found.items():
        assert got == cases[name][2], (name, layout)


@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0"])
@pytest.mark.parametrize("rows", [16, 37])
def test_native_panels_are_the_torch_panels_byte_for_byte(
    kind: str, rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gguf.c lays Q4_1 and Q8_0 blocks out as panels itself: the bytes the torch
    packing makes, scales of every kind and a last panel of zero columns included."""
    if native_decoder() is None:
        pytest.skip("no native library here")
    import relayc.engine.native.library as native_module

    blocks = BlockWeight(kind, _special_bytes(kind, rows, 96, seed=rows), 96)
    got = blocks.panels()
    monkeypatch.setattr(native_module, "native_decoder", lambda: None)
    want = blocks.panels()
    assert got.dtype == want.dtype == torch.uint8
    assert torch.equal(got, want)


@pytest.mark.parametrize("kind", sorted(BLOCK_TYPES))
def test_every_row_count_and_panel_remainder_is_float32_panels_bit_for_bit(kind: str) -> None:
    """quants.c's block GEMMs take one to eight rows at a time over one to eight panels of
    16 output columns (a kernel per row count, as wide as measured fastest, and a one-panel
    kernel for the panels left over): every row count, alone and past eight (whole blocks of
    eight and a remainder), and every panel remainder gives the bits of float32 panels over
    the dequantized weights."""
    lib = native_decoder()
    assert lib is not None, "the native decoder should build here"
    cols = 256  # a whole K-quant super-block
    for panels in (1, 2, 3, 5, 7, 9, 17):
        out_features = 16 * panels
        blocks = random_blocks(kind, out_features, cols, seed=panels)
        packed, dense = blocks.panels(), _pack(blocks.dequantize())
        ones = torch.ones(cols)
        for rows in (*range(10), 15, 16, 17, 41):  # no rows at all too: nothing to write
            x = torch.randn(rows, cols, generator=torch.Generator().manual_seed(rows))
            got, want = torch.empty(rows, out_features), torch.empty(rows, out_features)
            args = (rows, cols, out_features, x.data_ptr(), ones.data_ptr(), 1e-6)
            assert (
                lib.relayc_head_blocks(*args, packed.data_ptr(), got.data_ptr(), blocks.format) == 0
            )
            assert lib.relayc_head(*args, dense.data_ptr(), want.data_ptr()) == 0
            assert torch.equal(got, want), (kind, panels, rows)
