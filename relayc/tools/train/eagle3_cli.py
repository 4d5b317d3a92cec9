"""``python -m relayc.tools.train eagle3 --target toy|smollm2 --out DIR``: train an EAGLE-3
head for the shipped byte-level target (on its standard-library corpus) or for SmolLM2
(on a self-distilled chat corpus, ``relayc.tools.train.eagle3_chat``), store it in
float16 in SGLang's layout, reload it and measure its acceptance with the real ``Engine``.

The run is seeded and resumable: ``--work DIR`` holds the checkpoint (saved every
``--save-every`` minutes) and, for SmolLM2, the precomputed target features; the same
command continues an interrupted run, and ``--minutes`` may be raised to train on.
``--smoke`` trains a tiny random target and head for a few steps (tests).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from relayc.engine.checkpoints.shipped import heldout_prompts, shipped_target
from relayc.engine.core.config import ModelConfig
from relayc.engine.errors import CheckpointError
from relayc.engine.model.weights import load_checkpoint, random_model
from relayc.specs.errors import OneLineParser, UsageError
from relayc.tools.args import MAX_SEED, float_in, int_in
from relayc.tools.train.corpus import assemble_corpus, sample_batch
from relayc.tools.train.eagle3 import (
    choose_vocabulary,
    coverage,
    run_teacher,
)
from relayc.tools.train.eagle3_card import smollm2_card, update_demo_card
from relayc.tools.train.eagle3_chat import run_smollm2
from relayc.tools.train.eagle3_measure import MeasureRun, measure_runs
from relayc.tools.train.eagle3_run import (
    NUM_STEPS,
    heldout_outside,
    init_record,
    starting_head,
    train_and_store,
)
from relayc.tools.train.options import corpus_folder, head_folder, output_folder, run_command
from relayc.tools.train.plan import dir_bytes
from relayc.tools.train.work import FRESH, read_json

PROG = "python -m relayc.tools.train eagle3"
TOY_LAYER_IDS = (0, 2, 4)  # inputs of layers 1, 3, 5: SGLang's default repeats layer 3 at L=6
MEASURE_SIZES = {"topk": 4, "num_draft_tokens": 8}


def run_toy(args: argparse.Namespace) -> dict[str, Any]:
    """The shipped byte-level target (``--smoke``: a tiny random one) on its corpus."""
    if args.smoke:
        config = ModelConfig(hidden_size=32, intermediate_size=64, num_layers=4, num_heads=2,
                             num_kv_heads=1, head_dim=16, max_position=512)  # fmt: skip
        target = random_model(config, seed=args.seed)
        corpus = assemble_corpus(1 << 20)
        batch, seq, vocab_size, layer_ids = 4, 64, args.draft_vocab, (0, 1, 2)
    else:
        source = shipped_target()
        if source is None:
            raise UsageError(
                "the shipped demo target is missing (relayc/assets/demo/target): reinstall "
                "relayc, or use --target smollm2 or --smoke"
            )
        target = load_checkpoint(source)
        corpus = assemble_corpus(args.corpus_bytes)
        batch, seq, vocab_size, layer_ids = args.batch, 256, args.draft_vocab, TOY_LAYER_IDS
    target.requires_grad_(False)
    target.eval()
    if args.draft_vocab > target.config.vocab_size:
        raise UsageError(
            f"--draft-vocab {args.draft_vocab}: the target has {target.config.vocab_size} "
            "tokens; give at most that many"
        )
    counts = torch.bincount(corpus.train.long(), minlength=target.config.vocab_size)
    head, vocab = starting_head(
        args, target, choose_vocabulary(counts, vocab_size), layer_ids, args.seed + 1
    )
    data_gen = torch.Generator().manual_seed(args.seed)
    eval_gen = torch.Generator().manual_seed(args.seed + 1000)
    windows = sample_batch(corpus.heldout, corpus.heldout_line_starts, 2 * batch, seq, eval_gen)
    eval_batches = [(w, run_teacher(target, w, head.capture, vocab)) for w in windows.split(batch)]

    def sample() -> tuple[torch.Tensor, Any]:
        ids = sample_batch(corpus.train, corpus.train_line_starts, batch, seq, data_gen)
        return ids, run_teacher(target, ids, head.capture, vocab)

    log: dict[str, Any] = {
        "target": "smoke (random)" if args.smoke else "relayc/assets/demo/target",
        "corpus": corpus.info,
        "batch": batch,
        "init": init_record(args),
        "seq": seq,
        "draft_vocab": {
            "size": vocab_size,
            "rule": "most frequent training bytes",
            "train_token_coverage": round(coverage(counts, vocab), 6),
            "heldout_target_argmax_outside": heldout_outside(head, eval_batches),
        },
        "curves": {},
    }
    out = train_and_store(
        args,
        target,
        head,
        sample,
        {"data_gen": data_gen},
        eval_batches,
        log,
    )
    if not (args.smoke or args.no_measure):
        prompts = heldout_prompts()
        runs: list[MeasureRun] = [
            ("none", "none", {}),
            ("eagle topk4 (num_draft_tokens 8)", "eagle", dict(MEASURE_SIZES)),
            ("eagle3 topk4 (num_draft_tokens 8)", "eagle3",
             {**MEASURE_SIZES, "draft_model": str(out)}),
            ("eagle3 topk1 (num_draft_tokens 4)", "eagle3",
             {"topk": 1, "num_draft_tokens": 4, "draft_model": str(out)}),
        ]  # fmt: skip
        from relayc.engine import Engine, SamplingParams

        params = SamplingParams(max_new_tokens=args.new_tokens)
        log["acceptance"] = {
            "prompts": "relayc/assets/demo/heldout_prompts.json",
            "count": len(prompts),
            "new_tokens": args.new_tokens,
            "runs": measure_runs(
                runs,
                lambda engine: engine.generate(prompts, params),
                lambda **kw: Engine(model=None, overlap=False, seed=0, **kw),
                NUM_STEPS,
            ),
        }
    return log


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = OneLineParser(prog=PROG, description=__doc__)
    p.add_argument("--target", choices=("toy", "smollm2"), required=True)
    p.add_argument(
        "--out",
        required=True,
        type=output_folder,
        help="where the head goes (config.json + safetensors)",
    )
    p.add_argument(
        "--work", required=True, type=output_folder, help="checkpoint / features folder (resumable)"
    )
    p.add_argument("--smoke", action="store_true", help="tiny sizes, a few steps (tests)")
    p.add_argument("--seed", type=int_in(0, MAX_SEED), default=0)
    p.add_argument("--threads", type=int_in(1, 4096), default=2)
    p.add_argument("--minutes", type=float_in(0.0), default=20.0, help="training time budget")
    p.add_argument("--steps", type=int_in(1), default=None, help="step cap (schedule over it)")
    p.add_argument("--lr", type=float_in(0.0), default=2e-3)
    p.add_argument("--save-every", type=float_in(0.0), default=3.0, help="minutes")
    p.add_argument("--eval-every", type=float_in(0.0), default=120.0, help="seconds")
    p.add_argument("--draft-vocab", type=int_in(1), default=None)
    p.add_argument("--corpus-bytes", type=int_in(1), default=8 << 20)
    p.add_argument("--data", default=None, type=corpus_folder, help="chat corpus folder (smollm2)")
    p.add_argument("--max-examples", type=int_in(1), default=None, help="chat examples used")
    p.add_argument("--batch", type=int_in(1), default=8, help="sequences a step")
    p.add_argument("--measure-dtype", choices=("float32", "bfloat16"), default=None)
    p.add_argument("--new-tokens", type=int_in(1), default=64)
    p.add_argument("--no-measure", action="store_true")
    p.add_argument(
        "--init",
        default=None,
        type=head_folder,
        help="start from this stored head (its weights and draft vocabulary) instead of a "
        "fresh one; a fresh optimizer and schedule fine-tune it (ignored when --work resumes)",
    )
    p.add_argument(
        "--revocab",
        action="store_true",
        help="with --init: choose the draft vocabulary from this run's data (--draft-vocab "
        "ids) and keep the stored head's LM-head rows for the ids it already had",
    )
    p.add_argument(
        "--features-only", action="store_true", help="smollm2: compute the features, then stop"
    )
    args = p.parse_args(argv)
    if args.draft_vocab is None:
        args.draft_vocab = 128 if args.target == "toy" else 8192
    if args.smoke:
        args.draft_vocab = 32
        args.steps = args.steps or 6
    if args.revocab and args.init is None:
        p.error("--revocab re-chooses the vocabulary of an --init head: give --init DIR")
    if args.target == "smollm2" and args.data is None and not args.smoke:
        p.error("--target smollm2 needs --data DIR (a relayc chat corpus: examples.jsonl)")
    return args


def _record_invocation(work: Path, argv: list[str] | None) -> list[dict[str, Any]]:
    """Every command that trained the head in ``work`` (a resumed run has several)."""
    work.mkdir(parents=True, exist_ok=True)
    path = work / "invocations.json"
    seen = read_json(path) if path.is_file() else []
    if not isinstance(seen, list):
        raise CheckpointError(f"holds a {type(seen).__name__}, not a list of runs; {FRESH}", path)
    words = sys.argv[1:] if argv is None else argv
    seen.append({"argv": " ".join(words), "started": time.strftime("%Y-%m-%d %H:%M:%S")})
    path.write_text(json.dumps(seen, indent=1) + "\n")
    return list(seen)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_command(PROG, lambda: _train(args, argv))


def _train(args: argparse.Namespace, argv: list[str] | None) -> int:
    torch.set_num_threads(1 if args.smoke else args.threads)
    torch.manual_seed(args.seed)
    start = time.perf_counter()
    invocations = _record_invocation(Path(args.work), argv)
    if args.target == "toy":
        log = run_toy(args)
    else:
        log = run_smollm2(args)
    log.update(
        seed=args.seed,
        smoke=args.smoke,
        torch=torch.__version__,
        python=sys.version.split()[0],
        threads=torch.get_num_threads(),
        argv=invocations[-1]["argv"],
        invocations=invocations,
        wall_minutes=round((time.perf_counter() - start) / 60, 2),
    )
    out = Path(args.out)
    (out / "training_log.json").write_text(json.dumps(log, indent=1) + "\n")
    card = out.parent / "MODEL_CARD.md"
    if args.target == "toy" and not args.smoke and card.is_file():
        update_demo_card(card, out / "training_log.json")
    elif args.target == "smollm2" and not args.smoke:
        card.write_text(smollm2_card(log))
    print(f"wrote {out} ({dir_bytes(out) / 1e6:.2f} MB)", flush=True)
    return 0
