"""The training loop and the held-out evaluation: AdamW with decay on matrices only,
linear warmup then cosine to 10% of the peak learning rate over the step cap or the
time budget, gradient clipping, logged train and held-out curves; the target's held-out
and prompt cross-entropy and the drafters' per-step held-out KL and agreement."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from relayc.engine.errors import CheckpointError
from relayc.engine.model.llama import LlamaForCausalLM
from relayc.engine.text.bytes import BOS_ID
from relayc.tools.train.losses import STEP_WEIGHTS, TargetOut
from relayc.tools.train.work import (
    FRESH,
    check_settings,
    load_state,
    require,
    restore_generator,
    restore_module,
    restore_optimizer,
)


def make_optimizer(module: nn.Module, lr: float, weight_decay: float) -> torch.optim.AdamW:
    decay, plain = [], []
    for name, param in module.named_parameters():
        if not param.requires_grad:
            continue
        (decay if param.ndim == 2 and "embed" not in name else plain).append(param)
    groups = [
        {"params": decay, "weight_decay": weight_decay},
        {"params": plain, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8)


# What ``Checkpoint.save`` writes, each checked on load before any of it is used.
CHECKPOINT_FIELDS: dict[str, type | tuple[type, ...]] = {
    "module": dict,
    "optimizer": dict,
    "step": int,
    "elapsed_s": (int, float),
    "record": dict,
    "extra": dict,
}


@dataclass
class Checkpoint:
    """Where ``train_loop`` saves its state every ``every_s`` seconds (and at the end), so an
    interrupted run resumes: the module, the optimizer, the step, the elapsed time (the
    schedule's clock), the curves, the states of ``generators`` (the caller's data
    samplers, set back on resume) and ``settings`` (the flags a resumed run must repeat). The file is read without unpickling code
    (``relayc.tools.train.work``); ``flags`` names the options that shape the model, for the
    message when a resumed run's model does not fit the checkpoint."""

    path: Path
    every_s: float
    generators: dict[str, torch.Generator] = field(default_factory=dict)
    flags: str = "options"
    settings: dict[str, Any] = field(default_factory=dict)  # flag -> value, must match

    def load(self) -> dict[str, Any] | None:
        if not self.path.is_file():
            return None
        state = load_state(self.path, CHECKPOINT_FIELDS)
        check_settings(state.get("settings"), self.settings, self.path)
        require(state["record"], {"train": list, "heldout": list}, self.path, "record.")
        for name in self.generators:
            if name not in state["extra"]:
                raise CheckpointError(f"has no `extra.{name}` generator state; {FRESH}", self.path)
        return state

    def restore_generators(self, extra: dict[str, Any]) -> None:
        for name, generator in self.generators.items():
            restore_generator(generator, extra[name], self.path, f"extra.{name}")

    def save(self, state: dict[str, Any]) -> None:
        tmp = self.path.with_suffix(".tmp")
        extra = {name: g.get_state() for name, g in self.generators.items()}
        torch.save({**state, "extra": extra, "settings": self.settings}, tmp)
        os.replace(tmp, self.path)  # a run killed mid-save keeps the previous checkpoint


def train_loop(
    name: str,
    module: nn.Module,
    step_fn: Callable[[Any], tuple[torch.Tensor, dict[str, Any]]],
    eval_fn: Callable[[], dict[str, Any]],
    sample: Callable[[], Any],
    *,
    lr: float,
    weight_decay: float,
    budget_s: float,
    max_steps: int | None,
    warmup_frac: float,
    eval_every_s: float,
    log: dict[str, Any],
    checkpoint: Checkpoint | None = None,
) -> dict[str, Any]:
    """AdamW, linear warmup then cosine to 10% of ``lr``, over ``max_steps`` if given, else
    over the time budget; stops at whichever comes first. Logs train and held-out loss.
    With ``checkpoint``, resumes from its file when there is one and saves to it."""
    optimizer = make_optimizer(module, lr, weight_decay)
    params = [p for p in module.parameters() if p.requires_grad]
    warmup_steps = max(1, int(warmup_frac * max_steps)) if max_steps else None
    record: dict[str, Any] = {"train": [], "heldout": []}
    window: list[float] = []
    step, resumed_s = 0, 0.0
    state = checkpoint.load() if checkpoint is not None else None
    if state is not None and checkpoint is not None:
        restore_module(module, state["module"], checkpoint.path, checkpoint.flags)
        restore_optimizer(optimizer, state["optimizer"], checkpoint.path)
        step, resumed_s, record = state["step"], state["elapsed_s"], state["record"]
        checkpoint.restore_generators(state["extra"])
        print(f"[{time.strftime('%H:%M:%S')}] {name} resumed at step {step}", flush=True)
    log[name] = record
    start = time.perf_counter() - resumed_s
    last_eval = -math.inf if state is None else time.perf_counter() - start
    last_save = time.perf_counter() - start

    def save() -> None:
        if checkpoint is not None:
            checkpoint.save(
                {
                    "module": module.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "step": step,
                    "elapsed_s": time.perf_counter() - start,
                    "record": record,
                }
            )

    module.train()
    while True:
        elapsed = time.perf_counter() - start
        if step >= (max_steps or math.inf) or elapsed >= budget_s:
            break
        if checkpoint is not None and elapsed - last_save >= checkpoint.every_s:
            save()
            last_save = elapsed
        if elapsed - last_eval >= eval_every_s:
            record["heldout"].append({"step": step, "s": round(elapsed, 1), **eval_fn()})
            last_eval = time.perf_counter() - start
            _print(name, record["heldout"][-1])
        if max_steps:
            progress = step / max_steps
            warm = min(1.0, (step + 1) / warmup_steps)
        else:
            progress = elapsed / budget_s
            warm = min(1.0, progress / warmup_frac) if warmup_frac else 1.0
            warm = max(warm, 1e-3)
        scale = warm * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))
        for group in optimizer.param_groups:
            group["lr"] = lr * scale
        loss, metrics = step_fn(sample())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        step += 1
        window.append(float(loss.detach()))
        if len(window) == 10 or step == 1:
            entry = {
                "step": step,
                "s": round(time.perf_counter() - start, 1),
                "loss": round(sum(window) / len(window), 5),
                "lr": lr * scale,
                "grad_norm": round(float(grad_norm), 4),
                **metrics,
            }
            record["train"].append(entry)
            window = []
            if len(record["train"]) % 10 == 0:
                print(f"[{time.strftime('%H:%M:%S')}] {name} train {entry}", flush=True)
    save()
    elapsed = time.perf_counter() - start
    record["heldout"].append({"step": step, "s": round(elapsed, 1), **eval_fn()})
    _print(name, record["heldout"][-1])
    module.eval()
    record["steps"] = step
    record["minutes"] = round(elapsed / 60, 2)
    tail = [e["loss"] for e in record["train"][-5:]]
    record["final_train_loss"] = round(sum(tail) / max(len(tail), 1), 5)
    return record


def _print(name: str, entry: dict[str, Any]) -> None:
    shown = {k: v for k, v in entry.items() if not isinstance(v, list)}
    print(f"[{time.strftime('%H:%M:%S')}] {name} heldout {shown}", flush=True)


# -- evaluation --------------------------------------------------------------------------------
@torch.no_grad()
def target_heldout_loss(target: LlamaForCausalLM, windows: torch.Tensor, chunk: int = 16) -> float:
    """Mean next-byte cross-entropy (nats) over the held-out windows, the <bos> step excluded."""
    total, count = 0.0, 0
    for i in range(0, windows.shape[0], chunk):
        ids = windows[i : i + chunk]
        logits = target.forward_train(ids).logits[:, 1:-1]
        labels = ids[:, 2:]
        total += float(
            F.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="sum"
            )
        )
        count += labels.numel()
    return total / count


@torch.no_grad()
def prompt_loss(target: LlamaForCausalLM, prompts: list[str]) -> float:
    """Mean per-byte cross-entropy (nats) of the prompts' bytes after the first, <bos>-prefixed."""
    total, count = 0.0, 0
    for text in prompts:
        ids = torch.tensor([BOS_ID, *text.encode("utf-8")])
        logits = target.forward_dense(ids).logits[1:-1]
        total += float(F.cross_entropy(logits, ids[2:], reduction="sum"))
        count += ids.numel() - 2
    return total / count


def draft_eval(
    loss_fn: Callable[..., tuple[list[torch.Tensor], list[float]]],
    module: nn.Module,
    windows: torch.Tensor,
    teachers: list[TargetOut],
    chunk: int,
) -> dict[str, Any]:
    was_training = module.training
    module.eval()
    per_step: list[list[float]] = []
    per_agree: list[list[float]] = []
    with torch.no_grad():
        for i, teacher in enumerate(teachers):
            losses, agree = loss_fn(module, windows[i * chunk : (i + 1) * chunk], teacher)
            per_step.append([float(x) for x in losses])
            per_agree.append(agree)
    module.train(was_training)
    kl = [sum(col) / len(col) for col in zip(*per_step, strict=True)]
    top1 = [sum(col) / len(col) for col in zip(*per_agree, strict=True)]
    loss = sum(w * x for w, x in zip(STEP_WEIGHTS, kl, strict=False)) / sum(STEP_WEIGHTS[: len(kl)])
    return {
        "loss": round(loss, 5),
        "kl_per_step": [round(x, 5) for x in kl],
        "top1_agree_per_step": [round(x, 4) for x in top1],
    }
