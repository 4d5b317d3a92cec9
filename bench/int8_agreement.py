"""How close dtype "int8" stays to float32 on SmolLM2: top-1 agreement and perplexity.

    python bench/int8_agreement.py [--prompts 24] [--max-new-tokens 64] [--text docs/speculative.md]

Both precisions read the same Q4_1 file in one process (float32 over its blocks: exact;
int8: the integer dot products of relayc/engine/native/csrc/int8.c). On the held-out chat
prompts bench/peers.py uses (relayc/assets/chat):

- int8 -> float32: int8's greedy answers teacher-forced through float32, the share that is
  float32's top-1 (a top-2 gap under 1e-3 counts as agreeing) -- bench/peers.py's measure
  of llama.cpp, which multiplies with 8-bit activations too (about 97% on this file,
  docs/benchmarks.md);
- float32 -> int8: float32's greedy answers teacher-forced through int8, the same share;
- the share of answers that are identical token for token.

Then the perplexity of a held-out text (``--text``, prose written for this repository, in
windows of ``--window`` tokens) under each precision, and their ratio. Gates (issue #52):
agreement at least llama.cpp's (~97%), perplexity within 1% of float32's.
"""

from __future__ import annotations

import sys
from pathlib import Path

# this checkout's relayc, not the one the environment installed
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import math
import time

import torch

from relayc.engine import Engine, SamplingParams
from relayc.engine.model.scoring import teacher_forced_logprobs
from relayc.engine.serving.overlap import set_cpu_threads
from relayc.tools.demo import chat_prompts

ROOT = Path(__file__).resolve().parents[1]


def agreement(scorer: Engine, prompts: list[list[int]], outputs: list[list[int]]) -> float:
    """The share of ``outputs``' tokens that are ``scorer``'s top-1 given the tokens before
    them (near-ties, a top-2 gap under 1e-3, agree: bench/peers.py's rule)."""
    agree = total = 0
    for prompt, output in zip(prompts, outputs, strict=True):
        if not output:
            continue
        logp = teacher_forced_logprobs(scorer.model, prompt + output)[len(prompt) - 1 :]
        top2 = logp.topk(2, dim=-1)
        got = torch.tensor(output)
        tie = (top2.values[:, 0] - top2.values[:, 1]) < 1e-3
        agree += int(((top2.indices[:, 0] == got) | tie).sum())
        total += len(output)
    return agree / max(total, 1)


def perplexity(engine: Engine, ids: list[int], window: int) -> float:
    """exp(mean negative log-likelihood) of ``ids`` in windows of ``window`` tokens, each
    window scored from its own start (the first token of a window is not scored)."""
    nll, count = 0.0, 0
    for start in range(0, len(ids) - 1, window):
        chunk = ids[start : start + window]
        if len(chunk) < 2:
            break
        logp = teacher_forced_logprobs(engine.model, chunk)
        targets = torch.tensor(chunk[1:])
        nll -= float(logp.gather(1, targets[:, None]).sum())
        count += len(targets)
    return math.exp(nll / count)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=24, help="held-out chat prompts (max 24)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--text", type=Path, default=ROOT / "docs" / "speculative.md")
    parser.add_argument("--window", type=int, default=512)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    set_cpu_threads(args.threads)
    start = time.perf_counter()
    engines = {
        name: Engine("smollm2", dtype=name, max_batch_size=1) for name in ("float32", "int8")
    }
    chats = chat_prompts()[: args.prompts]
    prompts = [engines["float32"].encode(c) for c in chats]
    params = SamplingParams(max_new_tokens=args.max_new_tokens)
    outputs = {
        name: [o.token_ids for o in engine.generate(prompts, params)]
        for name, engine in engines.items()
    }
    same = sum(a == b for a, b in zip(outputs["float32"], outputs["int8"], strict=True))
    to_f32 = agreement(engines["float32"], prompts, outputs["int8"])
    to_int8 = agreement(engines["int8"], prompts, outputs["float32"])
    tokenizer = engines["float32"].tokenizer
    assert tokenizer is not None
    text = tokenizer.encode(args.text.read_text())
    ppl = {name: perplexity(engine, text, args.window) for name, engine in engines.items()}
    ratio = ppl["int8"] / ppl["float32"]
    print(
        f"SmolLM2-135M-Instruct (Q4_1 file), {len(prompts)} held-out chat prompts, up to "
        f"{args.max_new_tokens} greedy tokens; {args.text.name}: {len(text)} tokens in windows "
        f"of {args.window}; {time.perf_counter() - start:.0f} s"
    )
    print(f"{'measure':<52}{'value':>10}")
    rows = [
        ("int8's answers that are float32's top-1 (peers' rule)", f"{100 * to_f32:.1f}%"),
        ("float32's answers that are int8's top-1", f"{100 * to_int8:.1f}%"),
        ("answers identical token for token", f"{same}/{len(prompts)}"),
        (f"perplexity of {args.text.name}, float32", f"{ppl['float32']:.3f}"),
        (f"perplexity of {args.text.name}, int8", f"{ppl['int8']:.3f}"),
        ("int8 / float32 perplexity", f"{ratio:.4f}"),
    ]
    for name, value in rows:
        print(f"{name:<52}{value:>10}")
    ok = min(to_f32, to_int8) >= 0.97 and abs(ratio - 1) <= 0.01
    print(f"gates (agreement >= 97%, perplexity within 1%): {'met' if ok else 'NOT met'}")


if __name__ == "__main__":
    main()
