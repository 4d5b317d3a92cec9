"""Target features for EAGLE-3 training on the chat corpus (relayc.tools.train.chat_corpus):
the hidden states of chosen decoder layers, the last layer's and the next-token logits.

EAGLE-3's head reads three of the target's layers, concatenated, through its ``fc``.
SGLang 0.5.23 (``LlamaForCausalLM.set_eagle3_layers_to_capture`` in
``sglang/srt/models/llama.py``) captures, by default, the residual stream entering
layers ``[2, L // 2, L - 3]`` -- the outputs of layers ``[1, L // 2 - 1, L - 4]``,
:func:`eagle3_layer_ids`: 1, 14 and 26 for SmolLM2-135M's 30 layers -- and for ids a head's
config names (``eagle_aux_hidden_state_layer_ids``) the outputs of those layers (it
captures the input of ``id + 1``). Ids here are always the layer whose output is taken.

:func:`target_features` runs the layers itself, eager and batched (sequences padded on
the right, causal attention, no cache), because ``LlamaForCausalLM.forward_dense`` returns
only the last layer's states and its one-call native path has no per-layer output. The
values are the eager forward's: equal to the engine's paged native forward up to the last
bits of bfloat16 rounding, which training does not need to match.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import torch

from relayc.engine.core.layers import LlamaDecoderLayer, batched_causal_attention
from relayc.engine.model.llama import LlamaForCausalLM
from relayc.tools.train.chat_corpus import EXAMPLES


def eagle3_layer_ids(num_layers: int) -> tuple[int, int, int]:
    """SGLang 0.5.23's default EAGLE-3 layers for a ``num_layers``-layer Llama target, as
    the layers whose outputs are taken (module docstring)."""
    if num_layers < 5:
        raise ValueError(f"EAGLE-3's default layers need a target of 5+ layers; got {num_layers}")
    return 1, num_layers // 2 - 1, num_layers - 4


@dataclass(frozen=True)
class Example:
    prompt_ids: list[int]
    answer_ids: list[int]


def read_examples(corpus: Path) -> list[Example]:
    """The examples of a corpus directory, in the order they were written; a prompt
    answered twice (a file two runs appended to, before runs took a lock) counts once, as
    the writer's resume counts it."""
    examples, seen = [], set()
    with (corpus / EXAMPLES).open() as f:
        for line in f:
            record = json.loads(line)
            if record["index"] not in seen:
                seen.add(record["index"])
                examples.append(Example(record["prompt_ids"], record["answer_ids"]))
    return examples


@dataclass
class FeatureBatch:
    input_ids: torch.Tensor  # [B, S] int64, prompt + answer, right-padded with 0
    mask: torch.Tensor  # [B, S] bool: a real token (not padding)
    answer_mask: torch.Tensor  # [B, S] bool: an answer token (what training predicts)
    aux_hidden: torch.Tensor  # [B, S, K * H] model dtype: layer_ids' outputs, concatenated
    last_hidden: torch.Tensor  # [B, S, H] model dtype: the last layer's output, pre-norm
    logits: torch.Tensor | None  # [B, S, V] float32: next-token logits (None if not asked)
    layer_ids: tuple[int, ...]


@torch.no_grad()
def target_features(
    model: LlamaForCausalLM,
    examples: Sequence[Example],
    layer_ids: Sequence[int] | None = None,
    *,
    with_logits: bool = True,
) -> FeatureBatch:
    """Features of ``examples`` as one batch; ``layer_ids`` default to
    :func:`eagle3_layer_ids`. The logits are ``B * S * V * 4`` bytes (SmolLM2: 200 KB a
    position): ask for them in batches sized for that."""
    num_layers = len(model.model.layers)
    ids = tuple(eagle3_layer_ids(num_layers) if layer_ids is None else layer_ids)
    bad = [i for i in ids if not 0 <= i < num_layers]
    if bad or not ids:
        raise ValueError(f"layer ids must be in [0, {num_layers}); got {list(ids)}")
    if not examples:
        raise ValueError("no examples")
    lengths = [len(e.prompt_ids) + len(e.answer_ids) for e in examples]
    batch, seq = len(examples), max(lengths)
    device = model.device
    input_ids = torch.zeros(batch, seq, dtype=torch.int64)
    answer_mask = torch.zeros(batch, seq, dtype=torch.bool)
    for row, example in enumerate(examples):
        tokens = example.prompt_ids + example.answer_ids
        input_ids[row, : len(tokens)] = torch.tensor(tokens)
        answer_mask[row, len(example.prompt_ids) : len(tokens)] = True
    mask = torch.arange(seq)[None, :] < torch.tensor(lengths)[:, None]
    input_ids = input_ids.to(device)

    positions = torch.arange(seq, device=device).repeat(batch)
    x = model.model.embed_tokens(input_ids.reshape(-1))
    rope = model.rotary.tables(positions, x.dtype)

    def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return batched_causal_attention(q, k, v, batch)

    captured: dict[int, torch.Tensor] = {}
    for index, layer in enumerate(cast("list[LlamaDecoderLayer]", model.model.layers)):
        # LlamaDecoderLayer.forward's eager block, run here so that a model the engine
        # laid out (its layers carrying one-layer native calls) gives the same values.
        x = x + layer.self_attn(layer.input_layernorm(x), rope, index, attend)
        x = x + layer.mlp(layer.post_attention_layernorm(x))
        if index in ids:
            captured[index] = x
    hidden_size = x.shape[-1]
    aux = torch.cat([captured[i] for i in ids], dim=-1).view(batch, seq, len(ids) * hidden_size)
    last = x.view(batch, seq, hidden_size)
    logits = model.lm_head(model.model.norm(last)).float() if with_logits else None
    return FeatureBatch(input_ids.cpu(), mask, answer_mask, aux, last, logits, ids)


def batches(examples: Sequence[Example], max_tokens: int) -> Iterator[list[Example]]:
    """``examples`` in order, grouped so that a batch's padded size (rows times its longest
    example) stays within ``max_tokens`` (one example alone may exceed it)."""
    group: list[Example] = []
    longest = 0
    for example in examples:
        size = len(example.prompt_ids) + len(example.answer_ids)
        if group and max(longest, size) * (len(group) + 1) > max_tokens:
            yield group
            group, longest = [], 0
        group.append(example)
        longest = max(longest, size)
    if group:
        yield group
