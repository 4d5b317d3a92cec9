"""Checks a checkpoint's numbers pass before anything is sized by them.

Every format's loader (GGUF, Hugging Face folders) reads a ``ModelConfig`` from the file's
metadata, then -- before the model is built -- compares the tensors that config implies
with the file's own tensor table (:func:`check_tensor_table`), so a damaged or hostile
count (``block_count = 2**30``, ``vocab_size = 2**40``) is an error naming the key rather
than gigabytes allocated. The context length, which no tensor's shape checks, has its own
bound (``relayc.engine.core.config.MAX_CONTEXT``); the RoPE base and the RMS-norm epsilon must be finite and
positive (``relayc.engine.core.config.finite_positive``, which both loaders and
``ModelConfig`` itself call), or every logit is NaN.

The functions raise ``ValueError`` with the key named; the loaders add the file.
"""

from __future__ import annotations

from collections.abc import Mapping

from relayc.engine.core.config import ModelConfig

# Tensors each decoder layer has (relayc.engine.core.layers.LlamaDecoderLayer).
LAYER_TENSORS = 9


def tensor_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The state-dict names and shapes of the model ``config`` describes (what
    ``relayc.engine.model.weights.expected_tensors`` lists once it is built), without building
    it. Call :func:`check_tensor_table` first: this dict has ``9 * num_layers`` entries."""
    hidden, heads, kv = config.hidden_size, config.num_heads, config.num_kv_heads
    head, inter = config.head_dim, config.intermediate_size
    layer: dict[str, tuple[int, ...]] = {
        "self_attn.q_proj.weight": (heads * head, hidden),
        "self_attn.k_proj.weight": (kv * head, hidden),
        "self_attn.v_proj.weight": (kv * head, hidden),
        "self_attn.o_proj.weight": (hidden, heads * head),
        "mlp.gate_proj.weight": (inter, hidden),
        "mlp.up_proj.weight": (inter, hidden),
        "mlp.down_proj.weight": (hidden, inter),
        "input_layernorm.weight": (hidden,),
        "post_attention_layernorm.weight": (hidden,),
    }
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (config.vocab_size, hidden)}
    for index in range(config.num_layers):
        shapes.update({f"model.layers.{index}.{name}": s for name, s in layer.items()})
    shapes["model.norm.weight"] = (hidden,)
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, hidden)
    return shapes


def check_tensor_table(
    config: ModelConfig,
    table: Mapping[str, tuple[int, ...]],
    layers_key: str,
    describe: Mapping[str, str] | None = None,
) -> None:
    """``ValueError`` unless ``table`` (state-dict name -> shape, as the file lists them)
    holds exactly the tensors ``config`` needs, each of its shape.

    ``layers_key`` names the layer count in the file's metadata; ``describe`` maps a
    state-dict name to the file's own name for it (GGUF's ``blk.0.attn_q.weight``).
    Checked before the model is built, and before ``tensor_shapes`` lists a layer count
    the table could not hold.
    """
    names = describe or {}
    indices = (name.split(".")[2] for name in table if name.startswith("model.layers."))
    stored = 1 + max((int(i) for i in indices if i.isdigit()), default=-1)
    if config.num_layers > stored:
        raise ValueError(
            f"`{layers_key}` is {config.num_layers}, but the file holds tensors for "
            f"{stored} layers; the file is damaged or incomplete"
        )
    expected = tensor_shapes(config)
    for name in table:
        if name not in expected:
            raise ValueError(
                f"unexpected tensor `{names.get(name, name)}` for a {config.num_layers}-layer "
                "Llama model"
            )
    for name, want in expected.items():
        got = table.get(name)
        if got is None:
            missing = [n for n in expected if n not in table]
            more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
            raise ValueError(f"lacks tensor `{name}`{more}")
        if tuple(got) != want:
            shown = names.get(name, name)
            raise ValueError(
                f"tensor `{shown}` has shape {list(got)}, the metadata's model needs "
                f"{list(want)}" + (f" (for `{name}`)" if shown != name else "")
            )
