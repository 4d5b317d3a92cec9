"""`relayc demo`: compile the bundled specs, run every algorithm, compare with greedy `none`.

The same measurement serves `bench/e2e.py`. Every algorithm runs the same prompts
(by default the shipped models' held-out prompts) greedily on the same target; the table gives the mean accept length
(tokens emitted per verify, bonus included), tokens/s, the speedup over `none`
measured in the same run, and whether the outputs equal greedy `none` exactly.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from relayc.specs.errors import UsageError
from relayc.tools.args import int_in, model_dir, writable_file

PROMPTS = [
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "for i in range(10):\n    for j in range(10):\n        print(i, j)\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n    def push(self, item):\n",
    "import os\nimport sys\nimport json\nimport time\nimport re\n",
    "the quick brown fox jumps over the lazy dog. the quick brown fox",
    "x = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\ny = [",
    "if __name__ == '__main__':\n    main()\nif __name__ == '__main__':\n",
    "SELECT name, age FROM users WHERE age > 30 ORDER BY name;\nSELECT",
]


def demo_prompts(model: str | None) -> list[str]:
    """The shipped models' held-out prompts (code from standard-library files their training
    left out); the fixed `PROMPTS` for any other model."""
    from relayc.engine.shipped import heldout_prompts

    return (heldout_prompts() if model is None else []) or list(PROMPTS)


ALGORITHMS: list[tuple[str, dict[str, int]]] = [
    ("none", {}),
    ("eagle", {"num_steps": 3, "topk": 1, "num_draft_tokens": 4}),
    ("eagle", {"num_steps": 3, "topk": 4, "num_draft_tokens": 8}),
    ("eagle_multilayer", {"num_steps": 3, "topk": 1, "num_draft_tokens": 4}),
    ("ngram", {"num_steps": 3, "topk": 1, "num_draft_tokens": 6}),
    ("standalone", {"num_steps": 3, "topk": 1, "num_draft_tokens": 4}),
]


@dataclass
class Row:
    label: str
    mean_accept: float
    tokens_per_s: float
    speedup: float
    identical: bool


def _label(name: str, sizes: dict[str, int]) -> str:
    return f"{name} (topk {sizes['topk']})" if name == "eagle" else name


def _progress(done: int, total: int, label: str) -> None:
    width = 24
    filled = width * done // total
    sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {label:<24}")
    sys.stderr.flush()
    if done == total:
        sys.stderr.write("\n")


def measure(
    prompts: Sequence[str],
    max_new_tokens: int,
    *,
    model: str | None = None,
    overlap: bool = True,
    seed: int = 0,
    batch_size: int = 0,
    repeats: int = 1,
    progress: Callable[[int, int, str], None] | None = None,
) -> list[Row]:
    """Every algorithm over ``prompts``: all at once (``batch_size`` 0), or in consecutive
    groups of ``batch_size`` concurrent requests (1: one request at a time, the latency view
    speculative decoding is for). Tokens/s is the best of ``repeats`` runs (the outputs are
    the same every run: greedy). The runs go round robin, one of every algorithm per round,
    so a slow spell of a shared CPU does not fall on one algorithm's runs only."""
    from relayc.engine import Engine, SamplingParams
    from relayc.engine.overlap import set_cpu_threads

    set_cpu_threads()  # as `relayc generate` and the benchmarks do
    params = SamplingParams(max_new_tokens=max_new_tokens)
    labels = [_label(name, sizes) for name, sizes in ALGORITHMS]
    engines = []
    for i, (name, sizes) in enumerate(ALGORITHMS):
        if progress:
            progress(i, len(ALGORITHMS) + 1, f"load {labels[i]}")
        engine = Engine(model, algorithm=name, overlap=overlap, seed=seed, **sizes)
        engine.generate(prompts[:1], SamplingParams(max_new_tokens=4))  # warm-up
        engines.append(engine)
    group = batch_size or len(prompts)
    elapsed = [float("inf")] * len(engines)
    outputs: list[list[Any]] = [[] for _ in engines]
    rounds = max(repeats, 1)
    try:
        for r in range(rounds):
            if progress:
                progress(len(ALGORITHMS), len(ALGORITHMS) + 1, f"run {r + 1}/{rounds}")
            for i, engine in enumerate(engines):
                start = time.perf_counter()
                outputs[i] = [
                    out
                    for g in range(0, len(prompts), group)
                    for out in engine.generate(prompts[g : g + group], params)
                ]
                elapsed[i] = min(elapsed[i], time.perf_counter() - start)
    finally:
        for engine in engines:
            engine.close()
    if progress:
        progress(len(ALGORITHMS) + 1, len(ALGORITHMS) + 1, "done")
    base = [name for name, _ in ALGORITHMS].index("none")
    reference = [o.token_ids for o in outputs[base]]
    base_tps = sum(len(t) for t in reference) / elapsed[base]
    rows: list[Row] = []
    for label, outs, seconds in zip(labels, outputs, elapsed, strict=True):
        accepts = [a for o in outs for a in o.accept_lengths]
        tps = sum(len(o.token_ids) for o in outs) / seconds
        rows.append(
            Row(
                label,
                sum(accepts) / max(len(accepts), 1),
                tps,
                tps / base_tps,
                [o.token_ids for o in outs] == reference,
            )
        )
    return rows


def table(rows: Sequence[Row]) -> str:
    from relayc.specs.explain import table as render

    return render(
        ["algorithm", "mean accept length", "tokens/s", "speedup vs none", "identical to none"],
        [
            [
                r.label,
                f"{r.mean_accept:.2f}",
                f"{r.tokens_per_s:.1f}",
                f"{r.speedup:.2f}x",
                "yes" if r.identical else "no",
            ]
            for r in rows
        ],
    )


def chart(rows: Sequence[Row], path: Path) -> bool:
    """A PNG of speedups and accept lengths; False when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    labels = [r.label for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.bar(labels, [r.speedup for r in rows], color="#1565c0")
    left.axhline(1.0, color="#9e9e9e", linewidth=1)
    left.set_title("tokens/s speedup vs none")
    right.bar(labels, [r.mean_accept for r in rows], color="#5e35b1")
    right.set_title("mean accept length (tokens per verify)")
    for axis in (left, right):
        axis.tick_params(axis="x", rotation=30)
    fig.suptitle(
        "relayc demo: greedy decoding, outputs identical to none: "
        + ("yes" if all(r.identical for r in rows) else "NO")
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def run_demo(args: argparse.Namespace) -> int:
    from relayc.compiler.writer import GENERATED_DIR, regenerate_bundled
    from relayc.engine.weights import CheckpointError

    try:
        written = regenerate_bundled()
    except OSError as exc:
        raise UsageError(f"cannot write the generated modules: {exc.strerror or exc}") from None
    print(
        f"compiled the bundled specs into {GENERATED_DIR} "
        f"({len(written)} rewritten, the rest unchanged)"
    )
    prompts = demo_prompts(args.model)
    try:
        rows = measure(
            prompts[: args.prompts],
            args.max_new_tokens,
            model=args.model,
            batch_size=args.batch_size,
            repeats=args.repeats,
            progress=_progress,
        )
    except (CheckpointError, ValueError) as exc:  # a checkpoint the engine cannot run
        raise UsageError(str(exc)) from None
    print(table(rows))
    out = Path(args.chart)
    try:
        written_chart = chart(rows, out)
    except OSError as exc:
        raise UsageError(f"cannot write the chart {out}: {exc.strerror or exc}") from None
    if written_chart:
        print(f"chart: {out}")
    else:
        print("chart skipped: `pip install matplotlib` to write it")
    return 0 if all(r.identical for r in rows) else 1


def add_demo_command(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "demo",
        help="compile the bundled specs and compare every algorithm with none",
        description="Compile the bundled specs, run every algorithm on a fixed prompt set, "
        "print mean accept length, tokens/s, speedup vs none and whether the outputs equal "
        "greedy none, and write the same as a PNG chart.",
        epilog="Exit codes: 0 ok, 1 an algorithm's output differs from greedy none, 2 usage "
        "errors (bad arguments, checkpoint).",
    )
    p.add_argument(
        "--model",
        type=model_dir,
        metavar="DIR",
        help="a local checkpoint directory, or `random` (default: the shipped demo models)",
    )
    p.add_argument("--prompts", type=int_in(1), default=8, help="how many prompts to run")
    p.add_argument(
        "--batch-size",
        type=int_in(0),
        default=1,
        help="concurrent requests (default 1: one at a time, the latency speculation cuts; "
        "0: every prompt at once)",
    )
    # 64: long enough that the drafters' prompt pass (EAGLE, MTP, standalone) is amortised
    p.add_argument("--max-new-tokens", type=int_in(1), default=64)
    p.add_argument("--repeats", type=int_in(1), default=2, help="best of N timed runs (default 2)")
    # Checked before the run (folder exists, writable), not after minutes of measuring.
    p.add_argument(
        "--chart",
        type=writable_file,
        default="relayc-demo.png",
        help="where to write the PNG chart",
    )
    p.set_defaults(func=run_demo)
