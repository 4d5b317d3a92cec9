"""Generated FutureMap vs plain per-field indexing, on the CPU, in one run.

For each algorithm and batch size: microseconds per stash(+publish) and per
resolve, and the aten ops each dispatches (counted with a TorchDispatchMode),
next to a baseline that does `buf[idx] = v` / `buf[idx]` per field. Prints
ratios (generated / baseline): machines here are noisy, ratios less so.

    python bench/relay.py [--iters 2000] [--threads 1]
"""

from __future__ import annotations

import argparse
import importlib
import time
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

POOL = 4096
HIDDEN = 4096
VOCAB = 32000


class CountOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.count += 1
        return func(*args, **(kwargs or {}))


def per_call_us(fn: Callable[[], object], iters: int) -> float:
    for _ in range(min(200, iters)):
        fn()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - start) / iters * 1e6


def ops(fn: Callable[[], object]) -> int:
    with CountOps() as mode:
        fn()
    return mode.count


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

    gen_s, base_s = per_call_us(stash, iters), per_call_us(base_stash, iters)
    gen_r, base_r = per_call_us(resolve, iters), per_call_us(base_resolve, iters)
    return [
        name,
        str(batch),
        f"{gen_s:.1f}",
        f"{base_s:.1f}",
        f"{gen_s / base_s:.2f}",
        f"{gen_r:.1f}",
        f"{base_r:.1f}",
        f"{gen_r / base_r:.2f}",
        f"{ops(stash)}/{ops(base_stash)}",
        f"{ops(resolve)}/{ops(base_resolve)}",
    ]


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
            ],
            rows,
        )
    )
    print(
        "\nstash includes publish where the algorithm publishes early; ratio < 1: generated "
        "is faster. Triton launch counts: tests/compiler/test_triton_relay.py (1 per call)."
    )


if __name__ == "__main__":
    main()
