"""``python -m relayc.tools.train dflash --target toy|smollm2 --out DIR --work DIR``: train a
DFlash drafter (``relayc.tools.train.dflash``), store it in the public DFlash layout
(float16 tensors), reload it, measure its acceptance with the real ``Engine`` beside
``none`` and write its model card.

Corpora (each example a prompt and the target's own greedy answer):

- ``smollm2``: the self-distilled chat corpus (``relayc.tools.train.chat_corpus``,
  ``--data DIR``), every 50th example held out;
- ``toy``: the shipped byte-level target's answers to windows of its standard-library
  corpus (``relayc.tools.train.corpus``), generated here once into ``--work``.

Seeded and resumable: ``--work`` keeps the features, the toy examples and the training
checkpoint; the same command continues an interrupted run (raise ``--minutes`` to train
on). ``--smoke`` trains a tiny random target's drafter for a few steps (tests).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch

from relayc.engine.draft.dflash import DFlashDrafter
from relayc.engine.draft.weights import init_module_random
from relayc.engine.errors import CheckpointError
from relayc.engine.model.llama import LlamaForCausalLM
from relayc.engine.model.weights import read_json_object, reading_safetensors
from relayc.specs.errors import OneLineParser, UsageError
from relayc.tools.args import MAX_SEED, float_in, int_in
from relayc.tools.train.dflash import (
    DFlashRecipe,
    TrainVocab,
    agreement,
    check_checkpoint,
    train_dflash,
    warm_start,
)
from relayc.tools.train.eagle3_chat import CHAT_PROMPTS, compute_features, read_corpus
from relayc.tools.train.eagle3_measure import MeasureRun, measure_runs
from relayc.tools.train.options import (
    check_layer_ids,
    corpus_folders,
    head_folder,
    layer_ids,
    layer_offsets,
    output_folder,
    run_command,
)
from relayc.tools.train.work import FRESH, read_json

PROG = "python -m relayc.tools.train dflash"
HOLDOUT_EVERY = 50
SHAPE_FLAGS = "--layers, --block-size and --target-layer-ids"  # what shapes the drafter
TOY_MASK = 258  # the byte-level vocabulary's PAD: never in text
SMOLLM2_MASK = "<empty_output>"  # a special token chat never uses
TOY_PROMPT_BYTES, TOY_ANSWER_TOKENS = 96, 160


def _toy_examples(
    target: LlamaForCausalLM, count: int, seed: int, work: Path
) -> list[dict[str, Any]]:
    """``count`` windows of the standard-library corpus (training part) answered greedily by
    the target; cached in ``work``."""
    from relayc.engine import Engine, SamplingParams
    from relayc.tools.train.corpus import assemble_corpus, sample_batch

    path = work / f"toy-examples-{count}-{seed}.json"
    if path.is_file():
        return _cached_examples(path, count, target.config.vocab_size)
    corpus = assemble_corpus(8 << 20)
    gen = torch.Generator().manual_seed(seed)
    windows = sample_batch(corpus.train, corpus.train_line_starts, count, TOY_PROMPT_BYTES, gen)
    prompts = windows.tolist()
    params = SamplingParams(max_new_tokens=TOY_ANSWER_TOKENS, ignore_eos=True)
    with Engine(target, overlap=False, max_batch_size=64) as engine:
        outs = engine.generate(prompts, params)
    examples = [
        {"index": i, "prompt_ids": p, "answer_ids": o.token_ids}
        for i, (p, o) in enumerate(zip(prompts, outs, strict=True))
    ]
    work.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(examples))
    return examples


def _cached_examples(path: Path, count: int, vocab_size: int) -> list[dict[str, Any]]:
    """The examples an earlier run cached in ``path``: ``count`` records of token ids below
    ``vocab_size``, else a ``CheckpointError`` naming the file."""
    examples = read_json(path)
    if not isinstance(examples, list) or len(examples) != count:
        raise CheckpointError(f"does not hold the {count} examples its name says; {FRESH}", path)
    for number, example in enumerate(examples):
        ids = (
            [example.get(k) for k in ("prompt_ids", "answer_ids")]
            if isinstance(example, dict)
            else [None]
        )
        if not all(
            isinstance(part, list) and all(type(t) is int and 0 <= t < vocab_size for t in part)
            for part in ids
        ):
            raise CheckpointError(
                f"example {number} needs `prompt_ids` and `answer_ids`, lists of token ids "
                f"in 0..{vocab_size - 1}; {FRESH}",
                path,
            )
    return examples


def _target(
    args: argparse.Namespace, work: Path
) -> tuple[LlamaForCausalLM, list[dict[str, Any]], dict[str, Any], int]:
    """The target, its examples, their provenance and the mask token id."""
    if args.smoke:
        from relayc.engine.core.config import ModelConfig
        from relayc.engine.model.weights import random_model

        config = ModelConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_layers=6,
                             num_heads=2, num_kv_heads=1, head_dim=16, max_position=512)  # fmt: skip
        target = random_model(config, seed=args.seed)
        gen = torch.Generator().manual_seed(args.seed)
        examples = [
            {
                "index": i,
                "prompt_ids": torch.randint(300, (12,), generator=gen).tolist(),
                "answer_ids": torch.randint(40, (24,), generator=gen).tolist(),
            }
            for i in range(2 * HOLDOUT_EVERY)
        ]
        return target, examples, {"corpus": "smoke (random ids)"}, 299
    if args.target == "toy":
        from relayc.engine.checkpoints.shipped import shipped_target
        from relayc.engine.model.weights import load_checkpoint

        source = shipped_target()
        if source is None:
            raise UsageError(
                "the shipped demo target is missing (relayc/assets/demo/target): reinstall "
                "relayc, or use --target smollm2 or --smoke"
            )
        target = load_checkpoint(source)
        examples = _toy_examples(target, args.examples, args.seed, work)
        info = {
            "corpus": f"{len(examples)} windows of {TOY_PROMPT_BYTES - 1} bytes (after <bos>) "
            "from the standard-library corpus's training files (relayc.tools.train.corpus, "
            f"seed {args.seed}), each answered by the target: {TOY_ANSWER_TOKENS} greedy bytes",
            "python": platform.python_version(),
        }
        return target, examples, info, TOY_MASK
    from relayc.engine.checkpoints.loader import load_model

    loaded = load_model("smollm2", device=torch.device("cpu"), dtype=torch.float32)
    if args.data is None:
        raise UsageError("--target smollm2 needs --data DIR (a chat corpus folder: examples.jsonl)")
    chats: list[dict[str, Any]] = []
    infos: list[dict[str, Any]] = []
    for folder in args.data.split(","):  # several corpora (other prompt seeds) in order
        part, part_info = read_corpus(Path(folder), args.max_examples)
        chats += part
        infos.append(part_info)
    corpora: dict[str, Any] = {"corpora": infos}
    tokenizer = loaded.tokenizer
    mask = tokenizer.encode(SMOLLM2_MASK) if tokenizer is not None else []
    if len(mask) != 1:
        raise CheckpointError(f"SmolLM2's tokenizer has no single token {SMOLLM2_MASK!r}")
    return loaded.model, chats, corpora, mask[0]


def _measure(args: argparse.Namespace, out: Path, target: LlamaForCausalLM) -> dict[str, Any]:
    """Greedy acceptance on the held-out prompts: ``none``, then the stored drafter."""
    from relayc.engine import Engine, SamplingParams

    params = SamplingParams(max_new_tokens=args.new_tokens)
    runs: list[MeasureRun] = [("none", "none", {}), ("dflash", "dflash", {"draft_model": str(out)})]
    if args.target == "smollm2":
        prompts: list[Any] = [
            [{"role": "user", "content": p["content"]}]
            for p in json.loads(CHAT_PROMPTS.read_text())["prompts"]
        ]
        where = "relayc/assets/chat/heldout_chat_prompts.json"

        def generate(engine: Any) -> list[Any]:
            return list(engine.chat(prompts, params))

        def make(**kw: Any) -> Any:
            return Engine(model="smollm2", dtype="float32", overlap=False, seed=0, **kw)

    else:
        from relayc.engine.checkpoints.shipped import heldout_prompts

        prompts = heldout_prompts()
        where = "relayc/assets/demo/heldout_prompts.json"

        def generate(engine: Any) -> list[Any]:
            return list(engine.generate(prompts, params))

        def make(**kw: Any) -> Any:
            return Engine(target, overlap=False, seed=0, **kw)

    width = DFlashDrafter.load(out, target).block_size
    return {
        "prompts": where,
        "count": len(prompts),
        "new_tokens": args.new_tokens,
        "runs": measure_runs(
            runs,
            generate,
            lambda **kw: make(**{k: v for k, v in kw.items() if k != "num_steps"}),
            width - 1,
        ),
    }


def _fc_from(source: str | None, drafter: DFlashDrafter) -> dict[str, torch.Tensor] | None:
    """An EAGLE-3 head's feature fusion (``fc`` and ``hidden_norm``), checked against the
    drafter's tapped layers and shapes, or None."""
    if source is None:
        return None
    from safetensors.torch import load_file

    from relayc.engine.draft.eagle3 import LAYER_IDS_KEY

    folder = Path(source)
    config = read_json_object(folder / "config.json")
    eagle_config = config.get("eagle_config")
    ids = eagle_config.get(LAYER_IDS_KEY) if isinstance(eagle_config, dict) else None
    if ids != list(drafter.settings.target_layer_ids):
        raise UsageError(
            f"--init-fc {folder}: its head taps layers {ids}, the drafter "
            f"{list(drafter.settings.target_layer_ids)}; pass --target-layer-ids to match"
        )
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(folder.glob("*.safetensors")):
        with reading_safetensors(file):
            tensors.update(load_file(file))
    picked: dict[str, torch.Tensor] = {k: tensors[k].float() for k in ("fc.weight", "midlayer.hidden_norm.weight")
              if k in tensors}  # fmt: skip
    want = {"fc.weight": tuple(drafter.fc.weight.shape),
            "midlayer.hidden_norm.weight": tuple(drafter.hidden_norm.weight.shape)}  # fmt: skip
    for key, shape in want.items():
        if key not in picked or tuple(picked[key].shape) != shape:
            raise CheckpointError(
                f"--init-fc needs {key} of shape {shape} (an EAGLE-3 head over the drafter's "
                "target and tapped layers)",
                folder,
            )
    return picked


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    work, out = Path(args.work), Path(args.out)
    started = time.time()
    target, examples, corpus_info, mask_id = _target(args, work)
    target.requires_grad_(False)
    target.eval()
    layers = target.config.num_layers
    if args.target_layer_ids:
        check_layer_ids("--target-layer-ids", args.target_layer_ids, layers)
    ids = tuple(args.target_layer_ids) if args.target_layer_ids else None
    drafter = DFlashDrafter.random(
        target,
        args.seed,
        num_layers=args.layers,
        block_size=args.block_size,
        mask_token_id=mask_id,
        target_layer_ids=ids,
    )
    init_module_random(drafter, args.seed, std=0.02)
    if len(args.init_layers) > args.layers or any(
        not -layers <= i < layers for i in args.init_layers
    ):
        raise UsageError(
            f"--init-layers {args.init_layers}: at most {args.layers} target layers (the "
            f"draft's), each in -{layers}..{layers - 1} (the target has {layers})"
        )
    init_layers = [i % layers for i in args.init_layers]  # -1: the last target layer
    warm_start(drafter, target, init_layers, _fc_from(args.init_fc, drafter))
    drafter.settings = dataclasses.replace(drafter.settings, num_target_layers=layers)
    check_checkpoint(drafter, work, SHAPE_FLAGS)  # a mismatch, before the features are made
    rows = compute_features(target, examples, drafter.capture, work / "features")
    train = [r for i, r in enumerate(rows) if i % HOLDOUT_EVERY != HOLDOUT_EVERY - 1]
    heldout = [r for i, r in enumerate(rows) if i % HOLDOUT_EVERY == HOLDOUT_EVERY - 1]
    vocab_size = target.config.vocab_size
    vocab = (
        TrainVocab.of(train, vocab_size, args.train_vocab)
        if 0 < args.train_vocab < vocab_size
        else None
    )
    recipe = DFlashRecipe(
        lr=args.lr,
        minutes=args.minutes,
        max_steps=args.steps,
        examples_per_step=args.examples_per_step,
        anchors_per_example=args.anchors,
    )

    def evaluate(step: int) -> dict[str, Any]:
        result = agreement(drafter, heldout, drafter.block_size, args.seed + 7)
        print(f"[{time.strftime('%H:%M:%S')}] held-out at step {step}: {result}", flush=True)
        return result

    log = train_dflash(drafter, train, recipe, work, seed=args.seed, on_eval=evaluate,
                       eval_every=args.eval_every, vocab=vocab,
                       shape_flags=SHAPE_FLAGS)  # fmt: skip
    final = evaluate(log["steps"])
    # drafts are scored over what the drafter was trained to tell apart (draft_vocab.json)
    drafter.set_draft_vocab(None if vocab is None else vocab.tokens)
    drafter.save(out, dtype=torch.float16)
    record: dict[str, Any] = {
        "target": args.target if not args.smoke else "smoke",
        "corpus": corpus_info,
        "examples": {"train": len(train), "heldout": len(heldout)},
        "drafter": {
            "layers": args.layers,
            "block_size": drafter.block_size,
            "target_layer_ids": list(drafter.settings.target_layer_ids),
            "mask_token_id": mask_id,
            "parameters": sum(p.numel() for p in drafter.parameters()),
            "warm_start": {"target_layers": init_layers, "fc_from": args.init_fc},
            "train_vocab": None if vocab is None else int(vocab.tokens.numel()),
        },
        "recipe": {**vars(recipe)},
        "seed": args.seed,
        "threads": args.threads,
        "torch": torch.__version__,
        "training": {
            k: log[k] for k in ("steps", "train_seconds", "invocations", "losses", "evals")
        },
        "heldout_agreement": final,
        "wall_seconds_this_invocation": round(time.time() - started, 1),
    }
    if not args.smoke and not args.no_measure:
        record["acceptance"] = _measure(args, out, target)
    record["command"] = "python -m relayc.tools.train dflash " + " ".join(args.argv)
    (out / "training_log.json").write_text(json.dumps(record, indent=1) + "\n")
    (out / "MODEL_CARD.md").write_text(model_card(record))
    return record


def model_card(record: dict[str, Any]) -> str:
    """The drafter's model card, from its training log."""
    d, t, a = record["drafter"], record["training"], record["heldout_agreement"]
    lines = [
        f"# DFlash drafter for the {record['target']} target",
        "",
        "Loads with `relayc.engine.draft.DFlashDrafter.load(dir, target)`; "
        '`Engine(algorithm="dflash")` selects it for its target (`draft_model=None`). '
        "Public DFlash layout (`config.json` with `dflash_config`, float16 safetensors); the "
        "embedding and LM head are the target's.",
        "",
        f"- Drafter: {d['layers']} layers, block size {d['block_size']}, target layers "
        f"{d['target_layer_ids']} (outputs), mask token id {d['mask_token_id']}, "
        f"{d['parameters']:,} parameters.",
        *(
            [
                f"- Draft vocabulary: {d['train_vocab']} target tokens (`draft_vocab.json`: the "
                "training answers' labels, then the most frequent argmax tokens); training "
                "scored them and drafts are scored over them (the target still verifies "
                "every token). Warm start: "
                f"{json.dumps(d.get('warm_start'))}."
            ]
            if d.get("train_vocab")
            else []
        ),
        f"- Corpus: {json.dumps(record['corpus'])}.",
        f"- Examples: {record['examples']['train']} training, {record['examples']['heldout']} "
        "held out (every 50th).",
        f"- Recipe: {json.dumps(record['recipe'])}.",
        f"- Training: seed {record['seed']}, torch {record['torch']}, {record['threads']} CPU "
        f"thread(s) on a shared 2-vCPU machine, {t['steps']} steps, "
        f"{t['train_seconds'] / 60:.1f} training minutes in {t['invocations']} invocation(s); "
        f"the last invocation took {record['wall_seconds_this_invocation'] / 60:.1f} minutes "
        "of wall time in all (examples, features, training, evaluation).",
        "",
        "Held-out top-1 agreement with the target's argmax per block position (1 = the first "
        "draft after the bonus token), and the accept length it implies:",
        "",
        "| "
        + " | ".join(f"pos {i + 1}" for i in range(len(a["top1_per_position"])))
        + " | expected accept length |",
        "|" + "---|" * (len(a["top1_per_position"]) + 1),
        "| "
        + " | ".join(f"{x:.3f}" for x in a["top1_per_position"])
        + f" | {a['expected_accept_length']:.2f} |",
    ]
    measured = record.get("acceptance")
    if measured:
        lines += [
            "",
            f"Acceptance with the real `Engine`, greedy, {measured['new_tokens']} new tokens for "
            f"each of the {measured['count']} prompts of `{measured['prompts']}` (never trained "
            "on), overlap off. Accept length = tokens per verify (accepted drafts + the bonus); "
            "accepted at position k = the fraction of verifies whose k-th draft was accepted.",
            "",
            "| run | mean accept length | accepted at position 1.. | verifies | identical to `none` |",
            "|---|---|---|---|---|",
        ]
        for label, run in measured["runs"].items():
            if label == "none":
                continue
            depth = ", ".join(f"{x:.3f}" for x in run["accepted_at_depth"])
            lines.append(
                f"| {label} | {run['mean_accept_length']:.2f} | {depth} | {run['verifies']} | "
                f"{'yes' if run['identical_to_none'] else 'NO'} |"
            )
    lines += ["", "Reproduce (resumable; `--work` keeps the checkpoint):", "", "```",
              record["command"], "```", ""]  # fmt: skip
    return "\n".join(lines)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = OneLineParser(prog=PROG, description=__doc__)
    p.add_argument("--target", choices=("toy", "smollm2"), default="toy")
    p.add_argument(
        "--out",
        required=True,
        type=output_folder,
        help="where the drafter goes (config.json + safetensors)",
    )
    p.add_argument(
        "--work",
        required=True,
        type=output_folder,
        help="features, examples and the checkpoint (resumed)",
    )
    p.add_argument(
        "--data",
        default=None,
        type=corpus_folders,
        help="smollm2: the chat corpus directory (or several, a,b)",
    )
    p.add_argument("--max-examples", type=int_in(1), default=None)
    p.add_argument("--examples", type=int_in(2), default=2000, help="toy: examples to generate")
    p.add_argument("--layers", type=int_in(1, 16), default=2, help="draft layers")
    p.add_argument("--block-size", type=int_in(2, 64), default=8)
    p.add_argument(
        "--target-layer-ids",
        type=layer_ids,
        default=None,
        help="target layers whose outputs the drafter reads, e.g. 0,2,4 (default: spread)",
    )
    p.add_argument(
        "--init-layers",
        type=layer_offsets,
        default=[],
        help="target layers the draft layers start from (e.g. -2,-1), else random",
    )
    p.add_argument(
        "--init-fc",
        default=None,
        type=head_folder,
        help="an EAGLE-3 head whose fc/hidden_norm seed ours",
    )
    p.add_argument(
        "--train-vocab",
        type=int_in(0),
        default=0,
        help="score training steps over the corpus's labels plus the most frequent tokens, "
        "this many in all (0: the whole vocabulary)",
    )
    p.add_argument("--minutes", type=float_in(0.0), default=30.0)
    p.add_argument("--steps", type=int_in(1), default=None, help="a step cap instead of minutes")
    p.add_argument("--lr", type=float_in(0.0), default=6e-4)
    p.add_argument("--examples-per-step", type=int_in(1), default=4)
    p.add_argument("--anchors", type=int_in(1), default=16, help="blocks per example a step")
    p.add_argument("--eval-every", type=float_in(1.0), default=600.0, help="seconds")
    p.add_argument("--new-tokens", type=int_in(1), default=64)
    p.add_argument("--threads", type=int_in(1, 4096), default=2)
    p.add_argument("--seed", type=int_in(0, MAX_SEED), default=0)
    p.add_argument("--no-measure", action="store_true")
    p.add_argument("--smoke", action="store_true", help="a tiny random target, a few steps")
    args = p.parse_args(argv)
    args.argv = list(argv)
    if args.smoke and args.steps is None:
        args.steps = 6
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)

    def body() -> int:
        record = run(args)
        print(json.dumps({k: record[k] for k in ("drafter", "heldout_agreement")}, indent=1))
        return 0

    return run_command(PROG, body)
