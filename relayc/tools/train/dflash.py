"""Training a DFlash drafter: block drafts from the target's tapped features, the published
recipe on a self-distilled corpus.

The recipe (DFlash, arXiv 2602.06036, section 4): each example is a prompt and the target's
own greedy answer; its target features (the tapped layers' outputs, one dense forward, no
cache) are computed once (:func:`relayc.tools.train.eagle3_chat.compute_features`, which
also keeps the target's argmax at every position). A step draws random *anchor* positions
in the answers; the block at anchor ``a`` is ``[token a, mask, ..., mask]`` at positions
``a..a+B-1``, its queries see the context of every position before ``a`` and the whole
block (:meth:`DFlashDrafter.dense_block_hidden`, exactly the attention the engine's draft
forward runs), and block position ``k`` is scored against the target's argmax at position
``a+k-1`` -- the token greedy verification accepts there when the drafts before it were
right (distillation from the target's choice). Later block positions matter less (a draft
counts only when all before it were accepted): their cross-entropy is weighted
``exp(-(k-1) / gamma)``.

:func:`train_dflash` is seeded and resumable: ``work/checkpoint.pt`` holds the drafter,
the optimizer, the step, the elapsed training time (the learning-rate schedule's clock)
and the generator states, saved every ``save_every`` seconds and at the end.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from relayc.engine.draft.dflash import DFlashDrafter
from relayc.engine.model.llama import LlamaForCausalLM
from relayc.tools.train.work import (
    check_fits,
    check_settings,
    load_state,
    require,
    restore_generator,
    restore_module,
    restore_optimizer,
)


@dataclass
class DFlashRecipe:
    """The sizes and schedule of a training run."""

    examples_per_step: int = 4
    anchors_per_example: int = 16
    gamma: float = 4.0  # block-position weight exp(-(k-1)/gamma)
    lr: float = 6e-4
    warmup_steps: int = 50
    minutes: float = 30.0  # the schedule's length (cosine to 10% of lr)
    max_steps: int | None = None  # a step cap (smoke runs, tests)
    save_every: float = 120.0  # seconds
    weight_decay: float = 0.01


def position_weights(width: int, gamma: float) -> torch.Tensor:
    """``[width - 1]``: the loss weight of block positions ``1..width-1``."""
    return torch.exp(-torch.arange(width - 1, dtype=torch.float32) / gamma)


def sample_anchors(
    prompt_len: int, length: int, count: int, generator: torch.Generator
) -> torch.Tensor:
    """``count`` anchors (with replacement) among the answer positions ``prompt_len ..
    length - 2`` (a bonus token the target emitted, with at least one token after it);
    empty when the answer is that short."""
    low, high = prompt_len, length - 2
    if high < low:
        return torch.empty(0, dtype=torch.int64)
    return torch.randint(low, high + 1, (count,), generator=generator)


def block_labels(
    row: dict[str, torch.Tensor], anchors: torch.Tensor, width: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(labels, valid)`` ``[A, width - 1]``: block position ``k`` of the block at anchor
    ``a`` is scored against the target's argmax at ``a + k - 1`` (its choice of token
    ``a + k``), where the example has a token ``a + k``."""
    length = row["ids"].numel()
    index = anchors[:, None] + torch.arange(width - 1)[None, :]  # a + k - 1 for k = 1..
    valid = index < length - 1
    return row["argmax"].long()[index.clamp(max=length - 1)], valid


@dataclass
class TrainVocab:
    """A training-time restriction of the LM head to ``tokens`` (sorted ids): the head is
    most of a step's cost on a large vocabulary, and a self-distilled corpus's labels use a
    small part of it. ``position`` maps a full-vocabulary id to its row in ``tokens``.
    Evaluation always scores the full vocabulary."""

    tokens: torch.Tensor  # [V'] int64, sorted
    position: torch.Tensor  # [V] int64 (-1: not kept)

    @classmethod
    def of(cls, rows: Sequence[dict[str, torch.Tensor]], vocab_size: int, size: int) -> TrainVocab:
        """Every label the rows use (the target's argmax at answer positions), then the most
        frequent other argmax tokens, up to ``size`` ids (at least the labels)."""
        counts = torch.zeros(vocab_size, dtype=torch.int64)
        labels = torch.zeros(vocab_size, dtype=torch.bool)
        for row in rows:
            argmax = row["argmax"].long()
            counts += torch.bincount(argmax, minlength=vocab_size)
            labels[argmax[int(row["prompt_len"]) :]] = True
        extra = max(size - int(labels.sum()), 0)
        rest = torch.where(labels, -1, counts)
        keep = labels.clone()
        if extra:
            keep[torch.topk(rest, min(extra, vocab_size)).indices] = True
        tokens = torch.nonzero(keep).flatten()
        position = torch.full((vocab_size,), -1, dtype=torch.int64)
        position[tokens] = torch.arange(tokens.numel())
        return cls(tokens, position)


def block_loss(
    drafter: DFlashDrafter,
    row: dict[str, torch.Tensor],
    anchors: torch.Tensor,
    weights: torch.Tensor,
    vocab: TrainVocab | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(weighted cross-entropy sum, weight sum, correct [A, W-1] bool with valid mask
    applied as -1)`` of the blocks at ``anchors`` of one example ``row``
    (``compute_features``' ids / features / argmax), over the full vocabulary or over
    ``vocab`` (a label outside it is not scored)."""
    ids = row["ids"].long()
    width = weights.numel() + 1
    hidden = drafter.dense_block_hidden(row["features"], ids, anchors, width)
    head: torch.Tensor = drafter.target.lm_head.weight
    labels, valid = block_labels(row, anchors, width)
    if vocab is not None:
        head = head[vocab.tokens]
        labels = vocab.position[labels.long()]
        valid = valid & (labels >= 0)
        labels = labels.clamp(min=0)
    logits = F.linear(hidden[:, 1:], head).float()  # [A, W-1, V]
    ce = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none")
    w = weights[None, :] * valid
    correct = torch.where(valid, (logits.argmax(-1) == labels).long(), -1)
    return (ce.view_as(w) * w).sum(), w.sum(), correct


def lr_at(recipe: DFlashRecipe, step: int, elapsed: float) -> float:
    """Warmup over ``warmup_steps``, then cosine to 10% over the time budget (or the step
    cap when one is given)."""
    if step < recipe.warmup_steps:
        return recipe.lr * (step + 1) / recipe.warmup_steps
    if recipe.max_steps is not None:
        frac = step / max(recipe.max_steps, 1)
    else:
        frac = elapsed / max(recipe.minutes * 60.0, 1e-9)
    return recipe.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))


@torch.no_grad()
def warm_start(
    drafter: DFlashDrafter,
    target: LlamaForCausalLM,
    target_layers: Sequence[int] = (),
    fc_from: dict[str, torch.Tensor] | None = None,
) -> None:
    """Start from what the target already knows instead of noise: draft layer ``i`` copies
    target layer ``target_layers[i]`` (same shapes: a DFlash layer is the target's with q/k
    norms, which start at one), the final norm copies the target's; ``fc_from`` (an EAGLE-3
    head's ``fc.weight`` and ``midlayer.hidden_norm.weight`` over the same tapped layers)
    seeds the feature fusion."""
    for layer, index in zip(drafter.draft_layers, target_layers, strict=False):
        theirs = target.model.layers[index].state_dict()
        for key, tensor in layer.state_dict().items():  # views of the parameters
            if key in theirs:
                tensor.copy_(theirs[key])
            else:  # the q/k norms the target has not
                tensor.fill_(1.0)
    if target_layers:
        drafter.norm.weight.copy_(target.model.norm.weight)
    if fc_from is not None:
        drafter.fc.weight.copy_(fc_from["fc.weight"])
        drafter.hidden_norm.weight.copy_(fc_from["midlayer.hidden_norm.weight"])


@torch.no_grad()
def agreement(
    drafter: DFlashDrafter,
    rows: Sequence[dict[str, torch.Tensor]],
    width: int,
    seed: int,
    anchors_per_example: int = 32,
) -> dict[str, Any]:
    """Held-out top-1 agreement per block position, and the expected accept length of a
    block: ``1 + sum_k P(positions 1..k all right)`` (as greedy verification counts)."""
    generator = torch.Generator().manual_seed(seed)
    weights = torch.ones(width - 1)
    prefix_hits = torch.zeros(width - 1)
    hits, counts, blocks = torch.zeros(width - 1), torch.zeros(width - 1), 0
    for row in rows:
        anchors = sample_anchors(
            int(row["prompt_len"]), row["ids"].numel(), anchors_per_example, generator
        )
        if anchors.numel() == 0:
            continue
        _, _, correct = block_loss(drafter, row, anchors, weights)
        valid = correct >= 0
        hits += (correct == 1).sum(0)
        counts += valid.sum(0)
        full = valid.all(dim=1)  # blocks whose every position has a label
        prefix = torch.cumprod((correct[full] == 1).long(), dim=1)
        prefix_hits += prefix.sum(0)
        blocks += int(full.sum())
    per_position = (hits / counts.clamp(min=1)).tolist()
    expected = 1 + (prefix_hits / max(blocks, 1)).sum().item()
    return {
        "top1_per_position": [round(x, 4) for x in per_position],
        "expected_accept_length": round(expected, 3),
        "blocks": blocks,
    }


# What ``train_dflash`` saves, each checked on resume before any of it is used.
CHECKPOINT_FIELDS: dict[str, type | tuple[type, ...]] = {
    "drafter": dict,
    "optimizer": dict,
    "generator": torch.Tensor,
    "step": int,
    "elapsed": (int, float),
    "log": dict,
}

LOG_FIELDS: dict[str, type | tuple[type, ...]] = {"losses": list, "evals": list, "invocations": int}


def drafter_settings(drafter: DFlashDrafter) -> dict[str, Any]:
    """What a checkpoint records of the drafter it holds, by the flag that sets each: the
    tapped layers and block size do not show in the weights' shapes, and a run resumed with
    others would train the saved weights on other features or blocks."""
    return {
        "--layers": drafter.config.num_layers,
        "--block-size": drafter.block_size,
        "--target-layer-ids": list(drafter.settings.target_layer_ids),
    }


def check_checkpoint(drafter: DFlashDrafter, work: Path, shape_flags: str) -> None:
    """Before any work is spent: ``CheckpointError`` unless ``work/checkpoint.pt``, when there
    is one, is a checkpoint of ``train_dflash`` for a drafter of ``drafter``'s shape and
    settings."""
    checkpoint = work / "checkpoint.pt"
    if checkpoint.is_file():
        state = load_state(checkpoint, CHECKPOINT_FIELDS)
        check_settings(state.get("settings"), drafter_settings(drafter), checkpoint)
        check_fits(drafter, state["drafter"], checkpoint, shape_flags)


def train_dflash(
    drafter: DFlashDrafter,
    train_rows: Sequence[dict[str, torch.Tensor]],
    recipe: DFlashRecipe,
    work: Path,
    *,
    seed: int,
    on_eval: Callable[[int], dict[str, Any]] | None = None,
    eval_every: float = 600.0,
    vocab: TrainVocab | None = None,
    shape_flags: str = "drafter settings",
) -> dict[str, Any]:
    """Train ``drafter`` in place on ``train_rows``; resumes from ``work/checkpoint.pt`` (read
    without unpickling code; a drafter of another shape than the checkpoint's is a
    ``CheckpointError`` telling to resume with the same ``shape_flags``). Returns the run's
    log (steps, wall time, loss curve, evaluations)."""
    work.mkdir(parents=True, exist_ok=True)
    params = [p for p in drafter.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        params, lr=recipe.lr, betas=(0.9, 0.95), weight_decay=recipe.weight_decay
    )
    generator = torch.Generator().manual_seed(seed)
    step, elapsed = 0, 0.0
    log: dict[str, Any] = {"losses": [], "evals": [], "invocations": 0}
    checkpoint = work / "checkpoint.pt"
    if checkpoint.is_file():
        state = load_state(checkpoint, CHECKPOINT_FIELDS)
        require(state["log"], LOG_FIELDS, checkpoint, "log.")
        check_settings(state.get("settings"), drafter_settings(drafter), checkpoint)
        restore_module(drafter, state["drafter"], checkpoint, shape_flags)
        restore_optimizer(optimizer, state["optimizer"], checkpoint)
        restore_generator(generator, state["generator"], checkpoint, "generator")
        step, elapsed, log = state["step"], float(state["elapsed"]), state["log"]
        print(f"resumed from {checkpoint}: step {step}, {elapsed / 60:.1f} min", flush=True)
    log["invocations"] += 1

    def save() -> None:
        state = {
            "drafter": drafter.state_dict(),
            "optimizer": optimizer.state_dict(),
            "generator": generator.get_state(),
            "step": step,
            "elapsed": elapsed,
            "log": log,
            "settings": drafter_settings(drafter),
        }
        torch.save(state, work / "checkpoint.tmp")
        (work / "checkpoint.tmp").replace(checkpoint)

    weights = position_weights(drafter.block_size, recipe.gamma)
    drafter.train()
    last_save = last_eval = time.perf_counter()
    budget = recipe.minutes * 60.0
    running, seen = 0.0, 0
    while (recipe.max_steps is None or step < recipe.max_steps) and (
        recipe.max_steps is not None or elapsed < budget
    ):
        start = time.perf_counter()
        for group in optimizer.param_groups:
            group["lr"] = lr_at(recipe, step, elapsed)
        picks = torch.randint(len(train_rows), (recipe.examples_per_step,), generator=generator)
        total, norm = torch.zeros(()), torch.zeros(())
        for i in picks.tolist():
            row = train_rows[i]
            anchors = sample_anchors(
                int(row["prompt_len"]), row["ids"].numel(), recipe.anchors_per_example, generator
            )
            if anchors.numel():
                loss_sum, w_sum, _ = block_loss(drafter, row, anchors, weights, vocab)
                total, norm = total + loss_sum, norm + w_sum
        if float(norm) > 0:
            loss = total / norm
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            running, seen = running + float(loss.detach()), seen + 1
        step += 1
        elapsed += time.perf_counter() - start
        if seen and step % 25 == 0:
            log["losses"].append([step, round(elapsed, 1), round(running / seen, 5)])
            print(
                f"[{time.strftime('%H:%M:%S')}] step {step} loss {running / seen:.4f} "
                f"lr {optimizer.param_groups[0]['lr']:.2e} ({elapsed / 60:.1f} min)",
                flush=True,
            )
            running, seen = 0.0, 0
        now = time.perf_counter()
        if on_eval is not None and now - last_eval > eval_every:
            drafter.eval()
            log["evals"].append({"step": step, **on_eval(step)})
            drafter.train()
            last_eval = time.perf_counter()
        if now - last_save > recipe.save_every:
            save()
            last_save = now
    drafter.eval()
    log["steps"], log["train_seconds"] = step, round(elapsed, 1)
    save()
    return log
