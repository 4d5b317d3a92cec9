"""The DFlash block drafter: a whole block of drafts from one non-causal forward.

DFlash (block diffusion for speculative decoding, arXiv 2602.06036; SGLang 0.5.23's
``models/dflash.py`` and ``speculative/dflash_*``, vLLM's ``"dflash"``) has no embedding or
LM head of its own: it borrows the target's. Per draft:

- the target's hidden states after each of ``target_layer_ids`` (HF-style: the output of
  layer ``i``, the input of ``i + 1``, what the target's ``capture`` returns), concatenated,
  go through ``fc`` (``K * hidden -> hidden``) and ``hidden_norm``: the *context* of a
  committed token;
- every draft layer takes the context's K/V (``k_norm(k_proj(context))`` with RoPE at the
  token's position, ``v_proj(context)``; no per-layer norm of the context) into its KV
  cache, once per committed token (:meth:`DFlashDrafter.write_context`);
- a draft is one forward over ``[bonus, mask, ..., mask]`` (``num_draft_tokens`` tokens at
  the positions after the committed ones) through Qwen3-style decoder layers (pre-norm,
  ``q_norm``/``k_norm`` per head) whose queries see the whole context and the whole block,
  not causally; ``norm`` then the target's LM head give the drafts at block positions
  ``1..``; the target verifies them as a chain (:meth:`DFlashDrafter.draft`).

The draft KV cache is addressed through the target's ``req_to_token`` like the other
drafters' (same slot ids, other buffers). A block's own K/V go to the step's verify slots
(the window): the context of the accepted tokens overwrites them after verify.

Checkpoints use the public DFlash layout (z-lab's ``DFlashDraftModel``, what SGLang loads):
``config.json`` (a Qwen3-style config with ``block_size`` and ``dflash_config:
{target_layer_ids, mask_token_id}``) and safetensors holding ``fc.weight``,
``hidden_norm.weight``, ``layers.N.*`` (``self_attn.{q,k,v,o}_proj``,
``self_attn.{q,k}_norm``, ``mlp.{gate,up,down}_proj``, the two layer norms) and
``norm.weight``. Options of SGLang's variants this drafter does not implement (grouped
convolutions, a candidate selector, Domino projectors, sliding windows, attention sinks, a
causal draft) are each a clear error (:mod:`relayc.engine.draft.dflash_config`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from relayc.engine.core.config import ModelConfig
from relayc.engine.core.kv_cache import KVCache
from relayc.engine.core.layers import (
    AttendFn,
    Linear,
    LlamaMLP,
    RMSNorm,
    RopeTables,
    RotaryEmbedding,
)
from relayc.engine.core.limits import decoder_layer_shapes
from relayc.engine.decoder.head import NativeHead, native_head_library
from relayc.engine.draft.dflash_config import (
    ARCHITECTURE,
    DFlashSettings,
    default_target_layer_ids,
    read_dflash_config,
)
from relayc.engine.draft.draft_vocab import FILENAME as DRAFT_VOCAB_FILE
from relayc.engine.draft.draft_vocab import (
    DraftVocabHead,
    read_draft_vocab,
    write_draft_vocab,
)
from relayc.engine.draft.layers import TargetParts, check_head_config
from relayc.engine.draft.weights import (
    check_draft_tensors,
    init_module_random,
    load_draft_weights,
)
from relayc.engine.errors import CheckpointError
from relayc.engine.model.llama import LlamaForCausalLM

# Tensors a DFlash checkpoint may carry that are the target's (the drafter borrows them).
_TARGETS_OWN = ("embed_tokens.weight", "lm_head.weight")


class DFlashAttention(nn.Module):
    """Qwen3-style attention: per-head RMS norms on q and k before RoPE."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        c, dt = config, config.dtype
        self.num_heads, self.num_kv_heads, self.head_dim = c.num_heads, c.num_kv_heads, c.head_dim
        self.q_proj = Linear(c.hidden_size, c.num_heads * c.head_dim, dt)
        self.k_proj = Linear(c.hidden_size, c.num_kv_heads * c.head_dim, dt)
        self.v_proj = Linear(c.hidden_size, c.num_kv_heads * c.head_dim, dt)
        self.o_proj = Linear(c.num_heads * c.head_dim, c.hidden_size, dt)
        self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps, dt)
        self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps, dt)

    def key_value(self, x: torch.Tensor, rope: RopeTables) -> tuple[torch.Tensor, torch.Tensor]:
        """``(k, v)`` ``[T, kv_heads, head_dim]`` of ``x [T, hidden]`` (the context's, or a
        block's), k normed and rotated."""
        tokens = x.shape[0]
        k = self.k_norm(self.k_proj(x).view(tokens, self.num_kv_heads, self.head_dim))
        return rope.apply(k), self.v_proj(x).view(tokens, self.num_kv_heads, self.head_dim)

    def forward(
        self, x: torch.Tensor, rope: RopeTables, layer: int, attend: AttendFn
    ) -> torch.Tensor:
        tokens = x.shape[0]
        q = rope.apply(self.q_norm(self.q_proj(x).view(tokens, self.num_heads, self.head_dim)))
        k, v = self.key_value(x, rope)
        return self.o_proj(attend(layer, q, k, v).reshape(tokens, -1))


class DFlashLayer(nn.Module):
    """A pre-norm decoder layer (``input_layernorm``, attention, ``post_attention_layernorm``,
    SwiGLU MLP) with :class:`DFlashAttention`."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.self_attn = DFlashAttention(config)
        self.mlp = LlamaMLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, config.dtype)
        self.post_attention_layernorm = RMSNorm(
            config.hidden_size, config.rms_norm_eps, config.dtype
        )

    def forward(
        self, x: torch.Tensor, rope: RopeTables, layer: int, attend: AttendFn
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rope, layer, attend)
        return x + self.mlp(self.post_attention_layernorm(x))


class BlockAttend:
    """The attention of a draft block (``AttendFn``): write the block's K/V at its ``slots``,
    then every query attends ``kv_loc`` (the context's slots, then the block's) under
    ``mask``. Plain matmuls and a softmax, each with an ``out=`` form, so a recorded step
    (``graphs="tape"``) holds it; scores in float32."""

    def __init__(
        self,
        kv_cache: KVCache,
        slots: torch.Tensor,  # [B * W]
        kv_loc: torch.Tensor,  # [B * S]
        mask: torch.Tensor,  # [B, 1, 1, 1, S] float32, 0 or -inf
        batch: int,
    ) -> None:
        self.kv_cache, self.slots, self.kv_loc, self.mask, self.batch = (
            kv_cache,
            slots,
            kv_loc,
            mask,
            batch,
        )

    def __call__(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        cache = self.kv_cache
        cache.write(layer, self.slots, k, v)
        batch, (tokens, heads, dim), kv_heads = self.batch, q.shape, k.shape[1]
        width, group = tokens // batch, heads // kv_heads
        keys = cache.k[layer].index_select(0, self.kv_loc).view(batch, -1, kv_heads, dim)
        values = cache.v[layer].index_select(0, self.kv_loc).view(batch, -1, kv_heads, dim)
        # [B, Hkv, group, W, D] x [B, Hkv, 1, D, S]
        queries = q.float().view(batch, width, kv_heads, group, dim).permute(0, 2, 3, 1, 4)
        scores = torch.matmul(queries, keys.float().permute(0, 2, 3, 1)[:, :, None])
        probs = torch.softmax(scores * dim**-0.5 + self.mask, dim=-1)
        out = torch.matmul(probs, values.float().permute(0, 2, 1, 3)[:, :, None])
        return out.permute(0, 3, 1, 2, 4).reshape(tokens, heads, dim).to(q.dtype)


def dflash_tensor_shapes(config: ModelConfig, num_features: int) -> dict[str, tuple[int, ...]]:
    """The drafter's state-dict names and shapes, without building it: a Llama decoder
    layer's (``decoder_layer_shapes``) plus the per-head q/k norms."""
    hidden, head = config.hidden_size, config.head_dim
    layer = {
        **decoder_layer_shapes(config),
        "self_attn.q_norm.weight": (head,),
        "self_attn.k_norm.weight": (head,),
    }
    shapes = {"fc.weight": (hidden, num_features * hidden), "hidden_norm.weight": (hidden,)}
    for i in range(config.num_layers):
        shapes.update({f"layers.{i}.{name}": shape for name, shape in layer.items()})
    shapes["norm.weight"] = (hidden,)
    return shapes


class DFlashDrafter(nn.Module):
    """A DFlash draft model over ``target``'s embedding and LM head.

    ``config`` describes the draft layers (``hidden_size`` and ``vocab_size`` are the
    target's); ``settings`` the block size, the target layers read and the mask token.
    Weights start uninitialised: use :meth:`random` or :meth:`load`.
    """

    DRAFT_TYPE = "dflash"

    def __init__(
        self, config: ModelConfig, target: LlamaForCausalLM, settings: DFlashSettings
    ) -> None:
        super().__init__()
        check_head_config(config, target)
        settings.check_target(target.config.num_layers, target.config.vocab_size)
        self.config = config
        self.settings = settings
        self.target = TargetParts.of(target)
        # The target layers whose *inputs* hold the features (the outputs of the ids).
        self.capture = tuple(i + 1 for i in settings.target_layer_ids)
        hidden, dtype = config.hidden_size, config.dtype
        self.fc = Linear(len(self.capture) * hidden, hidden, dtype)
        self.hidden_norm = RMSNorm(hidden, config.rms_norm_eps, dtype)
        self.layers = nn.ModuleList(DFlashLayer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(hidden, config.rms_norm_eps, dtype)
        self.rotary = RotaryEmbedding(config.head_dim, config.rope_theta, config.max_position)
        self._native_head: NativeHead | None = None
        # the target tokens drafts are scored over (None: the whole vocabulary)
        self.vocab_head: DraftVocabHead | None = None
        self.to(target.device)

    def set_draft_vocab(self, tokens: torch.Tensor | None) -> None:
        """Score drafts over ``tokens`` (sorted target ids; :mod:`.draft_vocab`), or the
        whole vocabulary (None)."""
        if tokens is None:
            self.vocab_head = None
            return
        vocab = self.config.vocab_size
        if tokens.numel() == 0 or int(tokens.min()) < 0 or int(tokens.max()) >= vocab:
            raise ValueError(f"a draft vocabulary holds target ids 0..{vocab - 1}")
        self.vocab_head = DraftVocabHead(torch.unique(tokens.to(torch.int64)))  # sorted

    @property
    def draft_layers(self) -> list[DFlashLayer]:
        return cast("list[DFlashLayer]", list(self.layers))

    @property
    def block_size(self) -> int:
        return self.settings.block_size

    @property
    def mask_token_id(self) -> int:
        return self.settings.mask_token_id

    @property
    def device(self) -> torch.device:
        return self.fc.weight.device

    @classmethod
    def random(
        cls,
        target: LlamaForCausalLM,
        seed: int,
        *,
        num_layers: int = 1,
        block_size: int = 4,
        mask_token_id: int = 0,
        target_layer_ids: tuple[int, ...] | None = None,
    ) -> DFlashDrafter:
        """A seeded random drafter with the target's layer shape (tests; untrained)."""
        layers = target.config.num_layers
        # SGLang's spread repeats layers of a small target (and may name its last): each once,
        # at most the last layer another layer reads
        spread = default_target_layer_ids(layers, num_layers) if layers >= 4 else (0,)
        ids = target_layer_ids or sorted({min(i, layers - 2) for i in spread})
        settings = DFlashSettings(block_size, tuple(ids), mask_token_id)
        drafter = cls(target.config.replace(num_layers=num_layers), target, settings)
        init_module_random(drafter, seed)
        return drafter

    def save(self, directory: str | Path, dtype: torch.dtype | None = None) -> Path:
        """``config.json`` + ``model.safetensors`` in the public DFlash layout (tensors in
        ``dtype``, default their own; the loader casts them to the target's)."""
        from safetensors.torch import save_file

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        header = {
            **self.config.to_hf_config(),
            "architectures": [ARCHITECTURE],
            "block_size": self.block_size,
            "num_target_layers": self.settings.num_target_layers,
            "dflash_config": {
                "target_layer_ids": list(self.settings.target_layer_ids),
                "mask_token_id": self.mask_token_id,
            },
            "tie_word_embeddings": False,
        }
        (directory / "config.json").write_text(json.dumps(header, indent=2, sort_keys=True) + "\n")
        tensors = {
            name: tensor.detach().to("cpu", dtype or tensor.dtype).contiguous()
            for name, tensor in sorted(self.state_dict().items())
        }
        save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
        if self.vocab_head is not None:
            write_draft_vocab(directory, self.vocab_head.tokens.cpu())
        else:  # a stale one would narrow the drafter saved now
            (directory / DRAFT_VOCAB_FILE).unlink(missing_ok=True)
        return directory

    @classmethod
    def load(cls, directory: str | Path, target: LlamaForCausalLM) -> DFlashDrafter:
        """A DFlash drafter from ``directory`` for ``target``; the config's sizes are checked
        against the safetensors headers before it is built."""
        directory = Path(directory)
        config, settings = read_dflash_config(directory, target)
        files = sorted(directory.glob("*.safetensors"))
        if not files:
            raise CheckpointError(f"DFlash drafter directory {directory} has no *.safetensors file")
        num_features = len(settings.target_layer_ids)
        check_draft_tensors(
            directory,
            lambda: dflash_tensor_shapes(config, num_features),
            kind="a DFlash drafter",
            count=("num_hidden_layers", config.num_layers),
            files=files,
            ignored=_TARGETS_OWN,
        )
        tokens = read_draft_vocab(directory, target.config.vocab_size)
        drafter = cls(config, target, settings)
        load_draft_weights(drafter, directory, files=files, ignored=_TARGETS_OWN)
        drafter.set_draft_vocab(tokens)
        return drafter

    def make_kv_cache(self, size: int) -> KVCache:
        return KVCache.for_model(self.config, size, self.device)

    def rope(self, positions: torch.Tensor, dtype: torch.dtype) -> RopeTables:
        positions = positions.clamp(max=self.config.max_position - 1)
        return self.rotary.tables(positions, dtype)

    def project(self, features: torch.Tensor) -> torch.Tensor:
        """The context ``[T, hidden]`` of target features ``[T, K * hidden]``."""
        return self.hidden_norm(self.fc(features.to(self.fc.weight.dtype)))

    @torch.no_grad()
    def write_context(
        self,
        context: torch.Tensor,  # [T, hidden]
        positions: torch.Tensor,  # [T]
        slots: torch.Tensor,  # [T] draft KV slots (0: padding)
        kv_cache: KVCache,
    ) -> None:
        """Every draft layer's K/V of the committed tokens' ``context`` into ``kv_cache``."""
        rope = self.rope(positions, context.dtype)
        for i, layer in enumerate(self.draft_layers):
            k, v = layer.self_attn.key_value(context, rope)
            kv_cache.write(i, slots.long(), k, v)

    def block_hidden(
        self, input_ids: torch.Tensor, positions: torch.Tensor, attend: AttendFn
    ) -> torch.Tensor:
        """The draft layers over flat block tokens (their K/V through ``attend``):
        ``[T, hidden]`` before ``norm``."""
        x = self.target.embed_tokens(input_ids)
        rope = self.rope(positions, x.dtype)
        for i, layer in enumerate(self.draft_layers):
            x = layer(x, rope, i, attend)
        return x

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[R, vocab]`` float32 logits of pre-norm ``hidden [R, hidden]``: ``norm`` and the
        target's LM head, as the native decoder's head on the CPU (it reads a GGUF file's
        quantized head as its blocks and takes the argmax as it goes, which ``greedy_tokens``
        then reuses: the head is most of a draft's cost), else the modules. With a draft
        vocabulary the columns are its tokens' (:meth:`target_ids` maps them back)."""
        lm_head = self.target.lm_head
        if self.vocab_head is not None:
            lm_head = self.vocab_head.linear(lm_head)
        lib = native_head_library(hidden, lm_head.weight.dtype)
        if lib is not None:
            head = self._native_head = NativeHead.reuse(self._native_head, self.norm, lm_head)
            return head.logits(lib, hidden.contiguous())
        return F.linear(self.norm(hidden), lm_head.weight).float()

    def target_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """Target token ids of column indices of :meth:`draft_logits`' logits (the same ids
        without a draft vocabulary)."""
        return ids if self.vocab_head is None else self.vocab_head.target_ids(ids)

    def block_ids(self, bonus: torch.Tensor, width: int) -> torch.Tensor:
        """``[B, width]``: each bonus token then ``width - 1`` mask tokens."""
        masks = torch.full(
            (bonus.shape[0], width - 1), self.mask_token_id, dtype=torch.int64, device=bonus.device
        )
        return torch.cat([bonus.to(torch.int64)[:, None], masks], dim=1)

    @torch.no_grad()
    def draft_logits(
        self,
        bonus: torch.Tensor,  # [B] the relayed bonus tokens, at positions seq_lens
        seq_lens: torch.Tensor,  # [B] committed tokens (the context in the cache)
        req_pool_indices: torch.Tensor,
        req_to_token: torch.Tensor,
        kv_cache: KVCache,
        window: torch.Tensor,  # [B, N] KV slots of the block (the verify window)
        max_prefix_len: int,
    ) -> torch.Tensor:
        """Logits ``[B, N - 1, vocab]`` float32 (vocab: the draft vocabulary's tokens when
        there is one) of block positions ``1..N-1``: one forward
        whose queries see each request's context and its whole block. (A view of the native
        head's logits keeps the argmax it took: ``greedy_tokens`` reads it back.)"""
        batch, width = window.shape
        device = window.device
        prefix = req_to_token[req_pool_indices.long(), :max_prefix_len].long()  # [B, P]
        kv_loc = torch.cat([prefix, window.long()], dim=1)  # [B, P + W]
        see = torch.cat(
            [
                torch.arange(max_prefix_len, device=device)[None, :] < seq_lens[:, None],
                torch.ones(batch, width, dtype=torch.bool, device=device),
            ],
            dim=1,
        )  # [B, P + W]: the context, then the whole block
        mask = torch.zeros(see.shape, dtype=torch.float32, device=device)
        mask = mask.masked_fill_(~see, float("-inf"))[:, None, None, None, :]
        attend = BlockAttend(kv_cache, window.reshape(-1).long(), kv_loc.reshape(-1), mask, batch)
        positions = seq_lens[:, None] + torch.arange(width, device=device)[None, :]
        hidden = self.block_hidden(
            self.block_ids(bonus, width).reshape(-1), positions.reshape(-1), attend
        )
        rows = hidden.view(batch, width, -1)[:, 1:].reshape(batch * (width - 1), -1)
        return self.logits(rows).view(batch, width - 1, -1)

    def dense_block_hidden(
        self,
        features: torch.Tensor,  # [S, K * hidden] one sequence's target features
        input_ids: torch.Tensor,  # [S]
        anchors: torch.Tensor,  # [A] block starts: the bonus token's position
        width: int,
    ) -> torch.Tensor:
        """Training's forward (autograd on): ``[A, width, hidden]`` normed hidden states of
        the blocks starting at ``anchors``, each seeing the context of positions before its
        anchor and its whole block, no cache."""
        seq = input_ids.shape[0]
        context = self.project(features)
        ctx_rope = self.rope(torch.arange(seq, device=input_ids.device), context.dtype)
        blocks = self.block_ids(input_ids[anchors], width)  # [A, W]
        positions = anchors[:, None] + torch.arange(width, device=anchors.device)[None, :]
        cols = torch.arange(seq, device=anchors.device)
        see = torch.cat(
            [
                (cols[None, :] < anchors[:, None])[:, None, :].expand(-1, width, -1),
                torch.ones(anchors.shape[0], width, width, dtype=torch.bool, device=anchors.device),
            ],
            dim=2,
        )  # [A, W, S + W]
        mask = torch.zeros(see.shape, dtype=context.dtype, device=see.device)
        mask = mask.masked_fill(~see, float("-inf"))[:, None]
        num_blocks = anchors.shape[0]
        x = self.target.embed_tokens(blocks.reshape(-1))
        rope = self.rope(positions.reshape(-1), x.dtype)
        for layer in self.draft_layers:
            attn = layer.self_attn
            ctx_k, ctx_v = attn.key_value(context, ctx_rope)  # [S, Hkv, D]

            def attend(
                _: int,
                q: torch.Tensor,
                k: torch.Tensor,
                v: torch.Tensor,
                ctx_k: torch.Tensor = ctx_k,
                ctx_v: torch.Tensor = ctx_v,
            ) -> torch.Tensor:
                heads, kv_heads, dim = q.shape[1], k.shape[1], q.shape[2]
                block_k = k.view(num_blocks, width, kv_heads, dim)
                block_v = v.view(num_blocks, width, kv_heads, dim)
                keys = torch.cat([ctx_k.expand(num_blocks, -1, -1, -1), block_k], dim=1)
                values = torch.cat([ctx_v.expand(num_blocks, -1, -1, -1), block_v], dim=1)
                out = F.scaled_dot_product_attention(
                    q.view(num_blocks, width, heads, dim).transpose(1, 2),
                    keys.transpose(1, 2),
                    values.transpose(1, 2),
                    attn_mask=mask,
                    enable_gqa=True,
                )
                return out.transpose(1, 2).reshape(-1, heads, dim)

            x = layer(x, rope, 0, attend)
        return self.norm(x).view(num_blocks, width, -1)
