"""End to end: every algorithm's mean accept length and tokens/s against `none`, one run.

    python bench/e2e.py [--model DIR] [--prompts 8] [--max-new-tokens 64] [--no-overlap]

Greedy decoding of a fixed prompt set on the same target; the last column says whether the
outputs equal greedy `none` exactly (they must: speculation is lossless).
"""

from __future__ import annotations

import argparse

from relayc.engine.demo import PROMPTS, measure, table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a local checkpoint directory (default: embedded)")
    parser.add_argument("--prompts", type=int, default=len(PROMPTS))
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--no-overlap", action="store_true")
    args = parser.parse_args()
    rows = measure(
        PROMPTS[: args.prompts], args.max_new_tokens, model=args.model, overlap=not args.no_overlap
    )
    print(table(rows))


if __name__ == "__main__":
    main()
