"""Where a decode forward's time goes: relayc's paged forward against transformers', op by op.

    python bench/forward_profile.py [--prefix 200] [--batch 1] [--width 1] [--iters 200]
                                    [--profile] [--threads 1] [--paths native,scripted,eager]

Times one forward of the shipped demo target over a cached prefix of ``--prefix`` tokens
-- ``--width 1``: a decode step, wider: a chain verify of that many tokens -- for relayc
(``LlamaForCausalLM.forward`` on the paged cache) and for transformers (the same weights,
a ``DynamicCache`` cropped back after each call), interleaved, best of ``--iters``.
``--profile`` adds torch.profiler's table of relayc's forward, op by op (self CPU time).
``--paths`` picks relayc's CPU decoder paths to time side by side (the first one is the
"relayc" column and the one ``--profile`` profiles): ``native`` (native/csrc/, what the
engine runs for small batches), ``scripted`` (the TorchScript layers, same ops as eager),
``eager`` (plain torch modules).
"""

from __future__ import annotations

import sys
from pathlib import Path

# this checkout's relayc, not the one the environment installed (an editable install points
# at another checkout: a worktree's benchmark would otherwise time the main tree's code)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import time
import warnings
from collections.abc import Callable

import torch

import relayc.engine.native as native_module
from relayc.engine.forward_batch import ForwardBatch, ForwardMode
from relayc.engine.kv_cache import KVCache, ReqToTokenPool, TokenToKVPool
from relayc.engine.model import LlamaForCausalLM, use_cpu_matmul_layout
from relayc.engine.shipped import DEMO_DIR
from relayc.engine.weights import load_checkpoint


def _no_native() -> None:
    return None


def relayc_step(batch_size: int, prefix: int, width: int) -> tuple[LlamaForCausalLM, ForwardBatch]:
    model = load_checkpoint(DEMO_DIR / "target")
    use_cpu_matmul_layout(model)
    config = model.config
    kv_cache = KVCache.for_model(config, 4096, model.device)
    req_pool = ReqToTokenPool(batch_size, 1024, model.device)
    kv_pool = TokenToKVPool(4096, model.device)
    reqs = req_pool.alloc(batch_size)
    assert reqs is not None
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 256, (prefix,), generator=generator).tolist() for _ in reqs]
    slots = kv_pool.alloc(batch_size * prefix)
    assert slots is not None
    for row, req in enumerate(reqs):
        req_pool.req_to_token[req, :prefix] = slots[row * prefix : (row + 1) * prefix].int()
    model(
        ForwardBatch.build(
            ForwardMode.EXTEND,
            prompts,
            reqs,
            [0] * batch_size,
            slots,
            req_pool.req_to_token,
            kv_cache,
        )
    )
    new = kv_pool.alloc(batch_size * width)
    assert new is not None
    mode = ForwardMode.DECODE if width == 1 else ForwardMode.VERIFY
    mask = None if width == 1 else torch.ones(batch_size, width, width, dtype=torch.bool).tril()
    step = ForwardBatch.build(
        mode,
        [[7] * width] * batch_size,
        reqs,
        [prefix] * batch_size,
        new,
        req_pool.req_to_token,
        kv_cache,
        tree_mask=mask,
    )
    return model, step


def hf_step(batch_size: int, prefix: int, width: int) -> Callable[[], None]:
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    warnings.filterwarnings("ignore", category=FutureWarning)
    model = transformers.LlamaForCausalLM.from_pretrained(
        DEMO_DIR / "target", dtype=torch.float32
    ).eval()
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 256, (batch_size, prefix), generator=generator)
    cache = transformers.DynamicCache()
    with torch.no_grad():
        model(ids, past_key_values=cache)
    step_ids = torch.full((batch_size, width), 7)

    @torch.no_grad()
    def step() -> None:
        model(step_ids, past_key_values=cache)
        cache.crop(-width)

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prefix", type=int, default=200)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--width", type=int, default=1)
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument(
        "--paths", default="native,scripted,eager", help="relayc decoder paths to time"
    )
    args = parser.parse_args()
    paths = args.paths.split(",")
    if not paths or set(paths) - {"native", "scripted", "eager"}:
        parser.error("--paths takes native, scripted and eager, comma-separated")
    torch.set_num_threads(args.threads)
    model, step = relayc_step(args.batch, args.prefix, args.width)
    hf = hf_step(args.batch, args.prefix, args.width)
    scripted = model.scripted
    real_native = native_module.native_decoder

    def path(name: str) -> Callable[[], None]:
        def run() -> None:
            model.scripted = None if name == "eager" else scripted
            native_module.native_decoder = real_native if name == "native" else _no_native
            model(step)

        return run

    runs: list[tuple[str, Callable[[], None]]] = [(f"relayc {paths[0]}", path(paths[0]))]
    runs.append(("transformers", hf))
    runs += [(f"relayc {name}", path(name)) for name in paths[1:]]
    ours = runs[0][1]
    first = runs[0][0]
    # Thread CPU time as well as wall time: on a crowded machine a forward that was
    # descheduled halfway shows in the wall time only.
    wall = {name: float("inf") for name, _ in runs}
    cpu = dict(wall)
    for _ in range(args.iters):
        for name, fn in runs:
            start, start_cpu = time.perf_counter(), time.thread_time()
            fn()
            cpu[name] = min(cpu[name], time.thread_time() - start_cpu)
            wall[name] = min(wall[name], time.perf_counter() - start)
    for label, best in (("wall", wall), ("thread cpu", cpu)):
        print(
            f"batch {args.batch}, width {args.width}, prefix {args.prefix}, {label}: "
            + ", ".join(f"{k} {v * 1e3:.3f} ms" for k, v in best.items())
            + f" ({first} / transformers = {best[first] / best['transformers']:.2f})"
        )
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(20):
                ours()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))


if __name__ == "__main__":
    main()
