"""Distillation losses: KL(target || draft) on the frozen target's full next-token
distribution and the top-1 agreement proxy, the target's teacher outputs, and the
per-drafter losses computed exactly the way the engine feeds each drafter (EAGLE
training-time test, the multi-layer EAGLE (MTP) chain of layers, the standalone
model), combined with the per-draft-step ``STEP_WEIGHTS``."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from relayc.engine.core.layers import AttendFn, batched_causal_attention
from relayc.engine.draft.eagle import EagleHead
from relayc.engine.draft.mtp import MtpDrafter
from relayc.engine.model.llama import LlamaForCausalLM

EAGLE_DEPTH = 3  # training-time-test passes = the engine's num_steps for EAGLE
STEP_WEIGHTS = (1.0, 0.8, 0.64)  # loss weight of draft step s (later steps matter less)


def soft_kl(logits: torch.Tensor, target_logp: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Mean over ``valid`` rows of KL(target || softmax(logits)); shapes ``[..., vocab]``."""
    logq = F.log_softmax(logits.float(), dim=-1)
    kl = (target_logp.exp() * (target_logp - logq)).sum(-1)
    weight = valid.to(kl.dtype).expand_as(kl)
    return (kl * weight).sum() / weight.sum().clamp(min=1)


def agreement(logits: torch.Tensor, target_logp: torch.Tensor, valid: torch.Tensor) -> float:
    """Fraction of valid rows whose argmax equals the target's (the greedy acceptance proxy)."""
    same = (logits.argmax(-1) == target_logp.argmax(-1)).float()
    weight = valid.float().expand_as(same)
    return float((same * weight).sum() / weight.sum().clamp(min=1))


def _shift(x: torch.Tensor, by: int, length: int, fill: float | int = 0) -> torch.Tensor:
    """``x[:, by : by + length]`` along dim 1, padded with ``fill`` past the end."""
    part = x[:, by : by + length]
    missing = length - part.shape[1]
    if missing > 0:
        pad_shape = (x.shape[0], missing, *x.shape[2:])
        part = torch.cat([part, torch.full(pad_shape, fill, dtype=x.dtype)], dim=1)
    return part


@dataclass
class TargetOut:
    logp: torch.Tensor  # [B, S, vocab] float32, the target's next-token log-probs
    hidden: torch.Tensor  # [B, S, hidden], pre-final-norm (what the engine relays)


@torch.no_grad()
def ttt_attend(
    keys: list[torch.Tensor], values: list[torch.Tensor], batch: int, rows: int, step: int
) -> AttendFn:
    """The attention of pass ``step`` of the training-time test (EAGLE's and EAGLE-3's):
    pass 0 is causal over its own keys (the draft cache); pass ``s >= 1`` attends pass 0's
    keys at positions ``<= e`` and row ``e``'s own scratch keys of passes ``1..s`` (its
    ancestors). Each call appends its keys and values to ``keys`` / ``values``."""
    tril = torch.ones(rows, rows, dtype=torch.bool).tril()
    eye = torch.eye(rows, dtype=torch.bool)

    def attend(cache_layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        tokens, heads, dim = q.shape

        def split(x: torch.Tensor) -> torch.Tensor:
            return x.view(batch, rows, x.shape[1], dim).transpose(1, 2)

        keys.append(split(k))
        values.append(split(v))
        if step == 0:
            out = F.scaled_dot_product_attention(
                split(q), keys[0], values[0], is_causal=True, enable_gqa=True
            )
        else:
            mask = torch.cat([tril] + [eye] * step, dim=1)
            out = F.scaled_dot_product_attention(
                split(q),
                torch.cat(keys, dim=2),
                torch.cat(values, dim=2),
                attn_mask=mask,
                enable_gqa=True,
            )
        return out.transpose(1, 2).reshape(tokens, heads, dim)

    return attend


def run_target(target: LlamaForCausalLM, ids: torch.Tensor) -> TargetOut:
    out = target.forward_train(ids)
    return TargetOut(F.log_softmax(out.logits, dim=-1), out.hidden_states)


def eagle_losses(
    head: EagleHead, ids: torch.Tensor, teacher: TargetOut, depth: int = EAGLE_DEPTH
) -> tuple[list[torch.Tensor], list[float]]:
    """EAGLE training-time test, the way ``EagleHead.extend`` + ``draft_tree`` feed the head.

    Row ``e`` (``e = 0..S-2``) is a draft chain rooted at draft position ``e``. Pass 0 is
    draft extend: token ``x[e+1]`` with the target's hidden ``h[e]`` at position ``e``,
    predicting the target's distribution at ``e + 1`` (the token ``x[e+2]``). Pass ``s >= 1``
    is tree step ``s``: token ``x[e+1+s]`` with the head's own output ``g`` of pass ``s-1``
    at row ``e``, position ``e + s``, attending pass 0's keys at positions ``<= e`` (the
    draft cache) and its own chain's scratch keys of passes ``1..s`` (its ancestors), and
    predicting the target's distribution at ``e + 1 + s``. Returns per-pass KL and top-1
    agreement with the target.
    """
    batch, seq = ids.shape
    rows = seq - 1
    layer = head.layers[0]
    keys: list[torch.Tensor] = []
    values: list[torch.Tensor] = []
    base = torch.arange(rows)
    hidden = teacher.hidden[:, :rows].reshape(batch * rows, -1)
    losses, agree = [], []
    for s in range(depth):
        attend = ttt_attend(keys, values, batch, rows, s)

        tokens = _shift(ids, 1 + s, rows).reshape(-1)
        positions = (base + s).repeat(batch)
        g = layer(head.target.embed_tokens(tokens), hidden, positions, head.rotary, 0, attend)
        logits = head.logits(g).view(batch, rows, -1)
        label = _shift(teacher.logp, 1 + s, rows)
        valid = (base + 1 + s <= seq - 1)[None, :]
        losses.append(soft_kl(logits, label, valid))
        agree.append(agreement(logits.detach(), label, valid))
        hidden = g
    return losses, agree


def mtp_losses(
    drafter: MtpDrafter, ids: torch.Tensor, teacher: TargetOut
) -> tuple[list[torch.Tensor], list[float]]:
    """Multi-layer EAGLE, the way ``MtpDrafter._propose`` runs in draft extend: layer 0 reads
    ``x[e+1]`` and ``h[e]`` at position ``e``; layer ``k`` reads, at the same position, the
    embedding of layer ``k-1``'s argmax there and layer ``k-1``'s output hidden state, with
    causal attention over its own cache layer; it predicts the target's distribution at
    ``e + 1 + k``."""
    batch, seq = ids.shape
    rows = seq - 1
    base = torch.arange(rows)
    positions = base.repeat(batch)
    tokens = ids[:, 1:].reshape(-1)
    hidden = teacher.hidden[:, :rows].reshape(batch * rows, -1)

    def attend(cache_layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return batched_causal_attention(q, k, v, batch)

    losses, agree = [], []
    for k, layer in enumerate(drafter.layers):
        g = layer(drafter.target.embed_tokens(tokens), hidden, positions, drafter.rotary, k, attend)
        logits = drafter.target.lm_head(layer.norm(g)).float().view(batch, rows, -1)
        label = _shift(teacher.logp, 1 + k, rows)
        valid = (base + 1 + k <= seq - 1)[None, :]
        losses.append(soft_kl(logits, label, valid))
        agree.append(agreement(logits.detach(), label, valid))
        tokens = logits.detach().argmax(-1).reshape(-1)
        hidden = g
    return losses, agree


def standalone_losses(
    model: LlamaForCausalLM, ids: torch.Tensor, teacher: TargetOut
) -> tuple[list[torch.Tensor], list[float]]:
    logits = model.forward_train(ids).logits
    valid = torch.ones(1, ids.shape[1], dtype=torch.bool)
    return [soft_kl(logits, teacher.logp, valid)], [agreement(logits.detach(), teacher.logp, valid)]


def weighted(losses: list[torch.Tensor]) -> torch.Tensor:
    return sum(w * loss for w, loss in zip(STEP_WEIGHTS, losses, strict=False)) / sum(
        STEP_WEIGHTS[: len(losses)]
    )
