"""What both EAGLE-3 training paths (``eagle3_cli``'s toy, ``eagle3_chat``'s SmolLM2) share:
building the warm-started head, the resumable training loop, storing and describing it."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch

from relayc.engine.draft.eagle3 import Eagle3Head, capture_layers
from relayc.engine.errors import CheckpointError
from relayc.engine.model.llama import LlamaForCausalLM
from relayc.specs.errors import UsageError
from relayc.tools.train.chat_corpus import file_sha256
from relayc.tools.train.eagle3 import eagle3_eval, eagle3_losses, out_of_vocab_rate, warm_start
from relayc.tools.train.loop import CHECKPOINT_FIELDS, Checkpoint, train_loop
from relayc.tools.train.losses import weighted
from relayc.tools.train.plan import init_for_training, model_record, store_half
from relayc.tools.train.work import FRESH, load_state, read_json

INIT_RECORD = "init.json"  # in --work: the stored head a run started from (--init)
NUM_STEPS = 3  # the engine's num_steps for the measured runs (topk 4, 8 draft tokens)


def build_head(
    target: LlamaForCausalLM, vocab: torch.Tensor, layer_ids: tuple[int, ...] | None, seed: int
) -> Eagle3Head:
    """A fresh head in the target's layer shape over the draft vocabulary ``vocab``."""
    head = Eagle3Head(
        target.config,
        target,
        draft_vocab_size=vocab.numel(),
        capture=capture_layers(target.config.num_layers, layer_ids),
    )
    init_for_training(head, seed, 1)
    head.set_vocabulary(vocab)
    warm_start(head, target)
    return head


def starting_head(
    args: argparse.Namespace,
    target: LlamaForCausalLM,
    chosen: torch.Tensor,
    layer_ids: tuple[int, ...] | None,
    seed: int,
) -> tuple[Eagle3Head, torch.Tensor]:
    """The head a run trains and its draft vocabulary (target ids).

    A run resuming ``--work``'s checkpoint keeps the checkpoint's vocabulary (the loop then
    restores its weights); a new run with ``--init DIR`` starts from a stored head (its
    weights in float32, its vocabulary and captured layers: a fresh optimizer and schedule
    fine-tune it, e.g. on more data); otherwise a fresh warm-started head over ``chosen``.
    """
    work = Path(args.work)
    init = getattr(args, "init", None)
    if init is not None and not (work / "checkpoint.pt").is_file():
        head = Eagle3Head.load(init, target).float()
        if layer_ids is not None and tuple(head.capture) != capture_layers(
            target.config.num_layers, layer_ids
        ):
            raise UsageError(
                f"--init {init}: the head captures layers {list(head.capture)}, this run "
                f"{list(capture_layers(target.config.num_layers, layer_ids))}"
            )
        vocab = head.to_target_ids(torch.arange(head.draft_vocab_size, device=head.device))
        rule = (
            "weights, draft vocabulary and captured layers of the stored head; "
            "a fresh optimizer and learning-rate schedule"
        )
        kept = None
        if getattr(args, "revocab", False):
            head, kept = revocabulary(head, target, chosen, seed)
            vocab = chosen
            rule = (
                "weights and captured layers of the stored head over a draft vocabulary "
                f"chosen from this run's data ({kept} of its {chosen.numel()} ids were the "
                "stored head's, their LM-head rows kept; the others start as the target's); "
                "a fresh optimizer and learning-rate schedule"
            )
        work.mkdir(parents=True, exist_ok=True)
        weights = Path(init) / "model.safetensors"
        record = {
            "from": str(init),
            "model_sha256": file_sha256(weights) if weights.is_file() else None,
            "rule": rule,
        }
        (work / INIT_RECORD).write_text(json.dumps(record, indent=1) + "\n")
        return head, vocab.cpu()
    vocab = resumed_vocabulary(work, chosen, target.config.vocab_size)
    return build_head(target, vocab, layer_ids, seed), vocab


def revocabulary(
    stored: Eagle3Head, target: LlamaForCausalLM, vocab: torch.Tensor, seed: int
) -> tuple[Eagle3Head, int]:
    """``stored`` over the draft vocabulary ``vocab`` (target ids): its fc, layer and norm,
    and the LM-head rows of the ids both vocabularies hold; a new id's row is the target's
    (:func:`build_head`'s warm start). Returns the head and how many ids were kept. A head
    whose vocabulary was chosen from little data misses tokens the target often predicts."""
    # capture_layers reads ids as "the output of layer id": the input of id + 1
    head = build_head(target, vocab, tuple(c - 1 for c in stored.capture), seed)
    old_ids = stored.to_target_ids(torch.arange(stored.draft_vocab_size))
    row_of = {int(t): i for i, t in enumerate(old_ids.tolist())}
    with torch.no_grad():
        for name in ("fc", "midlayer", "norm"):
            getattr(head, name).load_state_dict(getattr(stored, name).state_dict())
        pairs = [(i, row_of[t]) for i, t in enumerate(vocab.tolist()) if t in row_of]
        if pairs:
            new_rows, old_rows = (torch.tensor(x) for x in zip(*pairs, strict=True))
            head.lm_head.weight[new_rows] = stored.lm_head.weight[old_rows].to(
                head.lm_head.weight.dtype
            )
    return head, len(pairs)


def init_record(args: argparse.Namespace) -> dict[str, Any] | None:
    """Where the head in ``--work`` started (``--init``), kept across resumed invocations;
    None for a fresh head."""
    path = Path(args.work) / INIT_RECORD
    if not path.is_file():
        return None
    record = read_json(path)
    if not isinstance(record, dict):
        raise CheckpointError(f"holds a {type(record).__name__}, not a JSON object; {FRESH}", path)
    return record


def resumed_vocabulary(work: Path, chosen: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """The draft vocabulary of the checkpoint in ``work`` when there is one (a resumed run
    may read more data, whose counts would pick another), else ``chosen``; a checkpoint whose
    vocabulary is not one of a target of ``vocab_size`` tokens is a ``CheckpointError``."""
    path = work / "checkpoint.pt"
    if not path.is_file():
        return chosen
    d2t = load_state(path, CHECKPOINT_FIELDS)["module"].get("d2t")
    if not isinstance(d2t, torch.Tensor) or d2t.ndim != 1 or d2t.dtype != torch.int64:
        raise CheckpointError(
            f"holds no EAGLE-3 head (no `module.d2t` int64 vector); {FRESH}", path
        )
    vocab = d2t + torch.arange(d2t.numel())
    ascending = bool((vocab[1:] > vocab[:-1]).all())
    if (
        not 0 < vocab.numel() <= vocab_size
        or not ascending
        or not 0 <= int(vocab[0])
        or int(vocab[-1]) >= vocab_size
    ):
        raise CheckpointError(
            f"its draft vocabulary is not one of this target's {vocab_size} tokens (another "
            f"--target?); {FRESH}",
            path,
        )
    return vocab


def train_head(
    args: argparse.Namespace,
    target: LlamaForCausalLM,
    head: Eagle3Head,
    sample: Any,
    generators: dict[str, torch.Generator],
    eval_batches: list[tuple[torch.Tensor, Any]],
    log: dict[str, Any],
) -> dict[str, Any]:
    """The training loop (``loop.train_loop``) on ``sample() -> (ids, teacher)`` batches."""
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)

    def step(batch: tuple[torch.Tensor, Any]) -> tuple[torch.Tensor, dict[str, Any]]:
        ids, teacher = batch
        losses, agree = eagle3_losses(head, ids, teacher)
        return weighted(losses), {"top1_agree_per_step": [round(a, 4) for a in agree]}

    return train_loop(
        "eagle3",
        head,
        step,
        lambda: eagle3_eval(head, eval_batches),
        sample,
        lr=args.lr,
        weight_decay=0.1,
        budget_s=60 * args.minutes,
        max_steps=args.steps,
        warmup_frac=0.05,
        eval_every_s=args.eval_every,
        log=log,
        checkpoint=Checkpoint(
            work / "checkpoint.pt",
            60 * args.save_every,
            generators,
            "--target (and --smoke)",
            {"--target": args.target, "--smoke": args.smoke},
        ),
    )


def store(head: Eagle3Head, out: Path) -> Path:
    head.save(out)
    store_half(out)
    return out


# -- the toy target --------------------------------------------------------------------------


def model_entry(
    head: Eagle3Head, out: Path, record: dict[str, Any], final: dict[str, Any]
) -> dict[str, Any]:
    return {
        "loader": "relayc.engine.draft.Eagle3Head.load(dir, target)",
        "architecture": "EAGLE-3 head: fc(3h->h) + 1 decoder layer over [embed; hidden] "
        "(target's layer shape) + norm + lm_head over the draft vocabulary",
        "capture": list(head.capture),
        **model_record(head, out, record, final),
    }


def heldout_outside(head: Eagle3Head, eval_batches: list[tuple[torch.Tensor, Any]]) -> float:
    """The held-out positions whose target argmax the head's draft vocabulary lacks."""
    return round(sum(out_of_vocab_rate(head, t) for _, t in eval_batches) / len(eval_batches), 6)


def train_and_store(
    args: argparse.Namespace,
    target: LlamaForCausalLM,
    head: Eagle3Head,
    sample: Any,
    generators: dict[str, torch.Generator],
    eval_batches: list[tuple[torch.Tensor, Any]],
    log: dict[str, Any],
) -> Path:
    """Train (``train_head``, curves into ``log["curves"]``), store the head in ``--out``,
    reload it and log its entry with the reloaded head's held-out evaluation."""
    record = train_head(args, target, head, sample, generators, eval_batches, log["curves"])
    out = store(head, Path(args.out))
    final = eagle3_eval(Eagle3Head.load(out, target), eval_batches)
    log["model"] = model_entry(head, out, record, final)
    return out
