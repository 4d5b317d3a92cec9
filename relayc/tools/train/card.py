"""The outputs of a run: ``MODEL_CARD.md`` (models, corpus, training, acceptance and how
to reproduce, rendered from the training log and the acceptance results),
``training_log.json`` and ``acceptance.json``."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from relayc.tools.train.corpus import PROMPT_BYTES
from relayc.tools.train.eagle3_card import update_demo_card
from relayc.tools.train.losses import STEP_WEIGHTS
from relayc.tools.train.plan import SUBDIRS, dir_bytes


def model_card(log: dict[str, Any], acceptance: dict[str, Any] | None) -> str:
    corpus = log["corpus"]
    models = log["models"]
    lines = [
        "# relayc demo models",
        "",
        "Tiny byte-level models for the reference engine's demos and tests, trained on the CPU by",
        "`python -m relayc.tools.train` (issue #8). They are toys: a few minutes of training on",
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
        "python -m relayc.tools.train --out relayc/assets/demo " + log["argv_tail"],
        "python -m relayc.tools.train --out relayc/assets/demo --measure-only  # acceptance + card",
        "```",
        "",
        "With time budgets the step counts and the (time-based) learning-rate schedule depend on",
        "the machine and its load, so a rerun gives similar, not identical, weights. `--steps-*`",
        "(with `--minutes-*` large enough) switch to a step-based schedule: seeded and",
        "reproducible on the same Python (same corpus hash) and torch build.",
        "",
    ]
    return "\n".join(lines)


def write_outputs(out: Path, log: dict[str, Any], acceptance: dict[str, Any] | None) -> None:
    log["shipped_bytes"] = sum(dir_bytes(out / name) for name in SUBDIRS)
    (out / "training_log.json").write_text(json.dumps(log, indent=1) + "\n")
    if acceptance is not None:
        (out / "acceptance.json").write_text(json.dumps(acceptance, indent=2) + "\n")
    (out / "MODEL_CARD.md").write_text(model_card(log, acceptance))
    log["shipped_bytes"] = dir_bytes(out)
    (out / "training_log.json").write_text(json.dumps(log, indent=1) + "\n")
    (out / "MODEL_CARD.md").write_text(model_card(log, acceptance))
    eagle3_log = out / "eagle3" / "training_log.json"
    if eagle3_log.is_file():  # the EAGLE-3 head trains separately (eagle3_cli); keep its part
        update_demo_card(out / "MODEL_CARD.md", eagle3_log)
