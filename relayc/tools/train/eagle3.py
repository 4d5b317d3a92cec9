"""EAGLE-3 training: the draft vocabulary, the target's teacher outputs and the
training-time-test loss, the way ``Eagle3Head.extend`` + ``draft_tree`` feed the head.

- The draft vocabulary is the ``size`` target ids most frequent in the training tokens
  (SpecForge's ``generate_vocab_mapping``), in id order; ``Eagle3Head.set_vocabulary``
  turns it into ``d2t`` / ``t2d``.
- The teacher is the frozen target's dense forward with autograd off: the inputs of the
  head's three captured layers (``forward_train(ids, capture)``), the target's log-probs
  on the draft vocabulary renormalised over it, and the target's argmax over its whole
  vocabulary (for the agreement, and for SpecForge's mask of positions whose argmax the
  draft vocabulary lacks: the head cannot draft those).
- :func:`eagle3_losses` is :func:`relayc.tools.train.losses.eagle_losses` for the EAGLE-3
  layer: pass 0 reads ``fc(features)``, passes ``1..depth-1`` the head's own ``g``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from relayc.engine.draft.eagle3 import Eagle3Head
from relayc.engine.model.llama import LlamaForCausalLM
from relayc.tools.train.losses import EAGLE_DEPTH, STEP_WEIGHTS, _shift, soft_kl, ttt_attend


def warm_start(head: Eagle3Head, target: LlamaForCausalLM) -> None:
    """Start the head's output where the target's is: ``lm_head`` = the target's LM-head
    rows of the draft vocabulary, ``norm`` = its final norm, and ``fc`` passing the last
    captured layer through (on top of its random init). A short CPU budget then trains
    the layer, not the output space. (Copying the captured target layer into the head's
    layer as well measured slightly worse after 16 steps on the toy: the head predicts one
    token further than that layer does.)"""
    hidden = target.config.hidden_size
    vocab = head.to_target_ids(torch.arange(head.draft_vocab_size, device=head.device))
    with torch.no_grad():
        head.lm_head.weight.copy_(target.lm_head.weight[vocab])
        head.norm.weight.copy_(target.model.norm.weight)
        head.fc.weight[:, -hidden:] += torch.eye(hidden, dtype=head.fc.weight.dtype)


def choose_vocabulary(counts: torch.Tensor, size: int) -> torch.Tensor:
    """The ``size`` most frequent target ids of ``counts [vocab]`` (ties: the lower id), in
    id order: draft id ``i`` stands for target id ``result[i]``."""
    order = sorted(range(counts.numel()), key=lambda i: (-int(counts[i]), i))
    return torch.tensor(sorted(order[:size]), dtype=torch.int64)


def coverage(counts: torch.Tensor, target_ids: torch.Tensor) -> float:
    """The fraction of the counted tokens the draft vocabulary ``target_ids`` holds."""
    return float(counts[target_ids].sum()) / max(float(counts.sum()), 1.0)


@dataclass
class Eagle3Teacher:
    features: torch.Tensor  # [B, S, 3 * hidden]: the captured layers' inputs
    draft_logp: torch.Tensor  # [B, S, draft_vocab] float32: renormalised over the draft vocab
    target_argmax: torch.Tensor  # [B, S] int64, over the target's whole vocabulary
    valid: torch.Tensor  # [B, S] bool: positions whose next-token distribution is trained


def draft_logp(target: LlamaForCausalLM, hidden: torch.Tensor, vocab: torch.Tensor) -> torch.Tensor:
    """The target's log-probs on the draft vocabulary ``vocab`` (target ids), renormalised
    over it, from its last hidden states ``hidden [..., hidden]`` (before the final norm)."""
    weight = target.lm_head.weight[vocab]
    logits = F.linear(target.model.norm(hidden.to(weight.dtype)), weight)
    return F.log_softmax(logits.float(), dim=-1)


@torch.no_grad()
def run_teacher(
    target: LlamaForCausalLM,
    ids: torch.Tensor,
    capture: tuple[int, ...],
    vocab: torch.Tensor,
    valid: torch.Tensor | None = None,
) -> Eagle3Teacher:
    """The teacher on a batch ``ids [B, S]`` from position 0 (every position valid unless
    ``valid [B, S]`` says otherwise)."""
    out = target.forward_train(ids, capture)
    assert out.aux_hidden_states is not None  # capture is never empty here
    logp = F.log_softmax(out.logits[..., vocab], dim=-1)
    if valid is None:
        valid = torch.ones(ids.shape, dtype=torch.bool)
    return Eagle3Teacher(out.aux_hidden_states, logp, out.logits.argmax(-1), valid)


def eagle3_losses(
    head: Eagle3Head, ids: torch.Tensor, teacher: Eagle3Teacher, depth: int = EAGLE_DEPTH
) -> tuple[list[torch.Tensor], list[float]]:
    """EAGLE-3 training-time test on ``ids [B, S]`` (target ids).

    Row ``e`` (``e = 0..S-2``) is a draft chain rooted at position ``e``. Pass 0 is draft
    extend: token ``x[e+1]`` with ``fc(features[e])`` at position ``e``; pass ``s >= 1`` is
    tree step ``s``: token ``x[e+1+s]`` with pass ``s-1``'s ``g`` at position ``e + s``,
    attending pass 0's keys at positions ``<= e`` (the draft cache) and its own chain's
    keys of passes ``1..s``. Pass ``s`` is scored against the target's renormalised
    draft-vocabulary distribution at ``e + 1 + s``, where that position is valid and the
    target's argmax lies in the draft vocabulary. Returns per-pass KL and the per-pass
    agreement of the head's argmax (as a target id) with the target's over valid positions.
    """
    batch, seq = ids.shape
    rows = seq - 1
    keys: list[torch.Tensor] = []
    values: list[torch.Tensor] = []
    base = torch.arange(rows)
    in_vocab = head.t2d[teacher.target_argmax] & teacher.valid
    features = teacher.features[:, :rows].reshape(batch * rows, -1)
    hidden = head.fc(features.to(head.fc.weight.dtype))
    losses, agree = [], []
    for s in range(depth):
        attend = ttt_attend(keys, values, batch, rows, s)

        tokens = _shift(ids, 1 + s, rows).reshape(-1)
        positions = (base + s).repeat(batch)
        g = head.midlayer(head.target.embed_tokens(tokens), hidden, positions, head.rotary, attend)
        logits = head.logits(g).view(batch, rows, -1)
        label = _shift(teacher.draft_logp, 1 + s, rows)
        losses.append(soft_kl(logits, label, _shift(in_vocab, 1 + s, rows, fill=False)))
        valid = _shift(teacher.valid, 1 + s, rows, fill=False).float()
        drafted = head.to_target_ids(logits.detach().argmax(-1))
        same = (drafted == _shift(teacher.target_argmax, 1 + s, rows)).float()
        agree.append(float((same * valid).sum() / valid.sum().clamp(min=1)))
        hidden = g
    return losses, agree


def out_of_vocab_rate(head: Eagle3Head, teacher: Eagle3Teacher) -> float:
    """How often the target's argmax (at valid positions) is outside the draft vocabulary."""
    valid = teacher.valid.float()
    missing = (~head.t2d[teacher.target_argmax]).float()
    return float((missing * valid).sum() / valid.sum().clamp(min=1))


def eagle3_eval(
    head: Eagle3Head, batches: list[tuple[torch.Tensor, Eagle3Teacher]]
) -> dict[str, Any]:
    """Held-out per-pass KL and agreement, token-weighted over ``batches``, and their
    step-weighted loss (the fields of ``loop.draft_eval``)."""
    was_training = head.training
    head.eval()
    kl_sum = [0.0] * EAGLE_DEPTH
    agree_sum = [0.0] * EAGLE_DEPTH
    weight = 0.0
    with torch.no_grad():
        for ids, teacher in batches:
            losses, agree = eagle3_losses(head, ids, teacher)
            n = float(teacher.valid.sum())
            weight += n
            for s in range(EAGLE_DEPTH):
                kl_sum[s] += float(losses[s]) * n
                agree_sum[s] += agree[s] * n
    head.train(was_training)
    kl = [x / max(weight, 1.0) for x in kl_sum]
    top1 = [x / max(weight, 1.0) for x in agree_sum]
    loss = sum(w * x for w, x in zip(STEP_WEIGHTS, kl, strict=True)) / sum(STEP_WEIGHTS)
    return {
        "loss": round(loss, 5),
        "kl_per_step": [round(x, 5) for x in kl],
        "top1_agree_per_step": [round(x, 4) for x in top1],
    }
