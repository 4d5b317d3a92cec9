"""SmolLM2 decoding speed in dtype "int8" against float32, one process, round robin.

    python bench/int8_speed.py [--prompts 8] [--max-new-tokens 32] [--repeats 3] [--hf]

Rows (one request at a time, the held-out chat prompts of bench/peers.py, greedy): relayc
`none` in float32 (over the Q4_1 file's blocks, or the panels where this CPU's table says
so: relayc.engine.native.blocks.FLOAT32_PATHS), `none` in int8 (relayc/engine/native/csrc/
int8.c), and in int8 the EAGLE-3 chains of 2 and 3 tokens, n-gram and DFlash; with
``--hf``, transformers' greedy ``generate`` on the same file. Each row is run once untimed
(its outputs checked against `none` at its precision: speculation must not change them),
then timed ``--repeats`` times round robin; the best wall time is kept and its process
CPU time over wall time printed (a run under 0.85 was starved: compare tokens per CPU
second then, which a crowded machine moves less).
"""

from __future__ import annotations

import sys
from pathlib import Path

# this checkout's relayc, not the one the environment installed
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from relayc.engine import Engine, SamplingParams
from relayc.engine.decoder.cpu_decoder import cpu_path
from relayc.engine.serving.overlap import set_cpu_threads
from relayc.tools.demo import chat_prompts

# label, precision, algorithm, engine arguments
ROWS: list[tuple[str, str, str, dict[str, int]]] = [
    ("none float32", "float32", "none", {}),
    ("none int8", "int8", "none", {}),
    ("eagle3 chain 2 int8", "int8", "eagle3", {"num_steps": 1, "topk": 1, "num_draft_tokens": 2}),
    ("eagle3 chain 3 int8", "int8", "eagle3", {"num_steps": 2, "topk": 1, "num_draft_tokens": 3}),
    ("ngram int8", "int8", "ngram", {"num_draft_tokens": 8}),
    ("dflash block 4 int8", "int8", "dflash", {"num_draft_tokens": 4}),
]


@dataclass
class Row:
    label: str
    run: Callable[[], list[list[int]]]
    outputs: list[list[int]] = field(default_factory=list)
    best: tuple[float, float] = (float("inf"), 0.0)  # wall, cpu of the fastest run
    least_cpu: float = float("inf")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--hf", action="store_true", help="transformers' greedy too")
    args = parser.parse_args()
    set_cpu_threads(args.threads)
    params = SamplingParams(max_new_tokens=args.max_new_tokens)
    firsts: dict[str, Engine] = {}
    rows: list[Row] = []
    for label, precision, algorithm, sizes in ROWS:
        first = firsts.get(precision)
        if first is None:
            engine = firsts[precision] = Engine("smollm2", dtype=precision, **sizes)
        else:
            engine = Engine(
                first.model,
                algorithm=algorithm,
                tokenizer=first.tokenizer,
                dtype=precision,
                draft_model=None,
                **sizes,
            )
        rows.append(
            Row(
                label,
                lambda e=engine: [  # type: ignore[misc]
                    [t for t in o.token_ids] for p in prompts for o in e.generate([p], params)
                ],
            )
        )
    prompts = [firsts["float32"].encode(c) for c in chat_prompts()[: args.prompts]]
    if args.hf:
        import torch

        from relayc.tools.peers import HFTarget

        hf = HFTarget.smollm2(args.max_new_tokens, torch.float32).greedy()
        rows.append(Row("transformers greedy float32", lambda: hf.run(prompts, 1)[0]))
    for row in rows:  # untimed: warm-up and the outputs
        row.outputs = row.run()
    for _ in range(args.repeats):
        for row in rows:
            start, start_cpu = time.perf_counter(), time.process_time()
            row.run()
            wall, cpu = time.perf_counter() - start, time.process_time() - start_cpu
            row.best = min(row.best, (wall, cpu))
            row.least_cpu = min(row.least_cpu, cpu)
    reference = {p: next(r for r in rows if r.label == f"none {p}") for p in firsts}
    tokens = {p: sum(map(len, r.outputs)) for p, r in reference.items()}
    print(
        f"SmolLM2-135M-Instruct, {len(prompts)} held-out chat prompts one at a time, up to "
        f"{args.max_new_tokens} tokens, {args.threads} thread(s), best of {args.repeats}; "
        f"float32: {cpu_path(firsts['float32'].model)}; int8: {cpu_path(firsts['int8'].model)}"
    )
    base = rows[0]
    header = ["row", "tokens/s", "cpu/wall", "tokens/cpu-s", "x float32 none (cpu)", "same"]
    print("".join(f"{h:>22}" if i else f"{h:<28}" for i, h in enumerate(header)))
    for row in rows:
        precision = "int8" if row.label.endswith("int8") else "float32"
        count = tokens[precision] if row.label[:2] != "tr" else sum(map(len, row.outputs))
        wall, cpu = row.best
        per_cpu = count / row.least_cpu
        base_cpu = tokens["float32"] / base.least_cpu
        same = "yes" if row.outputs == reference[precision].outputs else "NO"
        if row.label.startswith("transformers"):
            same = "-"
        cells = [
            f"{count / wall:.1f}",
            f"{cpu / wall:.2f}",
            f"{per_cpu:.1f}",
            f"{per_cpu / base_cpu:.2f}x",
            same,
        ]
        print(f"{row.label:<28}" + "".join(f"{c:>22}" for c in cells))


if __name__ == "__main__":
    main()
