"""End to end: every algorithm's mean accept length and tokens/s against `none`, one run.

    python bench/e2e.py [--model DIR|random] [--prompts 16] [--max-new-tokens 64]
                        [--batch-sizes 1,8] [--repeats 3] [--no-overlap]

Greedy decoding of the shipped models' held-out prompts (a fixed prompt set for another
model) on the same target; the last column says whether the
outputs equal greedy `none` exactly (they must: speculation is lossless).
"""

from __future__ import annotations

import argparse

from relayc.tools.demo import demo_prompts, measure, table


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
    args = parser.parse_args()
    prompts = demo_prompts(args.model)[: args.prompts]
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
