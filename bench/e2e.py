"""End to end: every algorithm's mean accept length and tokens/s against `none`, one run.

    python bench/e2e.py [--model DIR|random] [--prompts 16] [--max-new-tokens 64]
                        [--batch-sizes 1,8] [--repeats 3] [--no-overlap]
                        [--block-verification [--temperature 1.0] [--seeds 4]
                                              [--chain-steps 3]]
                        [--draft-confidence 0.4 [--chain-steps 3,6]]

Greedy decoding of the shipped models' held-out prompts (a fixed prompt set for another
model) on the same target; the last column says whether the
outputs equal greedy `none` exactly (they must: speculation is lossless).

``--block-verification`` instead compares, on sampled decoding (greedy rows never use
it), the chain-drafting algorithm (`standalone`) verified token by token and by block
verification (Sun et al. 2024): mean accept length (with its standard error) and
tokens/s of each, over ``--seeds`` sampling seeds of every prompt.

``--draft-confidence T`` instead compares, on greedy decoding, `standalone` drafting a
fixed chain and with dynamic draft length (``Engine(draft_confidence=T)``) for each
``--chain-steps`` length: mean accept length, draft-model forwards per emitted token,
tokens/s and tokens per CPU second (best of ``--repeats`` round-robin runs), and whether
the outputs equal the fixed chain's (they must: both are lossless).
"""

from __future__ import annotations

import sys
from pathlib import Path

# this checkout's relayc, not the one the environment installed (an editable install points
# at another checkout: a worktree's benchmark would otherwise time the main tree's code)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import time
from collections.abc import Sequence

from relayc.specs.explain import table as render
from relayc.tools.demo import demo_prompts, measure, table, toy_algorithms

SHIPPED_CHAIN_STEPS = dict(toy_algorithms())["standalone"]["num_steps"]


def compare_block_verification(
    prompts: Sequence[str],
    max_new_tokens: int,
    *,
    model: str | None,
    overlap: bool,
    batch_size: int,
    seeds: int,
    temperature: float,
    chain_steps: int = SHIPPED_CHAIN_STEPS,
) -> str:
    """Token-wise vs block verification of `standalone`, same prompts, seeds and engine
    settings; runs alternate so a slow spell of the machine hits both. Sampled runs differ
    from the first diverging token on, so the accept lengths are compared as means."""

    from relayc.engine import Engine, SamplingParams
    from relayc.engine.serving.overlap import set_cpu_threads

    set_cpu_threads()
    modes = [False, True]
    chain = {"num_steps": chain_steps, "topk": 1, "num_draft_tokens": chain_steps + 1}
    engines = [
        Engine(model, algorithm="standalone", overlap=overlap, block_verification=m, **chain)
        for m in modes
    ]
    group = batch_size or len(prompts)
    elapsed = [0.0] * len(modes)
    accepts: list[list[int]] = [[] for _ in modes]
    tokens = [0] * len(modes)
    try:
        for engine in engines:
            engine.generate(prompts[:1], SamplingParams(max_new_tokens=4))  # warm-up
        for seed in range(seeds):
            params = [
                SamplingParams(
                    max_new_tokens=max_new_tokens,
                    temperature=temperature,
                    seed=seed * len(prompts) + i,
                )
                for i in range(len(prompts))
            ]
            for i, engine in enumerate(engines):
                start = time.perf_counter()
                outs = [
                    out
                    for g in range(0, len(prompts), group)
                    for out in engine.generate(prompts[g : g + group], params[g : g + group])
                ]
                elapsed[i] += time.perf_counter() - start
                accepts[i] += [a for o in outs for a in o.accept_lengths]
                tokens[i] += sum(len(o.token_ids) for o in outs)
    finally:
        for engine in engines:
            engine.close()
    mean = [sum(a) / len(a) for a in accepts]
    stderr = [
        (sum((x - m) ** 2 for x in a) / (len(a) - 1) / len(a)) ** 0.5 if len(a) > 1 else 0.0
        for a, m in zip(accepts, mean, strict=True)
    ]
    tps = [t / e for t, e in zip(tokens, elapsed, strict=True)]
    rows = [
        [
            f"standalone, {'block' if m else 'token-wise'}",
            f"{mean[i]:.3f} +- {stderr[i]:.3f}",
            f"{len(accepts[i])}",
            f"{mean[i] / mean[0]:.3f}x",
            f"{tps[i]:.1f}",
            f"{tps[i] / tps[0]:.2f}x",
        ]
        for i, m in enumerate(modes)
    ]
    header = [
        "verification",
        "mean accept length",
        "verifies",
        "vs token-wise",
        "tokens/s",
        "vs token-wise",
    ]
    return render(header, rows)


def compare_draft_length(
    prompts: Sequence[str],
    max_new_tokens: int,
    *,
    model: str | None,
    overlap: bool,
    batch_size: int,
    repeats: int,
    confidence: float,
    chain_steps: Sequence[int],
) -> str:
    """Fixed vs dynamic chain length of `standalone`, greedy, runs round-robin."""
    from relayc.engine import Engine, SamplingParams
    from relayc.engine.serving.overlap import set_cpu_threads

    set_cpu_threads()
    variants = [(steps, c) for steps in chain_steps for c in (None, confidence)]
    engines = [
        Engine(
            model,
            algorithm="standalone",
            overlap=overlap,
            draft_confidence=c,
            num_steps=steps,
            topk=1,
            num_draft_tokens=steps + 1,
        )
        for steps, c in variants
    ]
    draft_forwards = [0] * len(engines)
    for i, engine in enumerate(engines):

        def count(*_: object, i: int = i) -> None:
            draft_forwards[i] += 1

        for module in engine.algorithm.draft_modules():
            module.register_forward_pre_hook(count)
    group = batch_size or len(prompts)
    encoded = list(prompts)
    params = SamplingParams(max_new_tokens=max_new_tokens)
    wall = [float("inf")] * len(engines)
    cpu = [float("inf")] * len(engines)
    outputs: list[list[list[int]]] = [[] for _ in engines]
    accepts: list[list[int]] = [[] for _ in engines]
    try:
        for _ in range(repeats):
            for i, engine in enumerate(engines):
                draft_forwards[i] = 0
                start, start_cpu = time.perf_counter(), time.process_time()
                outs = [
                    out
                    for g in range(0, len(encoded), group)
                    for out in engine.generate(encoded[g : g + group], params)
                ]
                wall[i] = min(wall[i], time.perf_counter() - start)
                cpu[i] = min(cpu[i], time.process_time() - start_cpu)
                outputs[i] = [o.token_ids for o in outs]
                accepts[i] = [a for o in outs for a in o.accept_lengths]
    finally:
        for engine in engines:
            engine.close()
    tokens = [sum(len(o) for o in out) for out in outputs]
    rows = []
    for i, (steps, c) in enumerate(variants):
        fixed = i - (c is not None)  # the same chain length, fixed
        rows.append(
            [
                f"standalone, {steps} drafts, " + ("fixed" if c is None else f"dynamic {c}"),
                f"{sum(accepts[i]) / len(accepts[i]):.3f}",
                f"{draft_forwards[i] / tokens[i]:.2f}",
                f"{tokens[i] / wall[i]:.1f}",
                f"{wall[fixed] / tokens[fixed] * tokens[i] / wall[i]:.2f}x",
                f"{tokens[i] / cpu[i]:.1f}",
                f"{cpu[fixed] / tokens[fixed] * tokens[i] / cpu[i]:.2f}x",
                "yes" if outputs[i] == outputs[fixed] else "NO",
            ]
        )
    header = [
        "drafting",
        "mean accept length",
        "draft fwd/token",
        "tokens/s",
        "vs fixed",
        "tokens/cpu-s",
        "vs fixed",
        "= fixed",
    ]
    return render(header, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", help="a local checkpoint directory, or `random` (default: the shipped models)"
    )
    parser.add_argument("--prompts", type=int, default=16, help="how many held-out prompts")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--no-overlap", action="store_true")
    parser.add_argument("--repeats", type=int, default=3, help="best of N timed runs")
    parser.add_argument(
        "--batch-sizes",
        default="1,8",
        help="concurrent requests, one table each (default 1,8; 0 = every prompt at once)",
    )
    parser.add_argument(
        "--block-verification",
        action="store_true",
        help="compare token-wise and block verification of `standalone` (sampled decoding)",
    )
    parser.add_argument(
        "--temperature", type=float, default=1.0, help="for --block-verification (> 0)"
    )
    parser.add_argument(
        "--seeds", type=int, default=4, help="for --block-verification: sampling seeds"
    )
    parser.add_argument(
        "--chain-steps",
        default=str(SHIPPED_CHAIN_STEPS),
        help="drafts per chain (--block-verification: one; --draft-confidence: a list, 3,6)",
    )
    parser.add_argument(
        "--draft-confidence",
        type=float,
        help="compare fixed and dynamic chain length of `standalone` (greedy) at this threshold",
    )
    args = parser.parse_args()
    prompts = demo_prompts(args.model)[: args.prompts]
    if args.draft_confidence is not None:
        steps = [int(s) for s in str(args.chain_steps).split(",")]
        for batch_size in (int(b) for b in args.batch_sizes.split(",")):
            text = compare_draft_length(
                prompts,
                args.max_new_tokens,
                model=args.model,
                overlap=not args.no_overlap,
                batch_size=batch_size,
                repeats=args.repeats,
                confidence=args.draft_confidence,
                chain_steps=steps,
            )
            concurrency = batch_size or len(prompts)
            print(
                f"\n{len(prompts)} prompts, {concurrency} at a time, {args.max_new_tokens} new "
                f"tokens, greedy, best of {args.repeats} round-robin runs"
            )
            print(text)
        return
    if args.block_verification:
        if not args.temperature > 0:
            parser.error("--block-verification needs --temperature > 0 (greedy never uses it)")
        for batch_size in (int(b) for b in args.batch_sizes.split(",")):
            text = compare_block_verification(
                prompts,
                args.max_new_tokens,
                model=args.model,
                overlap=not args.no_overlap,
                batch_size=batch_size,
                seeds=args.seeds,
                temperature=args.temperature,
                chain_steps=int(args.chain_steps),
            )
            concurrency = batch_size or len(prompts)
            print(
                f"\n{len(prompts)} prompts, {concurrency} at a time, {args.max_new_tokens} new "
                f"tokens, temperature {args.temperature}, {args.seeds} seeds, "
                f"{args.chain_steps} drafts per chain"
            )
            print(text)
        return
    for batch_size in (int(b) for b in args.batch_sizes.split(",")):
        rows = measure(
            prompts,
            args.max_new_tokens,
            model=args.model,
            overlap=not args.no_overlap,
            batch_size=batch_size,
            repeats=args.repeats,
        )
        concurrency = batch_size or len(prompts)
        print(
            f"\n{len(prompts)} prompts, {concurrency} at a time, {args.max_new_tokens} new tokens"
        )
        print(table(rows))


if __name__ == "__main__":
    main()
