"""SmolLM2's EAGLE-3 head: a self-distilled chat corpus, the target's features computed once,
the training run and the held-out chat acceptance.

The corpus is a folder of ``examples.jsonl`` (``relayc.tools.train.chat_corpus``: one JSON
line an example with ``prompt_ids`` -- the chat template applied -- and ``answer_ids``, the
target's greedy answer). The run reads the complete lines present when it starts (the file
may still be growing; ``--max-examples`` caps them) and records their SHA-256. Every
``HOLDOUT_EVERY``-th example is held out for the teacher-forced evaluation.

Features: one dense float32 forward of the target per example with autograd off gives the
inputs of the captured layers, the last hidden state (before the final norm) and the
argmax over the whole vocabulary; they are stored in bfloat16 in ``--work`` shards, so a
resumed run skips the examples already done. Training scores only answer positions (the
head drafts answers), as SpecForge's loss mask does.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from pathlib import Path
from typing import Any

import torch

from relayc.engine.draft.eagle3 import capture_layers
from relayc.engine.errors import CheckpointError
from relayc.engine.model.llama import LlamaForCausalLM
from relayc.specs.errors import UsageError
from relayc.tools.train.eagle3 import (
    Eagle3Teacher,
    choose_vocabulary,
    coverage,
    draft_logp,
)
from relayc.tools.train.eagle3_measure import MeasureRun, measure_runs
from relayc.tools.train.eagle3_run import (
    NUM_STEPS,
    heldout_outside,
    init_record,
    starting_head,
    train_and_store,
)
from relayc.tools.train.work import FRESH, load_pt, read_json

HOLDOUT_EVERY = 50
MAX_TOKEN_ID = 2**31 - 1  # the target's vocabulary bounds ids when it embeds them
MAX_LEN = 320  # tokens per example (prompt + answer), the rest cut
SHARD = 64  # examples per feature shard
CHAT_PROMPTS = Path(__file__).resolve().parents[2] / "assets" / "chat" / "heldout_chat_prompts.json"


def read_corpus(folder: Path, limit: int | None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The complete example lines of ``folder/examples.jsonl`` (at most ``limit``) and their
    provenance: count, tokens, SHA-256 of the bytes read."""
    digest = hashlib.sha256()
    examples: list[dict[str, Any]] = []
    path = folder / "examples.jsonl"
    try:
        with path.open("rb") as f:
            for number, line in enumerate(f, start=1):
                if not line.endswith(b"\n") or (limit is not None and len(examples) == limit):
                    break
                digest.update(line)
                examples.append(_example(line, path, number))
    except OSError as exc:
        raise CheckpointError(f"cannot read: {exc.strerror or exc}", path) from None
    manifest = folder / "manifest.json"
    info = {
        "folder": str(folder),
        "examples": len(examples),
        "prompt_tokens": sum(len(e["prompt_ids"]) for e in examples),
        "answer_tokens": sum(len(e["answer_ids"]) for e in examples),
        "sha256": digest.hexdigest(),
        "sha256_of": "the examples.jsonl lines read, as bytes",
        "manifest": read_json(manifest) if manifest.is_file() else None,
    }
    return examples, info


def _example(line: bytes, path: Path, number: int) -> dict[str, Any]:
    """Line ``number`` of a corpus's ``examples.jsonl``: ``index`` and the token id lists
    ``prompt_ids`` / ``answer_ids``, else a ``CheckpointError`` naming the file and line."""
    try:
        record = json.loads(line)
    except (ValueError, RecursionError) as exc:
        raise CheckpointError(f"line {number} is not JSON ({exc})", path) from None
    fields = ("index", "prompt_ids", "answer_ids")
    ok = isinstance(record, dict) and all(
        isinstance(record.get(k), list)
        and all(type(t) is int and 0 <= t <= MAX_TOKEN_ID for t in record[k])
        for k in fields[1:]
    )
    if not ok or "index" not in record:
        raise CheckpointError(
            f"line {number} needs `index` and `prompt_ids` / `answer_ids` (lists of token ids); "
            "rewrite the corpus with python -m relayc.tools.train.chat_corpus",
            path,
        )
    return {k: record[k] for k in fields}


@torch.no_grad()
def compute_features(
    target: LlamaForCausalLM, examples: list[dict[str, Any]], capture: tuple[int, ...], work: Path
) -> list[dict[str, torch.Tensor]]:
    """Per example: ``ids``, ``features`` / ``hidden`` (bfloat16), ``argmax``, ``prompt_len``;
    shards already in ``work`` are read back (the same examples in the same order)."""
    vocab = target.config.vocab_size
    for example in examples:
        if any(t >= vocab for t in (*example["prompt_ids"], *example["answer_ids"])):
            raise UsageError(
                f"example {example['index']} holds a token id outside the target's vocabulary "
                f"(0..{vocab - 1}): the corpus (--data) was made for another model"
            )
    work.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, torch.Tensor]] = []
    start = time.perf_counter()
    for first in range(0, len(examples), SHARD):
        part = examples[first : first + SHARD]
        key = hashlib.sha256(json.dumps([capture, part]).encode()).hexdigest()[:16]
        path = work / f"features-{first // SHARD:05d}-{key}.pt"
        if path.is_file():
            rows += read_shard(path, len(part), len(capture), target.config.hidden_size)
            continue
        shard = []
        for example in part:
            ids = torch.tensor((example["prompt_ids"] + example["answer_ids"])[:MAX_LEN])
            out = target.forward_train(ids[None], capture)
            assert out.aux_hidden_states is not None
            shard.append(
                {
                    "ids": ids.to(torch.int32),
                    "features": out.aux_hidden_states[0].to(torch.bfloat16),
                    "hidden": out.hidden_states[0].to(torch.bfloat16),
                    "argmax": out.logits[0].argmax(-1).to(torch.int32),
                    "prompt_len": torch.tensor(len(example["prompt_ids"])),
                }
            )
        torch.save(shard, path)
        rows += shard
        done = first + len(part)
        print(
            f"[{time.strftime('%H:%M:%S')}] features {done}/{len(examples)} "
            f"({time.perf_counter() - start:.0f} s)",
            flush=True,
        )
    return rows


SHARD_KEYS = ("ids", "features", "hidden", "argmax", "prompt_len")


def read_shard(path: Path, count: int, layers: int, hidden: int) -> list[dict[str, torch.Tensor]]:
    """A feature shard :func:`compute_features` stored: ``count`` rows of tensors whose
    lengths agree, ``layers`` captured hidden states of size ``hidden`` a position, read
    without unpickling code; anything else a ``CheckpointError``."""
    rows = load_pt(path)
    if not isinstance(rows, list) or len(rows) != count:
        raise CheckpointError(f"is not a feature shard of {count} examples; {FRESH}", path)
    for number, row in enumerate(rows):
        if not isinstance(row, dict) or not all(
            isinstance(row.get(k), torch.Tensor) for k in SHARD_KEYS
        ):
            raise CheckpointError(
                f"row {number} lacks one of the tensors {', '.join(SHARD_KEYS)}; {FRESH}", path
            )
        length = row["ids"].numel()
        shapes_agree = (
            row["ids"].ndim == 1
            and row["features"].ndim == row["hidden"].ndim == 2
            and row["features"].shape[0] == row["hidden"].shape[0] == length
            and row["features"].shape[1] == layers * hidden
            and row["hidden"].shape[1] == hidden
            and tuple(row["argmax"].shape) == (length,)
            and row["prompt_len"].numel() == 1
            and 0 <= int(row["prompt_len"]) <= length
        )
        if not shapes_agree:
            raise CheckpointError(
                f"row {number}'s tensors do not have the shapes this target gives; {FRESH}", path
            )
    return rows


def collate(
    target: LlamaForCausalLM, rows: list[dict[str, torch.Tensor]], vocab: torch.Tensor
) -> tuple[torch.Tensor, Eagle3Teacher]:
    """A padded batch: positions ``p`` in ``prompt_len - 1 .. len - 2`` (those predicting an
    answer token) are valid; padding sits at the end, after every valid position."""
    seq = max(int(r["ids"].numel()) for r in rows)
    batch = len(rows)
    ids = torch.zeros(batch, seq, dtype=torch.int64)
    width = rows[0]["features"].shape[-1]
    features = torch.zeros(batch, seq, width)
    hidden = torch.zeros(batch, seq, rows[0]["hidden"].shape[-1])
    argmax = torch.zeros(batch, seq, dtype=torch.int64)
    valid = torch.zeros(batch, seq, dtype=torch.bool)
    for b, r in enumerate(rows):
        n = int(r["ids"].numel())
        ids[b, :n] = r["ids"].long()
        features[b, :n] = r["features"].float()
        hidden[b, :n] = r["hidden"].float()
        argmax[b, :n] = r["argmax"].long()
        valid[b, max(int(r["prompt_len"]) - 1, 0) : n - 1] = True
    with torch.no_grad():
        logp = draft_logp(target, hidden, vocab)
    return ids, Eagle3Teacher(features, logp, argmax, valid)


def run_smollm2(args: argparse.Namespace) -> dict[str, Any]:

    target, examples, info = _target_and_corpus(args)
    target.requires_grad_(False)
    target.eval()
    if args.draft_vocab > target.config.vocab_size:
        raise UsageError(
            f"--draft-vocab {args.draft_vocab}: the target has {target.config.vocab_size} "
            "tokens; give at most that many"
        )
    capture = capture_layers(target.config.num_layers, None)
    rows = compute_features(target, examples, capture, Path(args.work) / "features")
    if args.features_only:
        raise SystemExit(0)
    heldout = [r for i, r in enumerate(rows) if i % HOLDOUT_EVERY == HOLDOUT_EVERY - 1]
    train = [r for i, r in enumerate(rows) if i % HOLDOUT_EVERY != HOLDOUT_EVERY - 1]
    counts = torch.zeros(target.config.vocab_size, dtype=torch.int64)
    for r in train:
        counts += torch.bincount(r["ids"][int(r["prompt_len"]) :].long(), minlength=counts.numel())
    head, vocab = starting_head(
        args, target, choose_vocabulary(counts, args.draft_vocab), None, args.seed + 1
    )
    batch = 2 if args.smoke else args.batch
    eval_batches = [
        collate(target, heldout[i : i + batch], vocab) for i in range(0, len(heldout), batch)
    ]
    gen = torch.Generator().manual_seed(args.seed)

    def sample() -> tuple[torch.Tensor, Eagle3Teacher]:
        pick = torch.randint(len(train), (batch,), generator=gen).tolist()
        return collate(target, [train[i] for i in pick], vocab)

    all_counts = torch.zeros_like(counts)
    for r in rows:
        all_counts += torch.bincount(
            r["argmax"][int(r["prompt_len"]) - 1 : -1].long(), minlength=counts.numel()
        )
    log: dict[str, Any] = {
        "target": "smollm2 (SmolLM2-135M-Instruct, Q4_1 GGUF dequantized), float32",
        "corpus": info,
        "split": {
            "train": len(train),
            "heldout": len(heldout),
            "rule": f"example i % {HOLDOUT_EVERY} == {HOLDOUT_EVERY - 1}",
        },
        "batch": batch,
        "init": init_record(args),
        "max_len": MAX_LEN,
        "draft_vocab": {
            "size": args.draft_vocab,
            "rule": "most frequent answer tokens of the training examples",
            "train_answer_coverage": round(coverage(counts, vocab), 6),
            "target_argmax_coverage": {
                str(size): round(coverage(all_counts, choose_vocabulary(counts, size)), 6)
                for size in (4096, 8192, 16384, 32768)
            },
            "heldout_target_argmax_outside": heldout_outside(head, eval_batches),
        },
        "curves": {},
    }
    print(f"draft vocabulary: {log['draft_vocab']}", flush=True)
    out = train_and_store(
        args,
        target,
        head,
        sample,
        {"gen": gen},
        eval_batches,
        log,
    )
    if not (args.smoke or args.no_measure):
        log["acceptance"] = measure_chat(args, out, NUM_STEPS)
    return log


def _target_and_corpus(
    args: argparse.Namespace,
) -> tuple[LlamaForCausalLM, list[dict[str, Any]], dict[str, Any]]:
    if args.smoke:
        from relayc.engine.core.config import ModelConfig
        from relayc.engine.model.weights import random_model

        config = ModelConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_layers=8,
                             num_heads=2, num_kv_heads=1, head_dim=16, max_position=512)  # fmt: skip
        target = random_model(config, seed=args.seed)
        gen = torch.Generator().manual_seed(args.seed)
        examples: list[dict[str, Any]] = [
            {
                "index": i,
                "prompt_ids": torch.randint(300, (12,), generator=gen).tolist(),
                "answer_ids": torch.randint(40, (20,), generator=gen).tolist(),
            }
            for i in range(2 * HOLDOUT_EVERY)
        ]
        info: dict[str, Any] = {
            "folder": "smoke (random ids)",
            "examples": len(examples),
            "prompt_tokens": sum(len(e["prompt_ids"]) for e in examples),
            "answer_tokens": sum(len(e["answer_ids"]) for e in examples),
            "sha256": "-",
            "manifest": None,
        }
        return target, examples, info
    from relayc.engine.checkpoints.loader import load_model

    loaded = load_model("smollm2", device=torch.device("cpu"), dtype=torch.float32)
    examples, info = read_corpus(Path(args.data), args.max_examples)
    return loaded.model, examples, info


def measure_chat(args: argparse.Namespace, out: Path, num_steps: int) -> dict[str, Any]:
    """Greedy ``engine.chat`` on the held-out chat prompts: ``none``, then the head."""
    from relayc.engine import Engine, SamplingParams

    prompts = [
        [{"role": "user", "content": p["content"]}]
        for p in json.loads(CHAT_PROMPTS.read_text())["prompts"]
    ]
    params = SamplingParams(max_new_tokens=args.new_tokens)
    runs: list[MeasureRun] = [
        ("none", "none", {}),
        (
            "eagle3 topk4 (num_draft_tokens 8)",
            "eagle3",
            {"topk": 4, "num_draft_tokens": 8, "draft_model": str(out)},
        ),
    ]
    return {
        "prompts": "relayc/assets/chat/heldout_chat_prompts.json",
        "count": len(prompts),
        "new_tokens": args.new_tokens,
        "dtype": args.measure_dtype,
        "runs": measure_runs(
            runs,
            lambda engine: engine.chat(prompts, params),
            lambda **kw: Engine(
                model="smollm2", dtype=args.measure_dtype, overlap=False, seed=0, **kw
            ),
            num_steps,
        ),
    }
