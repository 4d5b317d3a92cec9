"""Acceptance measurement: greedy generation with the real ``Engine`` for every
speculative algorithm in ``ENGINE_RUNS`` on the held-out prompts, cross-checked by a
cache-free dense simulation of greedy chain speculative decoding (``simulate_chain``)
with the EAGLE and standalone chain proposers."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from relayc.engine.draft.eagle import EagleHead
from relayc.engine.draft.standalone import StandaloneDrafter
from relayc.engine.model.llama import LlamaForCausalLM
from relayc.engine.model.weights import load_checkpoint
from relayc.engine.text.bytes import BOS_ID
from relayc.tools.train.plan import MTP_STEPS


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
