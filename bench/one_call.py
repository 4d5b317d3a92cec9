"""A decode or verify forward in one native call against the calls made one by one.

    python bench/one_call.py [--algorithm none] [--prompts 8] [--max-new-tokens 32]
                             [--rounds 6] [--num-steps 1 --num-draft-tokens 2] [--dtype float32]
                             [--switch forward|draft|both]

Loads SmolLM2-135M once (the engine's defaults: float32 over the GGUF file's blocks, one
thread, overlap off so every op runs on the calling thread) and runs the same greedy
workload -- ``--prompts`` of the held-out chat prompts, one request at a time -- with the
one-call paths on, and with them off, round robin for ``--rounds`` rounds in one process:
``relayc.engine.decoder.fused_forward`` (the target's decodes and verifies; off, the attention
metadata, the layers and the head are called one by one with the Python between them) and,
for ``eagle3``, ``relayc.engine.draft.native_draft`` (the head's draft extend and greedy
chain; off, step by step). ``--switch`` picks which of the two the second side turns off.

Prints, per side, the best and median tokens/s, the median time an iteration spent
outside the native library's compute calls (all the Python of the step, inside the
forwards and between them) and inside them, and the process CPU time over the wall time of
its best run (well under 1: the machine was busy). The outputs of both sides must be
identical.
"""

from __future__ import annotations

import sys
from pathlib import Path

# this checkout's relayc, not the one the environment installed (an editable install points
# at another checkout: a worktree's benchmark would otherwise time the main tree's code)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import statistics
import time
from typing import Any

import torch
from engine import ForwardTimer, NativeTimer  # bench/, this script's folder

from relayc.engine import Engine, SamplingParams
from relayc.engine.decoder.fused_forward import FusedForward
from relayc.engine.draft.native_draft import NativeDraft
from relayc.tools.demo import chat_prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--algorithm", default="none")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--num-steps", type=int, default=1)
    parser.add_argument("--topk", type=int, default=1)
    parser.add_argument("--num-draft-tokens", type=int, default=2)
    parser.add_argument(
        "--switch",
        choices=("forward", "draft", "both"),
        default="both",
        help="what the 'one by one' side turns off: the target's one-call forward, the "
        "EAGLE-3 head's one-call extend and chain, or both",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    sizes: dict[str, Any] = {}
    if args.algorithm not in ("none", "ngram"):
        sizes = {
            "num_steps": args.num_steps,
            "topk": args.topk,
            "num_draft_tokens": args.num_draft_tokens,
        }
    engine = Engine(
        model="smollm2", dtype=args.dtype, algorithm=args.algorithm, overlap=False, seed=0, **sizes
    )
    # the native library's compute calls (no forward is timed: every call counts alike)
    clock = NativeTimer(ForwardTimer())
    if not clock.attach():
        raise SystemExit("the native library does not build here: nothing to compare")
    prompts = chat_prompts()[: args.prompts]
    params = SamplingParams(max_new_tokens=args.max_new_tokens)
    takes, chain, extend = FusedForward.takes, NativeDraft.chain, NativeDraft.extend
    engine.generate(prompts[:1], SamplingParams(max_new_tokens=4))  # warm up
    # per run: tokens/s, us an iteration outside and inside the compute calls, cpu/wall
    runs: dict[str, list[tuple[float, float, float, float]]] = {"one call": [], "one by one": []}
    outputs: dict[str, list[list[int]]] = {}
    try:
        for _ in range(args.rounds):
            for side in runs:
                off = side == "one by one"
                FusedForward.takes = (  # type: ignore[method-assign]
                    staticmethod(lambda batch, layers: False)
                    if off and args.switch != "draft"
                    else takes
                )
                step_by_step = off and args.switch != "forward"
                NativeDraft.chain = (  # type: ignore[method-assign]
                    (lambda self, *rest: None) if step_by_step else chain
                )
                NativeDraft.extend = (  # type: ignore[method-assign]
                    (lambda self, *rest: None) if step_by_step else extend
                )
                stats = engine.scheduler.stats
                iterations, native_s = stats.iterations, clock.seconds
                start, cpu = time.perf_counter(), time.process_time()
                outs = [o for prompt in prompts for o in engine.generate([prompt], params)]
                wall, cpu = time.perf_counter() - start, time.process_time() - cpu
                iters = engine.scheduler.stats.iterations - iterations
                inside_us = (clock.seconds - native_s) / iters * 1e6
                outside_us = wall / iters * 1e6 - inside_us
                tokens = sum(len(o.token_ids) for o in outs)
                runs[side].append((tokens / wall, outside_us, inside_us, cpu / wall))
                outputs.setdefault(side, [o.token_ids for o in outs])
    finally:
        FusedForward.takes = takes  # type: ignore[method-assign]
        NativeDraft.chain = chain  # type: ignore[method-assign]
        NativeDraft.extend = extend  # type: ignore[method-assign]
        engine.close()
    print(
        f"SmolLM2-135M {args.dtype}, algorithm {args.algorithm} {sizes or ''}, "
        f"{len(prompts)} chat prompts x {args.max_new_tokens} tokens one at a time, "
        f"{args.rounds} rounds round robin; 'one by one' turns off: {args.switch}"
    )
    print(
        f"{'side':<12} {'best tok/s':>10} {'median':>8} {'outside native':>15} "
        f"{'inside native':>14} cpu/wall  (us an iteration: medians)"
    )
    for side, results in runs.items():
        best = max(results)
        print(
            f"{side:<12} {best[0]:>10.1f} {statistics.median(r[0] for r in results):>8.1f} "
            f"{statistics.median(r[1] for r in results):>15.0f} "
            f"{statistics.median(r[2] for r in results):>14.0f} {best[3]:>8.2f}"
        )
    ratio = max(runs["one call"])[0] / max(runs["one by one"])[0]
    print(f"one call / one by one, best tokens/s: x{ratio:.3f}")
    print(f"outputs identical: {'yes' if outputs['one call'] == outputs['one by one'] else 'NO'}")


if __name__ == "__main__":
    main()
