"""What a pause costs the small ops that run next: why host time between forwards is larger
in an engine than in a microbenchmark.

Between two forwards an engine runs hundreds of small torch ops (attention metadata, tree
bookkeeping, the relay). Timed in a loop each takes a few microseconds; in the engine the
same op runs after a forward of tens of milliseconds and can cost ten or more times that.
This script times a few such ops right after a pause of each length, spent three ways:
sleeping, spinning in Python (touching almost no memory) and streaming 128 MB through the
cache (what a forward's weight reads do). Where the pause alone slows the op (sleep, spin),
the caches were emptied by someone else -- on a shared machine, other tenants on the same
core -- and no change to the forward's memory traffic can help; only fewer, smaller ops (or
native code, whose footprint is small) can.

    python bench/cold_ops.py [--repeats 40]

Prints the median microseconds of the first call after each pause. Then, after streaming
only, a held decode step's host bookkeeping three ways -- a KV slot and a length stored, a
slot-table entry committed and a token read, through NumPy and ``tolist``, through
memoryviews of the same memory (what ``Scheduler._held_step`` does), and nothing but the
Python call -- and ``torch.no_grad()`` entered and left against
``torch._C._set_grad_enabled`` switched off and on.
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
from collections.abc import Callable

import numpy as np
import torch

from relayc.engine.draft.paged import last_rows
from relayc.engine.ops.target import greedy_tokens


def spin(seconds: float) -> None:
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        pass


def first_call_us(op: Callable[[], object], pause: Callable[[], object], repeats: int) -> float:
    """Median time of ``op`` right after ``pause`` (with ``op`` run once before the pause)."""
    times = []
    for _ in range(repeats):
        op()
        pause()
        start = time.perf_counter()
        op()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=40)
    args = parser.parse_args()
    torch.set_num_threads(1)
    lens = torch.tensor([3])
    logits = torch.randn(1, 49152)
    stream = torch.ones(32 * 2**20)  # 128 MB
    ops: dict[str, Callable[[], object]] = {
        "last_rows (5 small ops)": lambda: last_rows(lens, 4),
        "greedy_tokens, 1 x 49152": lambda: greedy_tokens(logits),
    }
    print(f"torch {torch.__version__}, 1 thread; us per call, median of {args.repeats}")
    header = f"{'op':<26} {'after':<22} {'us/call':>8}"
    print(header)
    print("-" * len(header))
    cpu, wall = time.process_time(), time.perf_counter()
    for name, op in ops.items():
        for ms in (0, 1, 4, 16):
            for how, pause in (("sleep", time.sleep), ("spin", spin)):
                if ms == 0 and how == "spin":
                    continue
                label = "nothing (warm)" if ms == 0 else f"{how} {ms} ms"
                us = first_call_us(op, lambda p=pause, s=ms / 1e3: p(s), args.repeats)
                print(f"{name:<26} {label:<22} {us:>8.1f}")
        us = first_call_us(op, stream.sum, args.repeats)
        print(f"{name:<26} {'streaming 128 MB':<22} {us:>8.1f}")
    bookkeeping = _bookkeeping()
    for name, op in bookkeeping.items():
        us = first_call_us(op, stream.sum, args.repeats)
        print(f"{name:<26} {'streaming 128 MB':<22} {us:>8.1f}")
    print(f"cpu/wall {(time.process_time() - cpu) / (time.perf_counter() - wall):.2f}")


def _bookkeeping() -> dict[str, Callable[[], object]]:
    """A held step's host work on the same memory: NumPy, memoryviews, nothing."""
    lengths = torch.zeros(8, dtype=torch.int64)
    table = torch.zeros(16, 64, dtype=torch.int32)
    tokens = torch.tensor([7])
    host_lengths, host_table = lengths.numpy(), table.numpy()
    prefix = np.array([5], dtype=np.int64)
    words = host_lengths.data.cast("B").cast("q")
    table_words = host_table.data.cast("B").cast("i", host_table.shape)
    token_words = tokens.numpy().data.cast("B").cast("q")

    def through_numpy() -> object:
        host_lengths[:1] = prefix
        np.add(host_lengths[:1], 1, out=host_lengths[1:2])
        host_table[3, 17] = host_lengths[0]
        return tokens.tolist()

    def through_memoryviews() -> object:
        length = 5
        words[0] = length
        words[1] = length + 1
        table_words[3, 17] = length
        return [token_words[0]]

    def grad_switched() -> None:
        if torch.is_grad_enabled():
            torch._C._set_grad_enabled(False)
            torch._C._set_grad_enabled(True)

    def no_grad() -> None:
        with torch.no_grad():
            pass

    return {
        "bookkeeping, NumPy": through_numpy,
        "bookkeeping, memoryviews": through_memoryviews,
        "bookkeeping, nothing": lambda: [5],
        "torch.no_grad()": no_grad,
        "_set_grad_enabled x2": grad_switched,
    }


if __name__ == "__main__":
    main()
