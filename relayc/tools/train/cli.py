"""The command line (``python -m relayc.tools.train``): argument parsing, the training
run (corpus and prompts, then the target, the EAGLE head, the multi-layer EAGLE (MTP)
drafter and the standalone draft model, each stored in float16 and reloaded before
use), the acceptance measurement and the written outputs."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from relayc.engine.draft.eagle import EagleHead
from relayc.engine.draft.mtp import MtpDrafter
from relayc.engine.draft.standalone import StandaloneDrafter
from relayc.engine.errors import CheckpointError
from relayc.engine.model.llama import LlamaForCausalLM
from relayc.engine.model.weights import load_checkpoint, save_checkpoint
from relayc.specs.errors import OneLineParser, did_you_mean
from relayc.tools.args import MAX_SEED, float_in, int_in
from relayc.tools.train.card import write_outputs
from relayc.tools.train.corpus import assemble_corpus, heldout_prompts, sample_batch
from relayc.tools.train.loop import draft_eval, prompt_loss, target_heldout_loss, train_loop
from relayc.tools.train.losses import (
    eagle_losses,
    mtp_losses,
    run_target,
    standalone_losses,
    weighted,
)
from relayc.tools.train.measure import measure_acceptance
from relayc.tools.train.options import output_folder, run_command
from relayc.tools.train.plan import (
    MTP_STEPS,
    SUBDIRS,
    _config_summary,
    count_params,
    dir_bytes,
    full_plan,
    init_for_training,
    model_record,
    smoke_plan,
    store_half,
)
from relayc.tools.train.work import read_json, require


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
        "loader": "relayc.engine.model.weights.load_checkpoint",
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
            **model_record(module, out / name, record, final),
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


# The package docstring (relayc/tools/train/__init__.py) tells the whole story; the
# package imports this module, so the one-line summary is kept here rather than read back.
DESCRIPTION = "Train the tiny demo models shipped in relayc/assets/demo on the CPU."
PROG = "python -m relayc.tools.train"
# The first word after the module picks a command; --help lists them, one line each.
COMMANDS = {
    "eagle3": "train an EAGLE-3 head (demo target or SmolLM2)",
    "dflash": "train a DFlash drafter (demo target or SmolLM2)",
}
USAGE = f"{PROG} [--help] {{{','.join(COMMANDS)}}} ...\n       {PROG} --out DIR [options]"
EPILOG = "\n".join(
    [
        "commands (the first word; each has its own --help):",
        f"  {'(none)':<8}  train the demo models (target, EAGLE, MTP, standalone): options above",
        *(f"  {name:<8}  {summary}: {name} --help" for name, summary in COMMANDS.items()),
    ]
)


def _argv_tail(args: argparse.Namespace) -> str:
    parts = [] if not args.smoke else ["--smoke"]
    for name in SUBDIRS:
        minutes = getattr(args, f"minutes_{name}")
        parts.append(f"--minutes-{name.replace('_', '-')} {minutes:g}")
    parts.append(f"--seed {args.seed}")
    if not args.smoke:
        parts.append(f"--target-layers {args.target_layers}")
    return " ".join(parts)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = OneLineParser(
        prog=PROG,
        usage=USAGE,
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    if argv and not argv[0].startswith("-"):
        hint = did_you_mean(argv[0], COMMANDS)
        p.error(
            f"no command {argv[0]!r}: give one of {', '.join(COMMANDS)}, or options only for "
            f"the demo models{'; ' + hint if hint else ''}"
        )
    p.add_argument(
        "--out",
        required=True,
        type=output_folder,
        help="output directory (e.g. relayc/assets/demo)",
    )
    p.add_argument("--smoke", action="store_true", help="tiny sizes, a few steps (tests)")
    p.add_argument("--seed", type=int_in(0, MAX_SEED), default=0)
    p.add_argument("--threads", type=int_in(1, 4096), default=2, help="torch CPU threads")
    # Depth: a one-layer draft head step costs about one target layer, so speculation pays
    # off only when that is a small fraction of a target forward (README, demo models).
    p.add_argument("--target-layers", type=int_in(1, 1024), default=6)
    p.add_argument("--corpus-bytes", type=int_in(1), default=8 << 20, help="corpus cap (bytes)")
    # The shipped models' budgets (MODEL_CARD.md): about 70 minutes on two cores.
    defaults = {"target": 45.0, "eagle": 10.0, "eagle_multilayer": 9.0, "standalone": 5.0}
    for name, minutes in defaults.items():
        flag = name.replace("_", "-")
        p.add_argument(
            f"--minutes-{flag}", dest=f"minutes_{name}", type=float_in(0.0), default=minutes
        )
        p.add_argument(f"--steps-{flag}", dest=f"steps_{name}", type=int_in(1), default=None)
    p.add_argument(
        "--minutes-mtp",
        dest="minutes_eagle_multilayer",
        type=float_in(0.0),
        default=argparse.SUPPRESS,
    )
    p.add_argument("--no-measure", action="store_true", help="skip the engine acceptance runs")
    p.add_argument(
        "--measure-only", action="store_true", help="re-measure acceptance, rewrite card"
    )
    p.add_argument("--new-tokens", type=int_in(1), default=64)
    args = p.parse_args(argv)
    log = Path(args.out) / "training_log.json"
    if args.measure_only and not log.is_file():
        p.error(f"--measure-only needs {log} from an earlier training run")
    return args


def main(argv: list[str] | None = None) -> int:
    """``python -m relayc.tools.train``: a command of ``COMMANDS`` when the first word names
    one, else the demo models."""
    words = sys.argv[1:] if argv is None else list(argv)
    if words and words[0] == "eagle3":
        from relayc.tools.train.eagle3_cli import main as eagle3_main

        return eagle3_main(words[1:])
    if words and words[0] == "dflash":
        from relayc.tools.train.dflash_cli import main as dflash_main

        return dflash_main(words[1:])
    args = parse_args(words)
    return run_command(PROG, lambda: _train_demo(args), resumable=False)


def _train_demo(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if args.measure_only:
        torch.set_num_threads(args.threads)
        log = read_json(out / "training_log.json")
        if not isinstance(log, dict):
            raise CheckpointError(
                "is not a JSON object; rerun the training", out / "training_log.json"
            )
        # what the model card reads back, checked before the minutes of measuring
        require(log, LOG_FIELDS, out / "training_log.json")
    else:
        log = run_training(args)
        write_outputs(out, log, None)
    if args.measure_only or not (args.no_measure or args.smoke):
        write_outputs(out, log, measure_acceptance(out, _prompt_texts(out), args.new_tokens))
    print(f"wrote {out} ({dir_bytes(out) / 1e6:.2f} MB)", flush=True)
    return 0


LOG_FIELDS: dict[str, type | tuple[type, ...]] = {
    "corpus": dict, "models": dict, "curves": dict, "prompts": dict, "seed": int, "torch": str,
    "threads": int, "batch": int, "seq": int, "argv_tail": str,
}  # fmt: skip


def _prompt_texts(out: Path) -> list[str]:
    """The held-out prompts a training run wrote into ``out``."""
    path = out / "heldout_prompts.json"
    record = read_json(path)
    prompts = record.get("prompts") if isinstance(record, dict) else None
    if not isinstance(prompts, list) or not all(
        isinstance(p, dict) and isinstance(p.get("text"), str) for p in prompts
    ):
        raise CheckpointError(
            'needs `prompts`, a list of {"text": ...} records; rerun the training without '
            "--measure-only to write it again",
            path,
        )
    return [p["text"] for p in prompts]
