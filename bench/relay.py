"""Generated FutureMap vs plain per-field indexing, on the CPU, in one run.

For each algorithm and batch size: microseconds per stash(+publish) and per
resolve, and the aten ops each dispatches (counted with a TorchDispatchMode),
next to a baseline that does `buf[idx] = v` / `buf[idx]` per field. Prints
ratios (generated / baseline): machines here are noisy, ratios less so.

    python bench/relay.py [--iters 2000] [--threads 1]
"""

from __future__ import annotations

import sys
from pathlib import Path

# this checkout's relayc, not the one the environment installed (an editable install points
# at another checkout: a worktree's benchmark would otherwise time the main tree's code)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import os

# The launch counts run the fused Triton path through Triton's interpreter (no GPU here);
# it must be chosen before Triton is imported, which the generated modules do.
os.environ.setdefault("TRITON_INTERPRET", "1")

import argparse
import importlib
import time
from collections.abc import Callable

import torch

from relayc.runtime.capture import count_aten_ops

POOL = 4096
HIDDEN = 4096
VOCAB = 32000


def per_call_us(fn: Callable[[], object], iters: int) -> float:
    for _ in range(min(200, iters)):
        fn()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - start) / iters * 1e6


def paired_us(
    a: Callable[[], object], b: Callable[[], object], iters: int, rounds: int = 5
) -> tuple[float, float]:
    """Best-of-rounds time of a and b, measured alternately so load hits both alike."""
    best_a = best_b = float("inf")
    for _ in range(rounds):
        best_a = min(best_a, per_call_us(a, iters // rounds or 1))
        best_b = min(best_b, per_call_us(b, iters // rounds or 1))
    return best_a, best_b


def configs() -> list[tuple[str, str, dict[str, int]]]:
    rows = [("none", "none", {})]
    for topk in (1, 4, 8):
        rows.append(
            (f"eagle topk={topk}", "eagle", {"topk": topk, "hidden": HIDDEN, "vocab": VOCAB})
        )
    rows.append(("eagle_multilayer", "eagle_multilayer", {"topk": 4}))
    rows.append(("ngram", "ngram", {"num_draft_tokens": 8}))
    rows.append(("standalone", "standalone", {"vocab": 1024}))
    return rows


def bench(name: str, algorithm: str, dims: dict[str, int], batch: int, iters: int) -> list[str]:
    module = importlib.import_module(f"relayc.generated.{algorithm}")
    fmap = module.FutureMap(POOL, "cpu", dims=dims, model_dtype=torch.bfloat16)
    idx = torch.randperm(POOL - 1)[:batch] + 1
    values = {
        info.name: torch.zeros((batch, *fmap.rows[info.name]), dtype=fmap.dtypes[info.name])
        for info in module.FIELDS
    }
    # Early-published fields reach the relay through publish(), the rest through stash().
    early = {name: values[name] for name in ("new_seq_lens",) if name in values}
    payload = module.RelayPayload(**{n: v for n, v in values.items() if n not in early})
    fmap.stash(idx, module.RelayPayload(**values))
    bufs = {n: torch.zeros((POOL, *v.shape[1:]), dtype=v.dtype) for n, v in values.items()}

    def stash() -> None:
        fmap.stash(idx, payload)
        if early:
            fmap.publish(idx, **early)

    def resolve() -> object:
        return fmap.resolve(idx)

    def base_stash() -> None:
        for n, v in values.items():
            bufs[n][idx] = v

    def base_resolve() -> object:
        return [buf[idx] for buf in bufs.values()]

    gen_s, base_s = paired_us(stash, base_stash, iters)
    gen_r, base_r = paired_us(resolve, base_resolve, iters)
    return [
        name,
        str(batch),
        f"{gen_s:.1f}",
        f"{base_s:.1f}",
        f"{gen_s / base_s:.2f}",
        f"{gen_r:.1f}",
        f"{base_r:.1f}",
        f"{gen_r / base_r:.2f}",
        f"{count_aten_ops(stash)}/{count_aten_ops(base_stash)}",
        f"{count_aten_ops(resolve)}/{count_aten_ops(base_resolve)}",
        triton_launches(module, dims, payload, idx),
    ]


def triton_launches(module, dims: dict[str, int], payload, idx: torch.Tensor) -> str:  # type: ignore[no-untyped-def]
    """Launches of the fused path per stash / per resolve, counted under the interpreter."""
    from relayc.runtime.relay_kernel import count_triton_launches

    fused = module.FutureMap(POOL, "cpu", dims=dims, model_dtype=torch.bfloat16, backend="triton")
    with count_triton_launches() as launches:
        fused.stash(idx, payload)
        stashes = launches.stash
        fused.resolve(idx)
    return f"{stashes}/{launches.resolve}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from relayc.specs.explain import table

    rows = [
        bench(name, algo, dims, bs, args.iters)
        for name, algo, dims in configs()
        for bs in (1, 16, 64, 256)
    ]
    print(
        table(
            [
                "algorithm",
                "bs",
                "stash us",
                "base us",
                "ratio",
                "resolve us",
                "base us",
                "ratio",
                "stash ops gen/base",
                "resolve ops gen/base",
                "triton launches",
            ],
            rows,
        )
    )
    print(
        "\nstash includes publish where the algorithm publishes early; ratio < 1: generated "
        "is faster; triton launches: the fused path (CUDA / backend='triton') per stash / "
        "resolve, counted under TRITON_INTERPRET=1."
    )


if __name__ == "__main__":
    main()
