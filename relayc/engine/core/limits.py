"""Checks a checkpoint's numbers pass before anything is sized by them.

Every format's loader (GGUF, Hugging Face folders) reads a ``ModelConfig`` from the file's
metadata, then -- before the model is built -- compares the tensors that config implies
with the file's own tensor table (:func:`check_tensor_table`), so a damaged or hostile
count (``block_count = 2**30``, ``vocab_size = 2**40``) is an error naming the key rather
than gigabytes allocated. The context length, which no tensor's shape checks, has its own
bound (``relayc.engine.core.config.MAX_CONTEXT``); the RoPE base and the RMS-norm epsilon must be finite and
positive (``relayc.engine.core.config.finite_positive``, which both loaders and
``ModelConfig`` itself call), or every logit is NaN.

The draft heads' loaders (``relayc.engine.draft``: EAGLE, EAGLE-3, MTP; a standalone draft
model is a target-style checkpoint) do the same with their own tensor names, through
:func:`check_count` and :func:`check_shapes`, which :func:`check_tensor_table` is made of.

The functions raise ``ValueError`` with the key named; the loaders add the file.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from relayc.engine.core.config import ModelConfig


def decoder_layer_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The names (within the layer) and shapes of one ``LlamaDecoderLayer`` of ``config``:
    the target's layers and the draft heads' (``relayc.engine.draft.layers``) alike."""
    hidden, heads, kv = config.hidden_size, config.num_heads, config.num_kv_heads
    head, inter = config.head_dim, config.intermediate_size
    return {
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


def tensor_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The state-dict names and shapes of the model ``config`` describes (what
    ``relayc.engine.model.weights.expected_tensors`` lists once it is built), without building
    it. Call :func:`check_tensor_table` first: this dict has ``9 * num_layers`` entries."""
    hidden = config.hidden_size
    layer = decoder_layer_shapes(config)
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (config.vocab_size, hidden)}
    for index in range(config.num_layers):
        shapes.update({f"model.layers.{index}.{name}": s for name, s in layer.items()})
    shapes["model.norm.weight"] = (hidden,)
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, hidden)
    return shapes


def check_count(count: int, key: str, table: Mapping[str, tuple[int, ...]], prefix: str) -> None:
    """``ValueError`` unless ``table`` holds tensors for the ``count`` numbered layers
    (``{prefix}0.``, ``{prefix}1.``, ...) the metadata's ``key`` says there are.

    Called before anything lists ``count`` blocks: a hostile count (``2**30``) must not cost
    time or memory in proportion to itself."""
    indices = (name[len(prefix) :].split(".")[0] for name in table if name.startswith(prefix))
    # The layers the file holds tensors of, not its largest index: one tensor named
    # `layers.99999999.x` must not let 10**8 layers' tensors be listed.
    stored = len({i for i in indices if i.isdigit()})
    if count > stored:
        raise ValueError(
            f"`{key}` is {count}, but the file holds tensors for {stored} layers "
            f"(`{prefix}N.*`); "
            "the file is damaged or incomplete"
        )


def check_shapes(
    expected: Mapping[str, tuple[int, ...]],
    table: Mapping[str, tuple[int, ...]],
    *,
    model: str,
    needs: str,
    describe: Mapping[str, str] | None = None,
    optional: Collection[str] = (),
) -> None:
    """``ValueError`` unless ``table`` (state-dict name -> shape, as the file lists them)
    holds exactly the ``expected`` tensors, each of its shape (those in ``optional`` may be
    absent). ``model`` says what the tensors are for (``a 2-layer Llama model``), ``needs``
    who sized them (``the metadata's model``); ``describe`` maps a state-dict name to the
    file's own name for it (GGUF's ``blk.0.attn_q.weight``)."""
    names = describe or {}
    for name in table:
        if name not in expected:
            raise ValueError(f"unexpected tensor `{names.get(name, name)}` for {model}")
    for name, want in expected.items():
        got = table.get(name)
        if got is None:
            if name in optional:
                continue
            missing = [n for n in expected if n not in table and n not in optional]
            more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
            raise ValueError(f"lacks tensor `{name}`{more}")
        if tuple(got) != want:
            shown = names.get(name, name)
            raise ValueError(
                f"tensor `{shown}` has shape {list(got)}, {needs} needs {list(want)}"
                + (f" (for `{name}`)" if name not in shown else "")
            )


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
    check_count(config.num_layers, layers_key, table, "model.layers.")
    check_shapes(
        tensor_shapes(config),
        table,
        model=f"a {config.num_layers}-layer Llama model",
        needs="the metadata's model",
        describe=describe,
    )
