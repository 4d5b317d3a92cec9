"""Config parsing, seeded initialisation, and checkpoint save/load with its error messages."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from relayc.engine.core.config import TINY_CONFIG, ModelConfig
from relayc.engine.errors import CheckpointError
from relayc.engine.model.weights import load_checkpoint, random_model, save_checkpoint
from tests.tolerance import assert_forwards_close

SMALL = ModelConfig(vocab_size=50, hidden_size=32, intermediate_size=48, num_layers=2, head_dim=8)


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_random_init_is_seeded_and_leaves_global_rng_alone() -> None:
    state = torch.random.get_rng_state()
    a, b = random_model(SMALL, seed=3), random_model(SMALL, seed=3)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert _same_weights(a, b)
    assert not _same_weights(a, random_model(SMALL, seed=4))
    assert torch.equal(a.model.norm.weight, torch.ones(32))


def test_tiny_default_is_byte_level_gqa() -> None:
    assert TINY_CONFIG.vocab_size == 259 and TINY_CONFIG.num_kv_heads < TINY_CONFIG.num_heads
    model = random_model()
    assert model.lm_head.weight is model.model.embed_tokens.weight


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("max_shard_bytes", [None, 4096])
def test_save_load_round_trip(tmp_path: Path, tied: bool, max_shard_bytes: int | None) -> None:
    model = random_model(SMALL.replace(tie_word_embeddings=tied, rope_theta=1234.5), seed=1)
    save_checkpoint(model, tmp_path, max_shard_bytes=max_shard_bytes)
    assert (tmp_path / "model.safetensors.index.json").is_file() == (max_shard_bytes is not None)
    loaded = load_checkpoint(tmp_path)
    assert loaded.config == model.config
    assert _same_weights(loaded, model)
    ids = torch.tensor([1, 5, 7, 2])
    torch.testing.assert_close(loaded.forward_dense(ids).logits, model.forward_dense(ids).logits)


def test_load_with_dtype_override(tmp_path: Path) -> None:
    save_checkpoint(random_model(SMALL, seed=1), tmp_path)
    loaded = load_checkpoint(tmp_path, dtype=torch.bfloat16)
    assert loaded.model.embed_tokens.weight.dtype == torch.bfloat16
    assert loaded.forward_dense(torch.tensor([1, 2, 3])).logits.dtype == torch.float32


def _rewrite(directory: Path, edit) -> None:
    from safetensors.torch import load_file, save_file

    path = directory / "model.safetensors"
    tensors = load_file(str(path))
    edit(tensors)
    save_file(tensors, str(path))


def test_load_errors_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "nowhere")
    with pytest.raises(CheckpointError, match=r"no config\.json"):
        load_checkpoint(tmp_path)
    save_checkpoint(random_model(SMALL, seed=1), tmp_path)

    _rewrite(tmp_path, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(
        CheckpointError, match=r"lacks tensor `model\.layers\.1\.mlp\.up_proj\.weight`"
    ):
        load_checkpoint(tmp_path)

    def bad_shape(tensors: dict[str, torch.Tensor]) -> None:
        tensors["model.layers.1.mlp.up_proj.weight"] = torch.zeros(48, 31)

    _rewrite(tmp_path, bad_shape)
    with pytest.raises(
        CheckpointError, match=r"`model\.layers\.1\.mlp\.up_proj\.weight`.*\[48, 31\].*\[48, 32\]"
    ):
        load_checkpoint(tmp_path)

    def stray(tensors: dict[str, torch.Tensor]) -> None:
        tensors["model.layers.1.mlp.up_proj.weight"] = torch.zeros(48, 32)
        tensors["model.layers.9.mlp.up_proj.weight"] = torch.zeros(1)

    _rewrite(tmp_path, stray)
    with pytest.raises(CheckpointError, match=r"unexpected tensor `model\.layers\.9"):
        load_checkpoint(tmp_path)


def test_missing_shard_named_in_index(tmp_path: Path) -> None:
    save_checkpoint(random_model(SMALL, seed=1), tmp_path, max_shard_bytes=4096)
    shard = sorted(tmp_path.glob("model-*.safetensors"))[-1]
    shard.unlink()
    with pytest.raises(CheckpointError, match=re.escape(shard.name)):
        load_checkpoint(tmp_path)


def test_hf_config_both_rope_layouts_and_rejections() -> None:
    base = SMALL.to_hf_config()
    assert ModelConfig.from_hf_config(base) == SMALL
    nested = {k: v for k, v in base.items() if k != "rope_theta"}
    nested["rope_parameters"] = {"rope_type": "default", "rope_theta": 777.0}
    assert ModelConfig.from_hf_config(nested).rope_theta == 777.0
    no_head_dim = {k: v for k, v in base.items() if k != "head_dim"}
    assert ModelConfig.from_hf_config(no_head_dim).head_dim == 32 // 4
    with pytest.raises(ValueError, match="rope_type: llama3"):
        ModelConfig.from_hf_config({**base, "rope_scaling": {"rope_type": "llama3", "factor": 8}})
    with pytest.raises(ValueError, match="model_type"):
        ModelConfig.from_hf_config({**base, "model_type": "mistral"})
    with pytest.raises(ValueError, match="num_kv_heads"):
        SMALL.replace(num_kv_heads=3)
    assert json.loads(json.dumps(base)) == base


def test_cpu_matmul_layout_keeps_values_ties_and_outputs(tmp_path: Path) -> None:
    from relayc.engine import Engine
    from relayc.engine.core.layers import Embedding, Linear
    from relayc.engine.model.llama import use_cpu_matmul_layout

    model = random_model(TINY_CONFIG.replace(tie_word_embeddings=True), seed=3)
    ids = torch.tensor([256, 5, 9, 14, 200])
    before = model.forward_dense(ids).logits
    snapshot = {k: v.clone() for k, v in model.state_dict().items()}
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    assert use_cpu_matmul_layout(model) == len(linears)
    # Column-major; q/k/v and gate/up are column blocks of one fused weight each. The tied
    # LM head keeps the embedding's row-major layout (contiguous rows for the lookups).
    assert all(m.weight.stride(0) == 1 for m in linears if m is not model.lm_head)
    assert model.model.embed_tokens.weight.is_contiguous()
    layer = model.model.layers[0]
    qkv = layer.self_attn.qkv
    assert qkv is not None and qkv.get() is None  # autograd is on: the fused path is off
    with torch.no_grad():
        assert qkv.get() is not None
    assert layer.self_attn.k_proj.weight.data_ptr() == qkv.weight[qkv.splits[0] :].data_ptr()
    assert model.lm_head.weight is model.model.embed_tokens.weight  # still tied
    assert all(torch.equal(v, snapshot[k]) for k, v in model.state_dict().items())
    assert torch.allclose(model.forward_dense(ids).logits, before, atol=1e-5)
    use_cpu_matmul_layout(model)  # idempotent
    assert all(m.weight.stride(0) == 1 for m in linears if m is not model.lm_head)
    assert model.model.embed_tokens.weight.is_contiguous()
    assert layer.self_attn.qkv is qkv
    save_checkpoint(model, tmp_path / "m")  # saving makes the tensors contiguous again
    assert _same_weights(load_checkpoint(tmp_path / "m"), model)
    # The engine lays out the target and the draft model this way on the CPU.
    engine = Engine("random", algorithm="eagle", overlap=False)
    for module in (engine.model, *engine.algorithm.draft_modules()):
        tied = {id(m.weight) for m in module.modules() if isinstance(m, Embedding)}
        assert all(
            m.weight.stride(0) == 1
            for m in module.modules()
            if isinstance(m, Linear) and id(m.weight) not in tied
        )
    assert engine.algorithm.draft_modules()
    engine.close()


def test_fused_projections_follow_replaced_weights() -> None:
    """A weight replaced after fusing (new ``.data``) must not be shadowed by the stale
    fused copy: the layer falls back to its separate projections."""
    from relayc.engine.model.llama import use_cpu_matmul_layout

    model = random_model(TINY_CONFIG, seed=5)
    reference = random_model(TINY_CONFIG, seed=5)
    use_cpu_matmul_layout(model)
    ids = torch.tensor([256, 7, 1, 99, 3, 42])
    assert_forwards_close(
        model.forward_dense(ids).logits, reference.forward_dense(ids).logits, TINY_CONFIG
    )
    attn, mlp = model.model.layers[1].self_attn, model.model.layers[0].mlp
    with torch.no_grad():
        new_k = torch.randn(attn.k_proj.weight.shape, generator=torch.Generator().manual_seed(1))
        attn.k_proj.weight.data = new_k.clone()
        reference.model.layers[1].self_attn.k_proj.weight.copy_(new_k)
        mlp.up_proj.weight.mul_(0.5)  # in place: the fused weight sees it and stays in use
        reference.model.layers[0].mlp.up_proj.weight.mul_(0.5)
    assert attn.qkv is not None and not attn.qkv.current()
    assert mlp.gate_up is not None and mlp.gate_up.current()
    assert_forwards_close(
        model.forward_dense(ids).logits, reference.forward_dense(ids).logits, TINY_CONFIG
    )


def test_rope_tables_rotate_exactly_like_rotate_half() -> None:
    from relayc.engine.core.layers import RotaryEmbedding

    rotary = RotaryEmbedding(head_dim=24, theta=500000.0, max_position=300)
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(7, 3, 24, generator=generator)
    positions = torch.randint(0, 300, (7,), generator=generator)
    cos, sin = rotary.cos[positions][:, None], rotary.sin[positions][:, None]
    rotate_half = torch.cat([-x[..., 12:], x[..., :12]], dim=-1)
    assert torch.equal(rotary(x, positions), x * cos + rotate_half * sin)
