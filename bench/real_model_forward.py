"""One paged forward of the real model (SmolLM2-135M), per CPU decoder path and dtype.

    python bench/real_model_forward.py [--prefix 200] [--widths 1,4,8,16,32,64]
                                       [--iters 10] [--threads 1] [--paths all]
                                       [--march haswell]

Times ``LlamaForCausalLM.forward`` over a cached context of ``--prefix`` tokens: width 1
is a one-token decode, wider a chain verify of that many tokens. Paths: ``f32-blocks``
(native/csrc/ over the file's Q4_1 / Q8_0 blocks, the engine's float32 default for this file:
relayc.engine.native.blocks), ``f32-native`` (native/csrc/, float32 panels: the same
bits), ``f32-scripted`` (the TorchScript layers, MKL), ``f32-eager``,
``bf16-amx``, ``bf16-avx512bf16``, ``bf16-portable`` (native/csrc/, bfloat16 weights, with
that GEMM kernel: relayc.engine.native.library.BF16_KERNELS; those the CPU lacks are left out),
``bf16-eager`` (torch's bfloat16 ops, oneDNN), ``int8-vnni``, ``int8-avx2``, ``int8-scalar``
(dtype "int8": integer dot products over the file's blocks, int8.c, with that kernel; every
kernel gives the same bits). Every (path, width) is timed round robin,
best of ``--iters``; the wall time and the process CPU time of that best run are printed,
so a run that was starved of the CPU (cpu/wall well under 1 with one thread) is visible.
Each cell's ``xN`` is its time over the engine's default path for its dtype
(``f32-blocks`` for float32 and int8; for bfloat16 the kernel the machine picks, marked
``*``). ``--march CPU`` builds the native decoder for that CPU instead of this one
(``haswell``: the AVX2-only build, whose float32 block kernels are the ones an AVX2-only CPU
runs, on a machine that has more; its int8 kernel is the one the ``int8-*`` path names).
"""

from __future__ import annotations

import sys
from pathlib import Path

# this checkout's relayc, not the one the environment installed (an editable install points
# at another checkout: a worktree's benchmark would otherwise time the main tree's code)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import time
from collections.abc import Callable

import torch

import relayc.engine.native.library as native_module
from relayc.engine.checkpoints.loader import load_model
from relayc.engine.core.forward_batch import ForwardBatch, ForwardMode
from relayc.engine.core.kv_cache import KVCache, ReqToTokenPool, TokenToKVPool
from relayc.engine.model.llama import LlamaForCausalLM, use_cpu_matmul_layout
from relayc.engine.native.blocks import forget_blocks, use_int8

KERNEL_PATHS = tuple(f"bf16-{name}" for name in native_module.BF16_KERNELS)
INT8_KERNELS = ("scalar", "avx2", "vnni")  # int8.c's INT8_SCALAR, INT8_AVX2, INT8_VNNI
INT8_PATHS = tuple(f"int8-{name}" for name in reversed(INT8_KERNELS))
PATHS = (
    "f32-blocks",
    "f32-native",
    "f32-scripted",
    "f32-eager",
    *KERNEL_PATHS,
    "bf16-eager",
    *INT8_PATHS,
)


def _no_native() -> None:
    return None


def paged_steps(model: LlamaForCausalLM, prefix: int, widths: list[int]) -> dict[int, ForwardBatch]:
    """A cache holding ``prefix`` random tokens, and one batch per width over it (each
    rewrites the same new slots: every call is the same forward)."""
    config = model.config
    kv_cache = KVCache.for_model(config, prefix + 2 * max(widths) + 8, model.device)
    req_pool = ReqToTokenPool(1, prefix + max(widths) + 8, model.device)
    kv_pool = TokenToKVPool(kv_cache.size, model.device)
    (req,) = req_pool.alloc(1) or [0]
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, config.vocab_size, (prefix,), generator=generator).tolist()
    slots = kv_pool.alloc(prefix)
    assert slots is not None
    req_pool.req_to_token[req, :prefix] = slots.int()
    model(
        ForwardBatch.build(
            ForwardMode.EXTEND, [prompt], [req], [0], slots, req_pool.req_to_token, kv_cache
        )
    )
    steps = {}
    for width in widths:
        new = kv_pool.alloc(width)
        assert new is not None
        mode = ForwardMode.DECODE if width == 1 else ForwardMode.VERIFY
        mask = None if width == 1 else torch.ones(1, width, width, dtype=torch.bool).tril()
        steps[width] = ForwardBatch.build(
            mode,
            [[7] * width],
            [req],
            [prefix],
            new,
            req_pool.req_to_token,
            kv_cache,
            tree_mask=mask,
        )
        kv_pool.free(new)
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prefix", type=int, default=200)
    parser.add_argument("--widths", default="1,4,8,16,32,64")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--paths", default="all", help=f"comma-separated of {', '.join(PATHS)}")
    parser.add_argument("--march", help="build the native decoder for this -march, not native")
    args = parser.parse_args()
    if args.march:
        native_module.FLAGS = [
            f"-march={args.march}" if f == "-march=native" else f for f in native_module.FLAGS
        ]
    paths = list(PATHS) if args.paths == "all" else args.paths.split(",")
    if not paths or set(paths) - set(PATHS):
        parser.error(f"--paths takes {', '.join(PATHS)}, comma-separated")
    widths = [int(w) for w in args.widths.split(",")]
    torch.set_num_threads(args.threads)
    cpu = torch.device("cpu")
    # one model per weight layout: "blocks" (float32 over the file's blocks), "f32", "bf16"
    models: dict[str, LlamaForCausalLM] = {}
    steps: dict[str, dict[int, ForwardBatch]] = {}
    needed = {
        "blocks": "f32-blocks" in paths,
        "f32": any(p.startswith("f32-") and p != "f32-blocks" for p in paths),
        "bf16": any(p.startswith("bf16-") for p in paths),
        "int8": any(p.startswith("int8-") for p in paths),
    }
    for layout, dtype in (
        ("blocks", torch.float32),
        ("f32", torch.float32),
        ("bf16", torch.bfloat16),
        ("int8", torch.float32),
    ):
        if needed[layout]:
            model = load_model("smollm2", device=cpu, dtype=dtype).model
            if layout == "f32":
                forget_blocks(model)  # float32 panels
            if layout == "int8":
                use_int8(model)
            use_cpu_matmul_layout(model)
            models[layout] = model
            steps[layout] = paged_steps(model, args.prefix, widths)
    real_native = native_module.native_decoder
    lib = real_native()
    assert lib is not None, "the native decoder did not build"
    machine = f"bf16-{native_module.bf16_kernel(lib)}"
    missing = [
        p for p in paths if p in KERNEL_PATHS and p[5:] not in native_module.bf16_kernels(lib)
    ]
    int8_here = lib.relayc_int8_kernels()
    int8_machine = lib.relayc_int8_kernel(-1)
    missing += [
        p for p in paths if p in INT8_PATHS and not int8_here >> INT8_KERNELS.index(p[5:]) & 1
    ]
    if missing:
        print(f"left out (this CPU lacks the kernel): {', '.join(missing)}")
        paths = [p for p in paths if p not in missing]

    def run(path: str, width: int) -> Callable[[], None]:
        layout = "blocks" if path == "f32-blocks" else path.split("-")[0]
        model, scripted, step = models[layout], models[layout].scripted, steps[layout][width]

        eager, native = path.endswith("eager"), not path.endswith(("eager", "scripted"))

        def forward() -> None:
            model.scripted = None if eager else scripted
            native_module.native_decoder = real_native if native else _no_native
            if path in KERNEL_PATHS:
                native_module.use_bf16_kernel(lib, path[5:])
            if path in INT8_PATHS:
                lib.relayc_int8_kernel(INT8_KERNELS.index(path[5:]))
            try:
                model(step)
            finally:
                model.scripted = scripted
                native_module.native_decoder = real_native

        return forward

    runs = {(p, w): run(p, w) for p in paths for w in widths}
    try:
        best = _time(runs, args.iters)
    finally:
        native_module.use_bf16_kernel(lib, machine[5:])
        lib.relayc_int8_kernel(int8_machine)
    print(
        f"SmolLM2-135M, context {args.prefix}, {args.threads} thread(s), best of {args.iters}: "
        "wall ms (process cpu / wall of that run)"
    )
    print(f"{'path':<17}" + "".join(f"{f'{w} row' + ('s' if w > 1 else ''):>20}" for w in widths))
    for path in paths:
        default = machine if path.startswith("bf16") else "f32-blocks"
        cells = []
        for width in widths:
            wall, used = best[(path, width)]
            ratio = ""
            if default in paths and path != default:
                ratio = f" x{wall / best[(default, width)][0]:.2f}"
            cells.append(f"{wall * 1e3:7.1f} ({used / wall:.2f}){ratio:>6}")
        chosen = path == machine or path == f"int8-{INT8_KERNELS[int8_machine]}"
        name = path + (" *" if chosen else "")
        print(f"{name:<17}" + "".join(f"{c:>20}" for c in cells))
    print("xN: time over the native path of the same dtype (*: the kernel this machine runs)")


def _time(
    runs: dict[tuple[str, int], Callable[[], None]], iters: int
) -> dict[tuple[str, int], tuple[float, float]]:
    """Best (wall, process cpu) seconds per run over ``iters`` round-robin rounds, after one
    warm-up round (packing, TorchScript's first run, oneDNN's kernels)."""
    for fn in runs.values():
        fn()
    best = {key: (float("inf"), 0.0) for key in runs}
    for _ in range(iters):
        for key, fn in runs.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            fn()
            wall, used = time.perf_counter() - start, time.process_time() - start_cpu
            if wall < best[key][0]:
                best[key] = (wall, used)
    return best


if __name__ == "__main__":
    main()
