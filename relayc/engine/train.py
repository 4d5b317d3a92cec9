"""Train the tiny demo models shipped in ``relayc/assets/demo`` (issue #8), on the CPU.

    python -m relayc.engine.train --out relayc/assets/demo          # ~45 minutes, 2 threads
    python -m relayc.engine.train --out /tmp/demo --smoke           # tiny sizes, < 60 s
    python -m relayc.engine.train --out relayc/assets/demo --measure-only

1. A corpus assembled from this Python's standard library (``*.py`` under
   ``sysconfig.get_paths()["stdlib"]``, sorted, tests / idlelib / site-packages and
   generated tables excluded, capped at a fixed size), no downloads. Its SHA-256 and
   the Python version are recorded: another Python gives another corpus. Every
   ``HOLDOUT_EVERY``-th file is held out for the held-out loss and the prompts.
2. A byte-level Llama target, trained with next-byte cross-entropy.
3. By distillation from the frozen target (loss: KL(target || draft) on the target's
   full next-token distribution): the EAGLE head, the multi-layer EAGLE (MTP)
   drafter and a standalone draft model. The heads are trained exactly the way
   the engine feeds them (see ``eagle_losses`` and ``mtp_losses``).
4. Measure acceptance with the real ``Engine`` on the held-out prompts (greedy) and
   write ``MODEL_CARD.md``.

Every model stops at its time budget (``--minutes-*``) or step cap (``--steps-*``);
the learning rate follows warmup + cosine over whichever of the two is given
(the step cap when both are). Data order and initialisation are seeded, so a run
with step caps and no binding time budget is reproducible on the same Python.
Weights are stored as float16 tensors under a float32 ``config.json``: the loaders
cast them to float32, the dtype the engine runs in.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import platform
import sys
import sysconfig
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from relayc.engine.config import ModelConfig
from relayc.engine.draft.eagle import EagleHead
from relayc.engine.draft.mtp import MtpDrafter
from relayc.engine.draft.standalone import StandaloneDrafter
from relayc.engine.model import LlamaForCausalLM, batched_causal_attention
from relayc.engine.tokenizer import BOS_ID
from relayc.engine.weights import SINGLE_FILE, load_checkpoint, save_checkpoint

# Directories (any path component) left out of the corpus: tests, the IDE, third-party
# packages, demos, generated tables and bundled wheels.
CORPUS_EXCLUDE = (
    "test",
    "tests",
    "idlelib",
    "site-packages",
    "dist-packages",
    "turtledemo",
    "lib2to3",
    "ensurepip",
    "pydoc_data",
    "encodings",
    "__pycache__",
)
HOLDOUT_EVERY = 16  # file i (in sorted order) is held out when i % HOLDOUT_EVERY == HOLDOUT_AT
HOLDOUT_AT = 7
NUM_PROMPTS = 16
PROMPT_BYTES = (64, 200)
MTP_STEPS = 3
EAGLE_DEPTH = 3  # training-time-test passes = the engine's num_steps for EAGLE
STEP_WEIGHTS = (1.0, 0.8, 0.64)  # loss weight of draft step s (later steps matter less)
SUBDIRS = ("target", "eagle", "eagle_multilayer", "standalone")


# -- corpus -----------------------------------------------------------------------------------
@dataclass
class Corpus:
    train: torch.Tensor  # uint8 [N]
    heldout: torch.Tensor  # uint8 [M]
    train_line_starts: torch.Tensor  # int64, offsets just after a newline (or 0)
    heldout_line_starts: torch.Tensor
    heldout_texts: list[tuple[str, bytes]]  # (path relative to stdlib, content)
    sha256: str
    info: dict[str, Any]


def corpus_files(cap_bytes: int) -> tuple[Path, list[Path]]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(
        (
            p
            for p in root.rglob("*.py")
            if not set(p.relative_to(root).parts[:-1]) & set(CORPUS_EXCLUDE)
            and not p.relative_to(root).parts[0].startswith("config-")
        ),
        key=lambda p: p.relative_to(root).as_posix(),
    )
    chosen, total = [], 0
    for path in files:
        size = path.stat().st_size
        if total + size > cap_bytes:
            break
        chosen.append(path)
        total += size
    return root, chosen


def _line_starts(data: bytes) -> torch.Tensor:
    buf = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    starts = (buf == ord("\n")).nonzero().flatten() + 1
    return torch.cat([torch.zeros(1, dtype=torch.int64), starts[starts < len(data)]])


def assemble_corpus(cap_bytes: int) -> Corpus:
    """The standard-library corpus: files in sorted order up to ``cap_bytes``, each ending in
    a newline; every ``HOLDOUT_EVERY``-th file goes to the held-out part."""
    root, files = corpus_files(cap_bytes)
    digest = hashlib.sha256()
    train_parts, heldout_parts, heldout_texts = [], [], []
    for index, path in enumerate(files):
        rel = path.relative_to(root).as_posix()
        data = path.read_bytes()
        if not data.endswith(b"\n"):
            data += b"\n"
        digest.update(rel.encode() + b"\0" + data + b"\0")
        if index % HOLDOUT_EVERY == HOLDOUT_AT:
            heldout_parts.append(data)
            heldout_texts.append((rel, data))
        else:
            train_parts.append(data)
    train, heldout = b"".join(train_parts), b"".join(heldout_parts)
    info = {
        "source": "Python standard library *.py (sysconfig stdlib path), sorted by path",
        "stdlib": str(root),
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "exclude_dirs": list(CORPUS_EXCLUDE),
        "cap_bytes": cap_bytes,
        "files": len(files),
        "heldout_files": len(heldout_texts),
        "heldout_rule": f"file index % {HOLDOUT_EVERY} == {HOLDOUT_AT} (sorted order)",
        "train_bytes": len(train),
        "heldout_bytes": len(heldout),
        "sha256": digest.hexdigest(),
        "sha256_of": "for each file: path + NUL + bytes (newline-terminated) + NUL",
    }
    return Corpus(
        torch.frombuffer(bytearray(train), dtype=torch.uint8),
        torch.frombuffer(bytearray(heldout), dtype=torch.uint8),
        _line_starts(train),
        _line_starts(heldout),
        heldout_texts,
        digest.hexdigest(),
        info,
    )


def sample_batch(
    data: torch.Tensor, starts: torch.Tensor, batch: int, seq: int, generator: torch.Generator
) -> torch.Tensor:
    """``[batch, seq]`` windows: <bos> then ``seq - 1`` bytes from a random line start."""
    starts = starts[starts <= data.numel() - seq]
    pick = starts[torch.randint(starts.numel(), (batch,), generator=generator)]
    offsets = pick[:, None] + torch.arange(seq - 1)[None, :]
    ids = data[offsets].long()
    return torch.cat([torch.full((batch, 1), BOS_ID, dtype=torch.long), ids], dim=1)


def heldout_prompts(corpus: Corpus, seed: int, count: int = NUM_PROMPTS) -> list[dict[str, Any]]:
    """``count`` prompts of whole lines (``PROMPT_BYTES``) from the held-out files: one per file
    in a seeded order first, further rounds only when there are too few held-out files."""
    generator = torch.Generator().manual_seed(seed)
    low, high = PROMPT_BYTES
    prompts: list[dict[str, Any]] = []
    order = torch.randperm(len(corpus.heldout_texts), generator=generator).tolist()
    for _round in range(8):
        for file_index in order:
            if len(prompts) == count:
                return prompts
            rel, data = corpus.heldout_texts[file_index]
            lines = data.splitlines(keepends=True)
            if len(lines) < 4:
                continue
            first = int(torch.randint(len(lines) - 2, (1,), generator=generator))
            text = b""
            for line in lines[first:]:
                if len(text) + len(line) > high:
                    break
                text += line
            stripped = [ln for ln in text.splitlines() if ln.strip()]
            if len(text) < low or len(stripped) < 2 or text.strip().startswith((b"#", b'"""')):
                continue
            if any(p["file"] == rel and p["line"] == first + 1 for p in prompts):
                continue
            try:
                decoded = text.decode("utf-8")
            except UnicodeDecodeError:
                continue
            prompts.append({"file": rel, "line": first + 1, "bytes": len(text), "text": decoded})
    return prompts


# -- models -----------------------------------------------------------------------------------
@dataclass
class Plan:
    target: ModelConfig
    standalone: ModelConfig
    seq: int
    batch: int
    lr: float
    draft_lr: float
    minutes: dict[str, float]
    steps: dict[str, int | None]
    eval_windows: int
    eval_every_s: float
    corpus_bytes: int
    weight_decay: float = 0.1
    warmup_frac: float = 0.05


def full_plan(args: argparse.Namespace) -> Plan:
    target = ModelConfig(
        hidden_size=256,
        intermediate_size=704,
        num_layers=args.target_layers,
        num_heads=4,
        num_kv_heads=2,
        head_dim=64,
        max_position=2048,
        tie_word_embeddings=True,
    )
    standalone = ModelConfig(
        hidden_size=128,
        intermediate_size=352,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
        max_position=2048,
        tie_word_embeddings=True,
    )
    return Plan(
        target=target,
        standalone=standalone,
        seq=256,
        batch=16,
        lr=2e-3,
        draft_lr=2e-3,
        minutes=_per_model(args, "minutes"),
        steps=_per_model(args, "steps"),
        eval_windows=32,
        eval_every_s=90.0,
        corpus_bytes=args.corpus_bytes,
    )


def smoke_plan(args: argparse.Namespace) -> Plan:
    tiny = ModelConfig(
        hidden_size=32,
        intermediate_size=64,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        head_dim=16,
        max_position=512,
    )
    steps = {name: s if s is not None else 25 for name, s in _per_model(args, "steps").items()}
    return Plan(
        target=tiny,
        standalone=tiny.replace(hidden_size=16, intermediate_size=32, head_dim=8),
        seq=64,
        batch=4,
        lr=1e-2,
        draft_lr=1e-2,
        minutes={name: 0.25 for name in SUBDIRS},
        steps=steps,
        eval_windows=4,
        eval_every_s=2.0,
        corpus_bytes=min(args.corpus_bytes, 1 << 20),
    )


def _per_model(args: argparse.Namespace, kind: str) -> dict[str, Any]:
    return {name: getattr(args, f"{kind}_{name}") for name in SUBDIRS}


def init_for_training(module: nn.Module, seed: int, num_layers: int, std: float = 0.02) -> None:
    """GPT-2 style: N(0, std) matrices, residual-output projections scaled by 1/sqrt(2L),
    norms one; drawn from a private generator in parameter-name order."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(module.named_parameters()):
            if name.endswith("norm.weight"):
                param.fill_(1.0)
                continue
            scale = (
                std / math.sqrt(2 * num_layers)
                if name.endswith(("o_proj.weight", "down_proj.weight"))
                else std
            )
            param.copy_(torch.randn(param.shape, generator=generator) * scale)


def count_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def store_half(directory: Path) -> None:
    """Rewrite ``model.safetensors`` with float16 tensors (the config keeps float32)."""
    from safetensors.torch import load_file, save_file

    path = directory / SINGLE_FILE
    tensors = load_file(str(path))
    half = {k: (v.half() if v.is_floating_point() else v).contiguous() for k, v in tensors.items()}
    save_file(half, str(path), metadata={"format": "pt"})


def dir_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


# -- losses ------------------------------------------------------------------------------------
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
    tril = torch.ones(rows, rows, dtype=torch.bool).tril()
    eye = torch.eye(rows, dtype=torch.bool)
    hidden = teacher.hidden[:, :rows].reshape(batch * rows, -1)
    losses, agree = [], []
    for s in range(depth):

        def attend(
            cache_layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, s: int = s
        ) -> torch.Tensor:
            tokens, heads, dim = q.shape

            def split(x: torch.Tensor) -> torch.Tensor:
                return x.view(batch, rows, x.shape[1], dim).transpose(1, 2)

            keys.append(split(k))
            values.append(split(v))
            if s == 0:
                out = F.scaled_dot_product_attention(
                    split(q), keys[0], values[0], is_causal=True, enable_gqa=True
                )
            else:
                mask = torch.cat([tril] + [eye] * s, dim=1)
                out = F.scaled_dot_product_attention(
                    split(q),
                    torch.cat(keys, dim=2),
                    torch.cat(values, dim=2),
                    attn_mask=mask,
                    enable_gqa=True,
                )
            return out.transpose(1, 2).reshape(tokens, heads, dim)

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


# -- the training loop -------------------------------------------------------------------------
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


def train_loop(
    name: str,
    module: nn.Module,
    step_fn: Callable[[torch.Tensor], tuple[torch.Tensor, dict[str, Any]]],
    eval_fn: Callable[[], dict[str, Any]],
    sample: Callable[[], torch.Tensor],
    *,
    lr: float,
    weight_decay: float,
    budget_s: float,
    max_steps: int | None,
    warmup_frac: float,
    eval_every_s: float,
    log: dict[str, Any],
) -> dict[str, Any]:
    """AdamW, linear warmup then cosine to 10% of ``lr``, over ``max_steps`` if given, else
    over the time budget; stops at whichever comes first. Logs train and held-out loss."""
    optimizer = make_optimizer(module, lr, weight_decay)
    params = [p for p in module.parameters() if p.requires_grad]
    warmup_steps = max(1, int(warmup_frac * max_steps)) if max_steps else None
    record: dict[str, Any] = {"train": [], "heldout": []}
    log[name] = record
    start = time.perf_counter()
    last_eval = -math.inf
    window: list[float] = []
    step = 0
    module.train()
    while True:
        elapsed = time.perf_counter() - start
        if step >= (max_steps or math.inf) or elapsed >= budget_s:
            break
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


# -- offline acceptance (dense, no engine) -----------------------------------------------------
@torch.no_grad()
def simulate_chain(
    target: LlamaForCausalLM,
    propose: Callable[[list[int], torch.Tensor], list[int]],
    prompt_ids: list[int],
    new_tokens: int,
) -> list[int]:
    """Greedy chain speculative decoding with dense forwards; the accept length (accepted
    drafts + the bonus) of every verify. ``propose(seq, target_hidden)`` gets the sequence
    (ending with the bonus token, not yet verified) and the target's hidden states at every
    position but the last; it returns the drafts."""
    seq = list(prompt_ids)
    out = target.forward_dense(torch.tensor(seq))
    seq.append(int(out.logits[-1].argmax()))
    hidden = out.hidden_states
    emitted, accepts = 1, []
    while emitted < new_tokens:
        drafts = propose(seq, hidden)
        full = torch.tensor(seq + drafts)
        out = target.forward_dense(full)
        preds = out.logits[len(seq) - 1 :].argmax(-1).tolist()
        m = 0
        while m < len(drafts) and drafts[m] == preds[m]:
            m += 1
        accepted = [*drafts[:m], preds[m]]
        seq.extend(accepted)
        emitted += len(accepted)
        accepts.append(len(accepted))
        hidden = out.hidden_states[: len(seq) - 1]
    return accepts


def eagle_chain_proposer(
    head: EagleHead, steps: int
) -> Callable[[list[int], torch.Tensor], list[int]]:
    """The EAGLE head's greedy chain as extend + ``draft_chain`` produce it (dense)."""
    layer = head.layers[0]

    def propose(seq: list[int], hidden: torch.Tensor) -> list[int]:
        rows = len(seq) - 1
        keys: list[torch.Tensor] = []
        values: list[torch.Tensor] = []

        def attend(
            cache_layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
        ) -> torch.Tensor:
            keys.append(k.transpose(0, 1))
            values.append(v.transpose(0, 1))
            causal = len(keys) == 1
            out = F.scaled_dot_product_attention(
                q.transpose(0, 1),
                torch.cat(keys, dim=1),
                torch.cat(values, dim=1),
                is_causal=causal,
                enable_gqa=True,
            )
            return out.transpose(0, 1)

        ids = torch.tensor(seq[1:])
        g = layer(
            head.target.embed_tokens(ids), hidden[:rows], torch.arange(rows), head.rotary, 0, attend
        )
        g = g[-1:]
        drafts = [int(head.logits(g).argmax())]
        for s in range(1, steps):
            g = layer(
                head.target.embed_tokens(torch.tensor(drafts[-1:])),
                g,
                torch.tensor([rows - 1 + s]),
                head.rotary,
                0,
                attend,
            )
            drafts.append(int(head.logits(g).argmax()))
        return drafts

    return propose


def standalone_chain_proposer(
    model: LlamaForCausalLM, steps: int
) -> Callable[[list[int], torch.Tensor], list[int]]:
    def propose(seq: list[int], hidden: torch.Tensor) -> list[int]:
        drafts: list[int] = []
        for _ in range(steps):
            logits = model.forward_dense(torch.tensor(seq + drafts)).logits
            drafts.append(int(logits[-1].argmax()))
        return drafts

    return propose


ENGINE_RUNS = (
    ("none", "none", {}),
    ("eagle topk1 (num_draft_tokens 4)", "eagle", {"topk": 1, "num_draft_tokens": 4}),
    ("eagle topk4 (num_draft_tokens 8)", "eagle", {"topk": 4, "num_draft_tokens": 8}),
    (
        "eagle_multilayer topk1 (num_draft_tokens 4)",
        "eagle_multilayer",
        {"topk": 1, "num_draft_tokens": 4},
    ),
    (
        "eagle_multilayer topk4 (num_draft_tokens 8)",
        "eagle_multilayer",
        {"topk": 4, "num_draft_tokens": 8},
    ),
    ("ngram (num_draft_tokens 8)", "ngram", {"num_draft_tokens": 8}),
    ("standalone (num_draft_tokens 4)", "standalone", {"topk": 1, "num_draft_tokens": 4}),
)


def measure_acceptance(out: Path, prompts: list[str], new_tokens: int = 64) -> dict[str, Any]:
    """Greedy generation with the real ``Engine`` for every algorithm (num_steps 3), plus
    offline dense estimates for the chains (EAGLE topk 1, standalone)."""
    from relayc.engine import Engine, SamplingParams

    params = SamplingParams(max_new_tokens=new_tokens)
    draft_dirs = {name: out / name for name in ("eagle", "eagle_multilayer", "standalone")}
    results: dict[str, Any] = {
        "engine": {},
        "offline": {},
        "new_tokens": new_tokens,
        "prompts": len(prompts),
    }
    reference = None
    for label, algorithm, sizes in ENGINE_RUNS:
        start = time.perf_counter()
        engine = Engine(
            model=str(out / "target"),
            algorithm=algorithm,
            num_steps=MTP_STEPS,
            draft_model=str(draft_dirs[algorithm]) if algorithm in draft_dirs else None,
            overlap=False,
            seed=0,
            **sizes,
        )
        outs = engine.generate(prompts, params)
        engine.close()
        accepts = [a for o in outs for a in o.accept_lengths]
        tokens = [o.token_ids for o in outs]
        if algorithm == "none":
            reference = tokens
        results["engine"][label] = {
            "algorithm": algorithm,
            "num_steps": MTP_STEPS,
            **sizes,
            "mean_accept_length": round(sum(accepts) / max(len(accepts), 1), 3),
            "verifies": len(accepts),
            "identical_to_none": tokens == reference,
            "seconds": round(time.perf_counter() - start, 1),
        }
        print(f"[{time.strftime('%H:%M:%S')}] {label}: {results['engine'][label]}", flush=True)
    target = load_checkpoint(out / "target")
    head = EagleHead.load(out / "eagle", target)
    standalone = StandaloneDrafter.load(out / "standalone").model
    for label, propose in (
        ("eagle chain (num_steps 3), dense simulation", eagle_chain_proposer(head, MTP_STEPS)),
        (
            "standalone chain (num_steps 3), dense simulation",
            standalone_chain_proposer(standalone, MTP_STEPS),
        ),
    ):
        accepts = []
        for text in prompts:
            ids = [BOS_ID, *text.encode("utf-8")]
            accepts += simulate_chain(target, propose, ids, new_tokens)
        results["offline"][label] = {
            "mean_accept_length": round(sum(accepts) / max(len(accepts), 1), 3),
            "verifies": len(accepts),
        }
        print(f"[{time.strftime('%H:%M:%S')}] {label}: {results['offline'][label]}", flush=True)
    return results


# -- the model card ----------------------------------------------------------------------------
def model_card(log: dict[str, Any], acceptance: dict[str, Any] | None) -> str:
    corpus = log["corpus"]
    models = log["models"]
    lines = [
        "# relayc demo models",
        "",
        "Tiny byte-level models for the reference engine's demos and tests, trained on the CPU by",
        "`python -m relayc.engine.train` (issue #8). They are toys: a few minutes of training on",
        "a few MB of Python source. Vocabulary: 256 bytes + `<bos>` (256), `<eos>` (257),",
        "`<pad>` (258); prompts start with `<bos>` as `Engine` encodes them.",
        "",
        "| directory | loader | architecture | parameters | on disk | trained |",
        "|---|---|---|---|---|---|",
    ]
    for name, m in models.items():
        lines.append(
            f"| `{name}/` | `{m['loader']}` | {m['architecture']} | {m['params']:,} | "
            f"{m['bytes'] / 1e6:.2f} MB | {m['minutes']:.1f} min, {m['steps']} steps |"
        )
    lines += [
        "",
        f"Total shipped: {log['shipped_bytes'] / 1e6:.2f} MB. Weights are stored as float16 tensors",
        "under a float32 `config.json`: the loaders cast them to float32, the dtype the engine runs",
        "in; every number below was measured on the stored (float16-rounded) weights.",
        "",
        "## Corpus",
        "",
        f"- {corpus['source']}; Python {corpus['python']} ({corpus['python_implementation']}),",
        f"  {corpus['files']} files, capped at {corpus['cap_bytes']:,} bytes, excluding directories",
        f"  {', '.join('`' + d + '`' for d in corpus['exclude_dirs'])}.",
        f"- SHA-256 ({corpus['sha256_of']}): `{corpus['sha256']}`.",
        f"- Held out by file ({corpus['heldout_rule']}): {corpus['heldout_files']} files,",
        f"  {corpus['heldout_bytes']:,} bytes; training part {corpus['train_bytes']:,} bytes.",
        "- `heldout_prompts.json`: "
        f"{log['prompts']['count']} prompts of whole lines from distinct held-out files",
        f"  ({PROMPT_BYTES[0]}-{PROMPT_BYTES[1]} bytes each).",
        "",
        "## Training",
        "",
        f"Seed {log['seed']}, torch {log['torch']}, {log['threads']} CPU threads. AdamW (betas 0.9,",
        "0.95, weight decay 0.1 on matrices), linear warmup then cosine to 10% of the peak",
        f"learning rate, gradient clipping 1.0, batch {log['batch']} x {log['seq']} bytes (each",
        "window `<bos>` + bytes from a random line start). Curves: `training_log.json`.",
        "",
        "- target: next-byte cross-entropy.",
        "- eagle, eagle_multilayer, standalone: KL(target || draft) to the frozen target's full",
        "  distribution (loaded back from the stored weights). EAGLE is trained with training-time",
        "  test: draft step s >= 1 gets the head's own output hidden state of step s-1 and attends",
        "  the draft-extend keys plus its ancestors, as `draft_tree` runs it; MTP layer k gets layer",
        "  k-1's argmax token and output hidden state, as `MtpDrafter.extend` runs it. Step losses",
        f"  are weighted {', '.join(str(w) for w in STEP_WEIGHTS)}.",
        "",
        "| model | final train loss | final held-out loss | held-out top-1 agreement with target |",
        "|---|---|---|---|",
    ]
    for name, m in models.items():
        agree = m.get("heldout_top1_agree_per_step")
        lines.append(
            f"| {name} | {m['final_train_loss']:.4f} | {m['final_heldout_loss']:.4f} | "
            + (", ".join(f"{a:.3f}" for a in agree) if agree else "-")
            + " |"
        )
    target = models["target"]
    lines += [
        "",
        "Target losses are next-byte cross-entropy in nats (held-out: "
        f"{target['final_heldout_loss'] / math.log(2):.3f} bits/byte; on the held-out prompts",
        f"{log['prompts']['target_loss']:.3f} nats/byte). Draft losses are KL in nats per position,",
        "step-weighted; the agreement is per draft step (teacher-forced on held-out windows).",
        "",
    ]
    if acceptance:
        lines += [
            "## Acceptance",
            "",
            f"Greedy decoding, {acceptance['new_tokens']} new tokens for each of the "
            f"{acceptance['prompts']} held-out prompts,",
            "`Engine(model=target/, algorithm=..., num_steps=3, draft_model=..., overlap=False,",
            "seed=0)` on the CPU. Accept length = tokens emitted per verify (accepted drafts + the",
            "bonus), at most num_steps + 1 = 4 for the EAGLE variants.",
            "",
            "| algorithm | mean accept length | verifies | output identical to `none` |",
            "|---|---|---|---|",
        ]
        for label, r in acceptance["engine"].items():
            if r["algorithm"] == "none":
                continue
            lines.append(
                f"| {label} | {r['mean_accept_length']:.2f} | {r['verifies']} | "
                f"{'yes' if r['identical_to_none'] else 'NO'} |"
            )
        lines += [
            "",
            "Cross-check with cache-free dense forwards (greedy chain speculative decoding, no"
            " engine): the engine's chains must match it verify for verify"
            " (tests/engine/test_shipped_models.py).",
            "",
            "| drafter | mean accept length | verifies |",
            "|---|---|---|",
        ]
        for label, r in acceptance["offline"].items():
            lines.append(f"| {label} | {r['mean_accept_length']:.2f} | {r['verifies']} |")
        if acceptance.get("note"):
            lines += ["", acceptance["note"]]
        lines.append("")
    lines += [
        "## Reproduce",
        "",
        "```",
        "python -m relayc.engine.train --out relayc/assets/demo " + log["argv_tail"],
        "python -m relayc.engine.train --out relayc/assets/demo --measure-only  # acceptance + card",
        "```",
        "",
        "With time budgets the step counts and the (time-based) learning-rate schedule depend on",
        "the machine and its load, so a rerun gives similar, not identical, weights. `--steps-*`",
        "(with `--minutes-*` large enough) switch to a step-based schedule: seeded and",
        "reproducible on the same Python (same corpus hash) and torch build.",
        "",
    ]
    return "\n".join(lines)


# -- main --------------------------------------------------------------------------------------
def _config_summary(config: ModelConfig) -> str:
    return (
        f"{config.num_layers}L, hidden {config.hidden_size}, {config.num_heads} heads / "
        f"{config.num_kv_heads} kv, head_dim {config.head_dim}, MLP {config.intermediate_size}"
    )


def run_training(args: argparse.Namespace) -> dict[str, Any]:
    # Tiny smoke forwards: one thread (two spin-waiting threads crawl on a busy machine).
    torch.set_num_threads(1 if args.smoke else args.threads)
    torch.manual_seed(args.seed)
    plan = smoke_plan(args) if args.smoke else full_plan(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    corpus = assemble_corpus(plan.corpus_bytes)
    print(f"corpus: {corpus.info}", flush=True)
    prompts = heldout_prompts(corpus, args.seed)
    (out / "heldout_prompts.json").write_text(
        json.dumps(
            {
                "corpus_sha256": corpus.sha256,
                "python": corpus.info["python"],
                "prompts": prompts,
            },
            indent=2,
        )
        + "\n"
    )
    eval_gen = torch.Generator().manual_seed(args.seed + 1000)
    windows = sample_batch(
        corpus.heldout, corpus.heldout_line_starts, plan.eval_windows, plan.seq, eval_gen
    )
    data_gen = torch.Generator().manual_seed(args.seed)

    def sample() -> torch.Tensor:
        return sample_batch(corpus.train, corpus.train_line_starts, plan.batch, plan.seq, data_gen)

    log: dict[str, Any] = {
        "seed": args.seed,
        "smoke": args.smoke,
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "threads": torch.get_num_threads(),
        "batch": plan.batch,
        "seq": plan.seq,
        "argv_tail": _argv_tail(args),
        "corpus": corpus.info,
        "curves": {},
        "models": {},
    }
    curves = log["curves"]

    # 1. the target
    target = LlamaForCausalLM(plan.target)
    init_for_training(target, args.seed, plan.target.num_layers)

    def target_step(ids: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
        logits = target.forward_train(ids).logits[:, 1:-1]
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 2:].reshape(-1))
        return loss, {}

    record = train_loop(
        "target",
        target,
        target_step,
        lambda: {"loss": round(target_heldout_loss(target, windows), 5)},
        sample,
        lr=plan.lr,
        weight_decay=plan.weight_decay,
        budget_s=60 * plan.minutes["target"],
        max_steps=plan.steps["target"],
        warmup_frac=plan.warmup_frac,
        eval_every_s=plan.eval_every_s,
        log=curves,
    )
    save_checkpoint(target, out / "target")
    store_half(out / "target")
    target = load_checkpoint(out / "target")  # the exact weights the engine will run
    target.requires_grad_(False)
    target.eval()
    text_prompts = [p["text"] for p in prompts]
    log["prompts"] = {
        "count": len(prompts),
        "target_loss": round(prompt_loss(target, text_prompts), 5),
    }
    log["models"]["target"] = {
        "loader": "relayc.engine.weights.load_checkpoint",
        "architecture": "LlamaForCausalLM " + _config_summary(plan.target) + ", tied embeddings",
        "params": count_params(target),
        "bytes": dir_bytes(out / "target"),
        "steps": record["steps"],
        "minutes": record["minutes"],
        "final_train_loss": record["final_train_loss"],
        "final_heldout_loss": round(target_heldout_loss(target, windows), 5),
    }
    chunk = min(16, plan.eval_windows)
    teachers = [
        run_target(target, windows[i : i + chunk]) for i in range(0, plan.eval_windows, chunk)
    ]

    def distill(
        name: str,
        module: nn.Module,
        loss_fn: Callable[..., tuple[list[torch.Tensor], list[float]]],
        trained: nn.Module,
    ) -> dict[str, Any]:
        def step(ids: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
            losses, agree = loss_fn(module, ids, run_target(target, ids))
            return weighted(losses), {"top1_agree_per_step": [round(a, 4) for a in agree]}

        return train_loop(
            name,
            trained,
            step,
            lambda: draft_eval(loss_fn, module, windows, teachers, chunk),
            sample,
            lr=plan.draft_lr,
            weight_decay=plan.weight_decay,
            budget_s=60 * plan.minutes[name],
            max_steps=plan.steps[name],
            warmup_frac=plan.warmup_frac,
            eval_every_s=plan.eval_every_s,
            log=curves,
        )

    def finish(
        name: str,
        loader: str,
        architecture: str,
        module: nn.Module,
        loss_fn: Any,
        record: dict[str, Any],
        reloaded: nn.Module,
    ) -> None:
        final = draft_eval(loss_fn, reloaded, windows, teachers, chunk)
        log["models"][name] = {
            "loader": loader,
            "architecture": architecture,
            "params": count_params(module),
            "bytes": dir_bytes(out / name),
            "steps": record["steps"],
            "minutes": record["minutes"],
            "final_train_loss": record["final_train_loss"],
            "final_heldout_loss": final["loss"],
            "heldout_kl_per_step": final["kl_per_step"],
            "heldout_top1_agree_per_step": final["top1_agree_per_step"],
        }

    # 2. the EAGLE head
    head = EagleHead(plan.target, target)
    init_for_training(head, args.seed + 1, 1)
    record = distill("eagle", head, eagle_losses, head)
    head.save(out / "eagle")
    store_half(out / "eagle")
    finish(
        "eagle",
        "relayc.engine.draft.EagleHead.load(dir, target)",
        "EAGLE head: fc(2h->h) + 1 decoder layer (target's layer shape) + norm; shares the "
        "target's embedding and LM head",
        head,
        eagle_losses,
        record,
        EagleHead.load(out / "eagle", target),
    )
    del head

    # 3. the multi-layer EAGLE (MTP) drafter
    mtp = MtpDrafter(plan.target, target, MTP_STEPS)
    init_for_training(mtp, args.seed + 2, MTP_STEPS)
    record = distill("eagle_multilayer", mtp, mtp_losses, mtp)
    mtp.save(out / "eagle_multilayer")
    store_half(out / "eagle_multilayer")
    finish(
        "eagle_multilayer",
        "relayc.engine.draft.MtpDrafter.load(dir, target)",
        f"MTP: {MTP_STEPS} EAGLE draft layers (one per draft step); shares the target's "
        "embedding and LM head",
        mtp,
        mtp_losses,
        record,
        MtpDrafter.load(out / "eagle_multilayer", target),
    )
    del mtp

    # 4. the standalone draft model
    small = LlamaForCausalLM(plan.standalone)
    init_for_training(small, args.seed + 3, plan.standalone.num_layers)
    record = distill("standalone", small, standalone_losses, small)
    StandaloneDrafter(small).save(out / "standalone")
    store_half(out / "standalone")
    finish(
        "standalone",
        "relayc.engine.draft.StandaloneDrafter.load(dir)",
        "LlamaForCausalLM " + _config_summary(plan.standalone) + ", tied embeddings",
        small,
        standalone_losses,
        record,
        StandaloneDrafter.load(out / "standalone").model,
    )
    log["shipped_bytes"] = 0  # filled in by write_outputs
    return log


def _argv_tail(args: argparse.Namespace) -> str:
    parts = [] if not args.smoke else ["--smoke"]
    for name in SUBDIRS:
        minutes = getattr(args, f"minutes_{name}")
        parts.append(f"--minutes-{name.replace('_', '-')} {minutes:g}")
    parts.append(f"--seed {args.seed}")
    if not args.smoke:
        parts.append(f"--target-layers {args.target_layers}")
    return " ".join(parts)


def write_outputs(out: Path, log: dict[str, Any], acceptance: dict[str, Any] | None) -> None:
    log["shipped_bytes"] = sum(dir_bytes(out / name) for name in SUBDIRS)
    (out / "training_log.json").write_text(json.dumps(log, indent=1) + "\n")
    if acceptance is not None:
        (out / "acceptance.json").write_text(json.dumps(acceptance, indent=2) + "\n")
    (out / "MODEL_CARD.md").write_text(model_card(log, acceptance))
    log["shipped_bytes"] = dir_bytes(out)
    (out / "training_log.json").write_text(json.dumps(log, indent=1) + "\n")
    (out / "MODEL_CARD.md").write_text(model_card(log, acceptance))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m relayc.engine.train", description=__doc__.split("\n")[0]
    )
    p.add_argument("--out", required=True, help="output directory (e.g. relayc/assets/demo)")
    p.add_argument("--smoke", action="store_true", help="tiny sizes, a few steps (tests)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    p.add_argument("--target-layers", type=int, default=4)
    p.add_argument("--corpus-bytes", type=int, default=8 << 20, help="corpus cap (bytes)")
    defaults = {"target": 25.0, "eagle": 8.0, "eagle_multilayer": 7.0, "standalone": 5.0}
    for name, minutes in defaults.items():
        flag = name.replace("_", "-")
        p.add_argument(f"--minutes-{flag}", dest=f"minutes_{name}", type=float, default=minutes)
        p.add_argument(f"--steps-{flag}", dest=f"steps_{name}", type=int, default=None)
    p.add_argument(
        "--minutes-mtp", dest="minutes_eagle_multilayer", type=float, default=argparse.SUPPRESS
    )
    p.add_argument("--no-measure", action="store_true", help="skip the engine acceptance runs")
    p.add_argument(
        "--measure-only", action="store_true", help="re-measure acceptance, rewrite card"
    )
    p.add_argument("--new-tokens", type=int, default=64)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    if args.measure_only:
        torch.set_num_threads(args.threads)
        log = json.loads((out / "training_log.json").read_text())
    else:
        log = run_training(args)
        write_outputs(out, log, None)
    if args.measure_only or not (args.no_measure or args.smoke):
        prompts = [
            p["text"] for p in json.loads((out / "heldout_prompts.json").read_text())["prompts"]
        ]
        write_outputs(out, log, measure_acceptance(out, prompts, args.new_tokens))
    print(f"wrote {out} ({dir_bytes(out) / 1e6:.2f} MB)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
