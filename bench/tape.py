"""Decode steps recorded and replayed (``graphs="tape"``) against eager (``"off"``), in one run.

One engine per mode over the same model, one request at a time (the issue's host-time
target), the modes alternated for ``--repeats`` rounds; each round generates
``--max-new-tokens`` for each of ``--prompts`` chat prompts. Printed per mode: the best
tokens/s, and per token the time outside the native library's calls (the scheduler, the
generated step, its ops and the replay; prefill included, one per prompt), median over the
rounds, and the process's cpu/wall so a starved round shows. The outputs must be identical.

    python bench/tape.py [--model smollm2] [--algorithm eagle3 --num-steps 3 --topk 1 \\
        --num-draft-tokens 4] [--dtype bfloat16] [--prompts 4] [--repeats 4]
"""

from __future__ import annotations

import sys
from pathlib import Path

# this checkout's relayc first, not an editable install's (an A/B from a git worktree)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import statistics
import time
from typing import Any

import torch
from engine import ForwardTimer, NativeTimer  # bench/, this script's folder

from relayc.engine import Engine, SamplingParams


class Inside(NativeTimer):
    """Wall time inside the native library's calls: bench/engine.py's compute calls and the
    two small ones a step may make, wrapped before any engine is built (so every recording
    holds the timed functions)."""

    FUNCTIONS = (*NativeTimer.FUNCTIONS, "relayc_norm_pair", "relayc_paged_meta")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--algorithm", default="none")
    parser.add_argument("--num-steps", type=int, default=3)
    parser.add_argument("--topk", type=int, default=1)
    parser.add_argument("--num-draft-tokens", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--modes", default="off,tape")
    args = parser.parse_args()
    torch.set_num_threads(1)
    inside = Inside(ForwardTimer())  # no forward is wrapped: every call counts
    if not inside.attach():
        raise SystemExit("the native library is off here: nothing to record")
    sizes: dict[str, int] = {}
    if args.algorithm != "none":
        sizes = {
            "num_steps": args.num_steps,
            "topk": args.topk,
            "num_draft_tokens": args.num_draft_tokens,
        }
    extra = {} if args.dtype is None else {"dtype": args.dtype}
    modes = args.modes.split(",")
    engines = {
        mode: Engine(
            model=args.model,
            algorithm=args.algorithm,
            graphs=mode,
            overlap=False,
            seed=0,
            **sizes,
            **extra,
        )
        for mode in modes
    }
    if args.model == "smollm2":
        from relayc.tools.demo import chat_prompts

        prompts: list[Any] = chat_prompts()[: args.prompts]
    else:
        prompts = [f"relay {i} stash resolve" for i in range(args.prompts)]
    params = SamplingParams(max_new_tokens=args.max_new_tokens)
    for engine in engines.values():
        engine.generate(prompts[:1], SamplingParams(max_new_tokens=4))  # record, warm up
    rows: dict[str, list[tuple[float, float, float]]] = {mode: [] for mode in modes}
    outputs: dict[str, list[list[int]]] = {}
    for _ in range(args.repeats):
        for mode, engine in engines.items():
            inside.seconds = 0.0
            cpu, wall = time.process_time(), time.perf_counter()
            got = [engine.generate([p], params)[0].token_ids for p in prompts]
            wall = time.perf_counter() - wall
            cpu = time.process_time() - cpu
            tokens = sum(len(t) for t in got)
            outputs[mode] = got
            rows[mode].append((tokens / wall, (wall - inside.seconds) / tokens * 1e6, cpu / wall))
    print(
        f"tape: model {args.model} ({next(iter(engines.values())).model.config.dtype}), "
        f"{args.algorithm} {sizes or ''}, {args.prompts} prompts x {args.max_new_tokens} "
        f"tokens one at a time, overlap off, best of {args.repeats}"
    )
    print(f"{'mode':<6} {'tokens/s':>9} {'outside native us/token':>24} {'cpu/wall':>18}")
    for mode in modes:
        best = max(r[0] for r in rows[mode])
        outside = statistics.median(r[1] for r in rows[mode])
        load = ", ".join(f"{r[2]:.2f}" for r in rows[mode])
        print(f"{mode:<6} {best:>9.1f} {outside:>24.0f}   {load}")
    if len(modes) == 2:
        a, b = modes
        print(f"{b}/{a}: tokens/s x{max(r[0] for r in rows[b]) / max(r[0] for r in rows[a]):.3f}")
    same = all(outputs[m] == outputs[modes[0]] for m in modes)
    print(f"outputs identical: {'yes' if same else 'NO'}")
    for mode, engine in engines.items():
        for runner in engine.algorithm.graphs.runners.values():
            if runner.tape_refusals:
                print(f"{mode}: refused buckets {runner.tape_refusals}")
        engine.close()


if __name__ == "__main__":
    main()
