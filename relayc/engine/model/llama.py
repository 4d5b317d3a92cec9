"""A Llama-architecture decoder in plain torch.

Module names mirror transformers' ``LlamaForCausalLM`` so a Hugging Face
``state_dict`` loads key for key (see weights.py). The constructor allocates
uninitialised weights (``torch.empty``: no global RNG draw, no init cost); use
``weights.random_model`` or ``weights.load_checkpoint`` to get a usable model.

``forward(batch)`` runs on the paged KV cache (extend / decode / verify);
``forward_dense(input_ids)`` runs one sequence with no cache at all and is the
independent path the naive reference generator uses.

Both return ``ForwardOutput.hidden_states``: the last decoder layer's output
*before* the final RMSNorm, for every new token. The post-norm states that the
original EAGLE heads were trained on are ``model.model.norm(hidden_states)``.
``forward(batch, capture=...)`` also returns the inputs of the named decoder layers
(EAGLE-3's multi-layer features, ``ForwardOutput.aux_hidden_states``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from relayc.engine.core.attention import PagedAttend, dense_causal_attention
from relayc.engine.core.config import ModelConfig
from relayc.engine.core.forward_batch import ForwardBatch, ForwardMode
from relayc.engine.core.layers import (
    AttendFn,
    Embedding,
    Linear,
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaMLP,
    LlamaModel,
    RopeTables,
    RotaryEmbedding,
    _column_major,
    batched_causal_attention,
)
from relayc.engine.core.walk import submodules
from relayc.engine.decoder.cpu_decoder import ScriptedLayers
from relayc.engine.decoder.fused_forward import FusedForward
from relayc.engine.decoder.head import NativeHead, native_head_eligible, native_head_library
from relayc.engine.native import library as native


@dataclass
class ForwardOutput:
    logits: torch.Tensor  # [R, vocab] float32; R = B for extend/decode, T for verify / all-logits
    hidden_states: torch.Tensor  # [T, hidden] pre-final-norm, every new token
    # forward(capture=[i, ...]): the input of each decoder layer i (the output of layer
    # i - 1, before any norm), concatenated in layer order: [T, len(capture) * hidden]
    aux_hidden_states: torch.Tensor | None = None


def use_cpu_matmul_layout(module: nn.Module, scripted: bool = True) -> int:
    """Lay out every ``Linear`` weight of ``module`` for CPU inference; returns how many.

    Same values, shapes and parameters (a tied embedding stays tied, the state_dict and
    checkpoints do not change). Each weight but a tied LM head's (row-major, for the
    embedding's lookups) is stored column-major (the transposed view of a contiguous
    ``[in, out]`` tensor), so the CPU GEMM reads it without transposing:
    measured on two CPU cores (all linears of the 6-layer demo target, best of 12), 4-9%
    faster for one token, 15-20% for two, 3-11% for 4-8. And the projections that read the
    same input -- q/k/v, gate/up -- become column blocks of one fused weight
    (``fuse_projections``): one GEMM instead of three or two, which for one decode token
    halves their time (the GEMMs are all per-call overhead at this size). CUDA needs
    neither; call this for CPU inference only. Idempotent.

    ``scripted`` (default) also runs each decoder stack's layers in one call: natively
    (native/csrc/ through relayc.engine.native.library) for uniform batches of at most
    ``native_max_tokens(dtype)`` tokens, else as one TorchScript function (relayc.engine.native.scripted:
    same ops, same bits); ``False`` turns that off again. The native decoder reads a packed
    copy of the weights, rebuilt when a parameter is replaced or changed in place through
    the parameter (``copy_``, ``load_state_dict``, an optimizer step: its version counter
    moves). A write through ``.data`` moves no counter: call this again after one.
    """
    count = 0
    with torch.no_grad():
        in_stacks: set[int] = set()
        for sub in module.modules():
            if isinstance(sub, LlamaAttention | LlamaMLP):
                sub.fuse_projections()
            if isinstance(sub, LlamaForCausalLM):
                stack = [
                    layer for layer in sub.model.layers if isinstance(layer, LlamaDecoderLayer)
                ]
                sub.scripted = ScriptedLayers(stack) if scripted else None
                sub._native_head = None  # repacked on the next forward
                in_stacks.update(id(layer) for layer in sub.model.layers)
        for sub in module.modules():
            # A layer outside a model's stack (a draft head's): scripted on its own.
            if isinstance(sub, LlamaDecoderLayer) and id(sub) not in in_stacks:
                sub.scripted = ScriptedLayers([sub]) if scripted else None
        # A weight an Embedding shares (a tied LM head) stays row-major: a lookup then reads
        # each token's row contiguously (column-major, SmolLM2's 4-token lookup took 20-45
        # us instead of a few), and on the CPU the LM head runs natively from its own
        # packed copy (NativeHead) except for large eager batches.
        tied = {id(m.weight) for m in module.modules() if isinstance(m, Embedding)}
        for sub in module.modules():
            if isinstance(sub, Linear):
                if id(sub.weight) in tied:
                    if not sub.weight.is_contiguous():
                        sub.weight.data = sub.weight.data.contiguous()
                elif sub.weight.stride(0) != 1:
                    sub.weight.data = _column_major(sub.weight.data)
                count += 1
    return count


def prepare_cpu_decoders(module: nn.Module) -> int:
    """Build now what the native CPU decoder would build at its first forward; returns how
    many layer stacks and LM heads it packed.

    After ``use_cpu_matmul_layout`` the native decoder packs each stack's weights and each
    LM head lazily, at the first forward that runs them -- with a GGUF file's blocks that
    includes checking every matrix's blocks against its loaded values (about 2 s for
    SmolLM2 on this machine). ``Engine`` calls this while it loads, so that cost is loading
    time, and the first request runs at the speed of the rest. The packs stay valid as long
    as the weights do (a changed weight is repacked at its next forward, as before). A no-op
    where the native library is off or cannot be built."""
    if native.native_decoder() is None:
        return 0
    count = 0
    with torch.no_grad():
        for sub in module.modules():
            scripted = getattr(sub, "scripted", None)
            if isinstance(scripted, ScriptedLayers) and scripted.args() is not None:
                count += 1
            prepare = getattr(sub, "prepare_native", None)
            if callable(prepare) and prepare():
                count += 1
    return count


@contextlib.contextmanager
def native_weights_pinned(*modules: nn.Module) -> Iterator[None]:
    """Check the native decoder's packs of ``modules``' layer stacks now, and trust them
    until the block ends (``ScriptedLayers.pinned``): change no weight inside it."""
    with contextlib.ExitStack() as stack:
        seen: set[int] = set()
        for sub in submodules(*modules):
            scripted = getattr(sub, "scripted", None)
            if isinstance(scripted, ScriptedLayers) and id(scripted) not in seen:
                seen.add(id(scripted))
                stack.enter_context(scripted.pinned())
        yield


class LlamaForCausalLM(nn.Module):
    def __init__(self, config: ModelConfig, device: torch.device | str = "cpu") -> None:
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, config.dtype)
        self.rotary = RotaryEmbedding(config.head_dim, config.rope_theta, config.max_position)
        self.to(device)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        # Set by use_cpu_matmul_layout: the decoder layers as one scripted call.
        self.scripted: ScriptedLayers | None = None
        self._native_head: NativeHead | None = None
        self._fused: FusedForward | None = None  # decodes and verifies in one native call
        # Layer segments of a captured forward, built from (and for) ``self.scripted``.
        self._segments: dict[tuple[int, int], ScriptedLayers] = {}
        self._segments_of: ScriptedLayers | None = None

    @property
    def device(self) -> torch.device:
        return self.model.embed_tokens.weight.device

    def _decoder(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attend: AttendFn,
        capture: Sequence[int] = (),
        captured: list[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """The decoder layers over ``input_ids``; with ``capture`` (ascending layer indices)
        the input of each of those layers is appended to ``captured``."""
        x = self.model.embed_tokens(input_ids)
        # float32 tables for the one-call layers (the native decoder rotates in float32);
        # the eager layers get them in x's dtype (_layers), the same values
        # tables(positions, dtype) gives.
        rope = self.rotary.tables(positions, torch.float32)
        if capture and self.scripted is not None:
            # The whole stack in one native call that copies out the captured inputs.
            assert captured is not None, "capture needs a list to append to"
            out = self.scripted(x, rope, range(len(self.model.layers)), attend, capture, captured)
            if out is not None:
                return out
        start = 0
        for stop in capture:
            x = self._layers(x, rope, start, stop, attend)
            assert captured is not None, "capture needs a list to append to"
            captured.append(x)
            start = stop
        return self._layers(x, rope, start, len(self.model.layers), attend)

    def _layers(
        self, x: torch.Tensor, rope: RopeTables, start: int, stop: int, attend: AttendFn
    ) -> torch.Tensor:
        """Decoder layers ``start..stop-1`` over ``x``: in one native / scripted call where the
        CPU layout allows (a captured forward runs its segments that way, same bits as one
        call: each layer computes alone either way), else eagerly."""
        if start == stop:
            return x
        scripted = self._scripted_segment(start, stop)
        if scripted is not None:
            out = scripted(x, rope, range(start, stop), attend)
            if out is not None:
                return out
        if x.dtype != torch.float32:
            rope = RopeTables(rope.cos.to(x.dtype), rope.sin.to(x.dtype))
        for index in range(start, stop):
            x = self.model.layers[index](x, rope, self.rotary, index, attend)
        return x

    def _scripted_segment(self, start: int, stop: int) -> ScriptedLayers | None:
        """The one-call layers ``start..stop-1``: the whole stack's, or a segment's built
        on first use (dropped when ``use_cpu_matmul_layout`` lays the model out again)."""
        if self.scripted is None or (start, stop) == (0, len(self.model.layers)):
            return self.scripted
        if self._segments_of is not self.scripted:
            self._segments, self._segments_of = {}, self.scripted
        segment = self._segments.get((start, stop))
        if segment is None:
            layers = list(self.model.layers)[start:stop]
            segment = ScriptedLayers([x for x in layers if isinstance(x, LlamaDecoderLayer)])
            self._segments[(start, stop)] = segment
        return segment

    def _logits(self, hidden: torch.Tensor, decode: bool = False) -> torch.Tensor:
        """Logits ``[..., vocab]`` float32 of ``hidden [..., hidden_size]``: ``[T, H]`` from
        the paged and dense forwards, ``[B, S, H]`` from ``forward_train``; ``decode``: the
        rows of a decode or verify forward (``native_max_tokens``)."""
        dtype = self.lm_head.weight.dtype
        if self.scripted is not None and self.model.norm.weight.dtype == dtype:
            # The native decoder's rows do not depend on the batch; the head's must not
            # either (MKL's GEMM gives a row other bits at 4+ rows than alone).
            # int8's head runs natively at any row count: know whether it is one (packed
            # once, then checked current) before asking for the library
            int8 = False
            if native_head_eligible(self.model.norm, self.lm_head):
                packed = NativeHead.reuse(self._native_head, self.model.norm, self.lm_head)
                self._native_head, int8 = packed, packed.int8
            lib = native_head_library(hidden, dtype, decode, int8)
            if lib is not None:
                head = self._native_head = NativeHead.reuse(
                    self._native_head, self.model.norm, self.lm_head
                )
                return head.logits(lib, hidden)
        return self.lm_head(self.model.norm(hidden)).float()

    def _one_call(
        self, batch: ForwardBatch, capture: Sequence[int]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None:
        """A decode or verify forward in one native call (relayc.engine.decoder.fused_forward):
        logits, hidden states and captured features, the bits of the path below; None
        where it does not run."""
        norm, lm_head = self.model.norm, self.lm_head
        if self.scripted is None or not native_head_eligible(norm, lm_head):
            return None
        head = self._native_head = NativeHead.reuse(self._native_head, norm, lm_head)
        if self._fused is None:
            self._fused = FusedForward()
        return self._fused.run(
            batch,
            capture,
            self.scripted,
            head,
            self.model.embed_tokens.weight,
            (self.rotary.cos, self.rotary.signed_sin),
        )

    def prepare_native(self) -> bool:
        """Pack the LM head for the native decoder now rather than at the first forward
        (``prepare_cpu_decoders``); False where it would not run natively."""
        if self.scripted is None or not native_head_eligible(self.model.norm, self.lm_head):
            return False
        self._native_head = NativeHead.reuse(self._native_head, self.model.norm, self.lm_head)
        return True

    @torch.no_grad()
    def forward(self, batch: ForwardBatch, capture: Sequence[int] = ()) -> ForwardOutput:
        """One step on the paged cache; logits per request (extend/decode) or per token (verify).

        ``capture``: decoder layers whose input to return too, as ``aux_hidden_states``
        (SGLang's ``layers_to_capture``: distinct, in ``0..num_layers-1``)."""
        layers = sorted(capture)
        if len(set(layers)) != len(layers) or any(
            not 0 <= i < len(self.model.layers) for i in layers
        ):
            raise ValueError(
                f"`capture` names distinct decoder layers in 0..{len(self.model.layers) - 1}; "
                f"got {list(capture)}"
            )
        if self.scripted is not None and FusedForward.takes(batch, len(self.model.layers)):
            made = self._one_call(batch, layers)
            if made is not None:
                return ForwardOutput(*made)
        captured: list[torch.Tensor] = []
        hidden = self._decoder(
            batch.input_ids, batch.positions, PagedAttend.build(batch), layers, captured
        )
        aux = torch.cat(captured, dim=-1) if captured else None
        if batch.mode is ForwardMode.EXTEND and not batch.return_all_logits:
            last = torch.cumsum(batch.extend_lens, 0) - 1
            return ForwardOutput(self._logits(hidden[last]), hidden, aux)
        decode = batch.mode is not ForwardMode.EXTEND
        return ForwardOutput(self._logits(hidden, decode), hidden, aux)

    @torch.no_grad()
    def forward_dense(self, input_ids: torch.Tensor) -> ForwardOutput:
        """One whole sequence ``[S]`` from position 0, causal, no KV cache; logits ``[S, vocab]``."""
        positions = torch.arange(input_ids.numel(), device=input_ids.device)

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return dense_causal_attention(q, k, v)

        hidden = self._decoder(input_ids, positions, attend)
        return ForwardOutput(self._logits(hidden), hidden)

    def forward_train(self, input_ids: torch.Tensor, capture: Sequence[int] = ()) -> ForwardOutput:
        """Training helper: a batch ``[B, S]`` of sequences from position 0, causal, no cache,
        with autograd; logits ``[B, S, vocab]`` float32, hidden states ``[B, S, hidden]``;
        with ``capture`` (ascending layer indices) also the inputs of those layers,
        ``aux_hidden_states [B, S, len(capture) * hidden]`` (EAGLE-3 training)."""
        batch_size, seq = input_ids.shape
        positions = torch.arange(seq, device=input_ids.device).repeat(batch_size)

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return batched_causal_attention(q, k, v, batch_size)

        captured: list[torch.Tensor] = []
        hidden = self._decoder(input_ids.reshape(-1), positions, attend, capture, captured)
        hidden = hidden.view(batch_size, seq, -1)
        aux = torch.cat(captured, dim=-1).view(batch_size, seq, -1) if captured else None
        return ForwardOutput(self._logits(hidden), hidden, aux)
