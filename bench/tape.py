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


class Iterations:
    """Per decode iteration (a scheduler step with nothing to prefill): its wall time, the
    part inside native calls and the part inside a recorded step's replay (its ATen ops, its
    native calls and the loop between them) -- the host's time between forwards is the
    rest. Wraps ``Scheduler.step`` and ``Tape.replay`` on their classes."""

    def __init__(self, inside: Inside) -> None:
        from relayc.engine.serving.scheduler import Scheduler
        from relayc.runtime.tape import Tape

        self.rows: list[tuple[float, float, float]] = []  # wall, native, replay (seconds)
        replayed = [0.0]
        step, replay = Scheduler.step, Tape.replay

        def timed_replay(tape: Tape) -> bool:
            start = time.perf_counter()
            try:
                return replay(tape)
            finally:
                replayed[0] += time.perf_counter() - start

        def timed_step(scheduler: Scheduler) -> Any:
            if scheduler.prefilling or scheduler.waiting:
                return step(scheduler)
            native, rep, start = inside.seconds, replayed[0], time.perf_counter()
            try:
                return step(scheduler)
            finally:
                wall = time.perf_counter() - start
                self.rows.append((wall, inside.seconds - native, replayed[0] - rep))

        Scheduler.step = timed_step  # type: ignore[method-assign]
        Tape.replay = timed_replay  # type: ignore[method-assign]

    def host_us(self, rows: list[tuple[float, float, float]]) -> tuple[float, float]:
        """Median host time an iteration, in us: outside native calls, and outside native
        calls and the recorded step (a CUDA graph's replay is device time)."""
        outside = [wall - native for wall, native, _ in rows]
        step = [wall - max(native, rep) for wall, native, rep in rows]
        return statistics.median(outside) * 1e6, statistics.median(step) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--algorithm", default="none")
    parser.add_argument("--num-steps", type=int, default=None)
    parser.add_argument("--topk", type=int, default=1)
    parser.add_argument("--num-draft-tokens", type=int, default=None)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--modes", default="off,tape")
    args = parser.parse_args()
    torch.set_num_threads(1)
    inside = Inside(ForwardTimer())  # no forward is wrapped: every call counts
    if not inside.attach():
        raise SystemExit("the native library is off here: nothing to record")
    iterations = Iterations(inside)
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
    steps: dict[str, list[tuple[float, float, float]]] = {mode: [] for mode in modes}
    outputs: dict[str, list[list[int]]] = {}
    for _ in range(args.repeats):
        for mode, engine in engines.items():
            inside.seconds = 0.0
            iterations.rows = []
            cpu, wall = time.process_time(), time.perf_counter()
            got = [engine.generate([p], params)[0].token_ids for p in prompts]
            wall = time.perf_counter() - wall
            cpu = time.process_time() - cpu
            tokens = sum(len(t) for t in got)
            outputs[mode] = got
            rows[mode].append((tokens / wall, (wall - inside.seconds) / tokens * 1e6, cpu / wall))
            steps[mode] += iterations.rows
    print(
        f"tape: model {args.model} ({next(iter(engines.values())).model.config.dtype}), "
        f"{args.algorithm} {sizes or ''}, {args.prompts} prompts x {args.max_new_tokens} "
        f"tokens one at a time, overlap off, best of {args.repeats}"
    )
    print(
        f"{'mode':<6} {'tokens/s':>9} {'outside native us/token':>24} "
        f"{'host us/iteration: outside native':>34} {'and the recorded step':>22} "
        f"{'cpu/wall':>18}"
    )
    for mode in modes:
        best = max(r[0] for r in rows[mode])
        outside = statistics.median(r[1] for r in rows[mode])
        load = ", ".join(f"{r[2]:.2f}" for r in rows[mode])
        host, host_step = iterations.host_us(steps[mode])
        print(f"{mode:<6} {best:>9.1f} {outside:>24.0f} {host:>34.0f} {host_step:>22.0f}   {load}")
    print(
        "(host us/iteration: median over the decode iterations, prefill excluded; the last "
        "column also leaves out the replay of a recorded step, as a CUDA graph's is device time)"
    )
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
