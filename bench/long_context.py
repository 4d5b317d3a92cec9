"""Decoding after a long prompt: relayc against llama.cpp on SmolLM2's Q4_1 file.

    python bench/long_context.py [--contexts 250,1000,2000] [--max-new-tokens 32]
                                 [--repeats 3] [--threads 1]

Each prompt is one chat turn: the start of this repository's README.md, cut so that the
rendered prompt is ``--contexts`` tokens long, then a request to summarise it -- a user
pasting a document. Both sides get the same token ids, greedy, one request at a time;
relayc's `none` over the file's blocks (its float32 default) and llama.cpp
(llama-cpp-python, loaded as bench/peers.py loads it: the CPU backend's extra buffer types
off, its cache of the previous prompt dropped) on the same file. Per (peer, context),
round robin, best of ``--repeats``: the time to the first token (the whole prompt's
prefill) and the decoding speed after it (the tokens after the first over the time from
the first to the last), with the process CPU time over the wall time of the best run, so a
starved run shows. llama.cpp's Q4_1 arithmetic (8-bit
activations) is not relayc's, so their answers may part after a few tokens: the decoding
speeds compare the same work (one token at a time over the same context), not the same
tokens; each row says how many tokens it decoded.
"""

from __future__ import annotations

import sys
from pathlib import Path

# this checkout's relayc, not the one the environment installed (an editable install points
# at another checkout: a worktree's benchmark would otherwise time the main tree's code)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import time
from collections.abc import Callable, Iterator

from peers import _llama_without_extra_bufts  # bench/, this script's folder

from relayc.engine import Engine, SamplingParams
from relayc.engine.checkpoints.named import named_model_file
from relayc.engine.serving.overlap import set_cpu_threads
from relayc.engine.text.chat import Chat

README = Path(__file__).resolve().parents[1] / "README.md"
QUESTION = "\n\nSummarise the text above in two sentences."


def document_prompt(engine: Engine, tokens: int) -> list[int]:
    """The chat prompt of the README's first characters and :data:`QUESTION`, as long as
    fits ``tokens`` tokens (rendered with the model's chat template)."""
    text = README.read_text()

    def encoded(chars: int) -> list[int]:
        return engine.encode(Chat([{"role": "user", "content": text[:chars] + QUESTION}]))

    low, high = 0, len(text)
    if len(encoded(high)) <= tokens:
        raise SystemExit(f"README.md is shorter than {tokens} tokens: ask for less context")
    while high - low > 1:  # the most characters whose prompt fits
        middle = (low + high) // 2
        low, high = (middle, high) if len(encoded(middle)) <= tokens else (low, middle)
    return encoded(low)


Run = Callable[[list[int]], Iterator[int]]


def timed(run: Run, prompt: list[int], limit: int) -> tuple[float, float, int, float]:
    """(seconds to the first token, seconds from the first to the last, tokens, cpu/wall)."""
    start, cpu = time.perf_counter(), time.process_time()
    first = last = start
    count = 0
    for _ in run(prompt):
        now = time.perf_counter()
        count += 1
        if count == 1:
            first = now
        last = now
        if count == limit:
            break
    wall = time.perf_counter() - start
    return first - start, last - first, count, (time.process_time() - cpu) / wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", default="250,1000,2000")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    set_cpu_threads(args.threads)
    try:
        import llama_cpp
    except ImportError:
        raise SystemExit(
            "this benchmark compares with llama.cpp: pip install llama-cpp-python"
        ) from None
    contexts = [int(c) for c in args.contexts.split(",")]
    engine = Engine("smollm2")
    # greedy, and no stop token: every run decodes --max-new-tokens unless the model ends
    params = SamplingParams(max_new_tokens=args.max_new_tokens)

    def relayc(prompt: list[int]) -> Iterator[int]:
        for delta in engine.stream([prompt], params):
            yield from delta.token_ids

    llm = _llama_without_extra_bufts(
        llama_cpp, named_model_file("smollm2"), args.threads, n_ctx=max(contexts) + 256
    )

    def llama(prompt: list[int]) -> Iterator[int]:
        # reset() first: else llama-cpp-python keeps the cache of the prompt they share
        # with the last one (here the README's start), and its prefill would be the rest
        llm.reset()
        yield from llm.generate(prompt, temp=0.0, top_k=1, reset=True)

    peers: dict[str, Run] = {"relayc none": relayc, "llama.cpp Q4_1": llama}
    prompts = {c: document_prompt(engine, c) for c in contexts}
    best: dict[tuple[str, int], tuple[float, float, int, float]] = {}
    try:
        for round_ in range(args.repeats + 1):  # round 0 warms up
            for context, prompt in prompts.items():
                for name, run in peers.items():
                    got = timed(run, prompt, args.max_new_tokens)
                    key = (name, context)
                    rate = (got[2] - 1) / got[1] if got[1] > 0 else 0.0
                    old = best.get(key)
                    old_rate = (old[2] - 1) / old[1] if old and old[1] > 0 else -1.0
                    if round_ and rate > old_rate:
                        best[key] = got
    finally:
        llm.close()
        engine.close()
    print(
        f"SmolLM2-135M-Instruct, the Q4_1 file, {args.threads} thread(s), greedy, one request, "
        f"best of {args.repeats} round-robin runs"
    )
    print(
        f"{'prompt tokens':>13}  {'peer':<15} {'first token s':>13} {'decode tokens/s':>15} "
        f"{'tokens':>6} {'cpu/wall':>8}"
    )
    for context, prompt in prompts.items():
        rates = {}
        for name in peers:
            first, span, count, share = best[(name, context)]
            rates[name] = (count - 1) / span if span > 0 else 0.0
            print(
                f"{len(prompt):>13}  {name:<15} {first:>13.2f} {rates[name]:>15.1f} "
                f"{count:>6} {share:>8.2f}"
            )
        if rates["llama.cpp Q4_1"]:
            ratio = rates["relayc none"] / rates["llama.cpp Q4_1"]
            print(f"{'':>13}  decoding, relayc / llama.cpp: x{ratio:.2f}")


if __name__ == "__main__":
    main()
