"""The native decoder's GEMM per weight format, on a 1B Llama's matrix shapes: float32 panels
against each GGUF block format the native decoder reads, and the bfloat16 / float16 words
it reads for float32 weights that are exactly such numbers.

    python bench/block_kernels.py [--rows 1,4,8] [--iters 20] [--threads 1] [--base REV]

Each format is timed on the same random weights, written in GGUF's own bytes for its type
(random blocks with small finite scales; the `gguf` package cannot write the K-quants) and
packed as the engine packs them (relayc.engine.native.blocks), through the native LM
head entry (an RMSNorm, then the GEMM) over two layers of TinyLlama-1.1B's shapes (hidden
2048, 4 KV heads of 64, intermediate 5632: every width a whole number of the K-quants'
256-weight super-blocks, which SmolLM2's 576 is not): each layer's fused q/k/v, o, fused
gate/up and down, one after another -- 88M weights, 352 MB as float32, so they stream from
memory as in a forward. Every (format, rows) is timed round robin, best of ``--iters``;
wall ms per pass, the weights read a second (G/s), and the process CPU time over the wall
time of that best pass. Each format's output is checked bit for bit against float32 panels
over the dequantized weights first.

``--base REV`` times each (format, rows) with the C sources as they are at git revision
``REV`` too (bench/native_ab.py's build of them), round robin in the same process, and prints the
work tree's time over it (``new/base``): what a kernel change buys per format.
"""

from __future__ import annotations

import sys
from pathlib import Path

# this checkout's relayc, not the one the environment installed (an editable install points
# at another checkout: a worktree's benchmark would otherwise time the main tree's code)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import tempfile
from collections.abc import Callable
from typing import Any

import torch
from native_ab import _base_library  # bench/, this script's folder
from real_model_forward import _time as round_robin_best

from relayc.engine.decoder.packing import _pack
from relayc.engine.native.blocks import BLOCK_TYPES, PANEL_BYTES, BlockWeight, random_blocks
from relayc.engine.native.library import native_decoder

# TinyLlama-1.1B's layer matrices [out, in], fused as the engine fuses them
SHAPES = [(2560, 2048), (2048, 2048), (11264, 2048), (2048, 5632)]
LAYERS = 2
TYPES = ("Q4_1", "Q4_K", "Q8_0", "Q5_K", "Q6_K", "BF16", "F16")
BASELINE = "float32 panels"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,4,8")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--base", default=None, help="a git revision's C sources to compare")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    lib = native_decoder()
    if lib is None:
        raise SystemExit("the native decoder did not build")
    if args.base is not None:
        with tempfile.TemporaryDirectory() as folder:
            compare(lib, _base_library(args.base, Path(folder)), args)
        return
    rows_list = [int(r) for r in args.rows.split(",")]
    # per format, LAYERS layers of matrices (distinct copies: they stream from memory)
    layers: dict[str, list[list[tuple[torch.Tensor, int, int, int]]]] = {}
    blocks: dict[str, list[BlockWeight]] = {}
    for qtype in TYPES:
        blocks[qtype] = [random_blocks(qtype, n, k, seed) for seed, (n, k) in enumerate(SHAPES)]
        layers[qtype] = [
            [(w.panels(), w.format, n, k) for w, (n, k) in zip(blocks[qtype], SHAPES, strict=True)]
            for _ in range(LAYERS)
        ]
    layers[BASELINE] = [
        [(_pack(w.dequantize()), 0, n, k) for w, (n, k) in zip(blocks["Q4_1"], SHAPES, strict=True)]
        for _ in range(LAYERS)
    ]
    ones = {k: torch.ones(k) for _, k in SHAPES}

    def gemm(packed: torch.Tensor, fmt: int, n: int, k: int, x: torch.Tensor) -> torch.Tensor:
        out = torch.empty(x.shape[0], n)
        args_ = (x.shape[0], k, n, x.data_ptr(), ones[k].data_ptr(), 1e-6, packed.data_ptr())
        if fmt:
            code = lib.relayc_head_blocks(*args_, out.data_ptr(), fmt)
        else:
            code = lib.relayc_head(*args_, out.data_ptr())
        assert code == 0, code
        return out

    inputs = {(r, k): torch.randn(r, k) for r in rows_list for _, k in SHAPES}
    for qtype in TYPES:  # the same bits as float32 panels over the dequantized weights
        for w, (packed, fmt, n, k) in zip(blocks[qtype], layers[qtype][0], strict=True):
            x = inputs[(rows_list[-1], k)]
            dense = gemm(_pack(w.dequantize()), 0, n, k, x)
            assert torch.equal(gemm(packed, fmt, n, k, x), dense), qtype

    def run(name: str, rows: int) -> Callable[[], None]:
        def one_pass() -> None:
            for layer in layers[name]:
                for packed, fmt, n, k in layer:
                    gemm(packed, fmt, n, k, inputs[(rows, k)])

        return one_pass

    names = [*TYPES, BASELINE]
    runs = {(name, r): run(name, r) for name in names for r in rows_list}
    best = round_robin_best(runs, args.iters)
    weights = LAYERS * sum(n * k for n, k in SHAPES)
    print(
        f"{LAYERS} layers of TinyLlama-1.1B's matrices ({weights / 1e6:.0f}M weights), "
        f"{args.threads} thread(s), best of {args.iters}: wall ms (G weights/s, cpu/wall)"
    )
    print(f"{'format':<24}{'bytes/weight':>13}" + "".join(f"{f'{r} rows':>26}" for r in rows_list))
    for name in names:
        fmt = BLOCK_TYPES[name][2] if name in BLOCK_TYPES else 0
        per = PANEL_BYTES[fmt] / 512 if fmt else 4.0
        cells = []
        for r in rows_list:
            wall, used = best[(name, r)]
            ratio = wall / best[(BASELINE, r)][0]
            cells.append(
                f"{wall * 1e3:7.2f} ({weights / wall / 1e9:5.1f}, {used / wall:.2f}) x{ratio:.2f}"
            )
        print(f"{name:<24}{per:>13.3f}" + "".join(f"{c:>26}" for c in cells))
    print("xN: time over float32 panels; every format's output equals float32 panels' bits")


def compare(lib: Any, base: Any, args: argparse.Namespace) -> None:
    """Each format's GEMM on the work tree's library against ``base``'s, round robin."""
    rows_list = [int(r) for r in args.rows.split(",")]
    layers = {
        qtype: [
            [(w.panels(), w.format, n, k) for w, (n, k) in zip(blocks, SHAPES, strict=True)]
            for blocks in [
                [
                    random_blocks(qtype, n, k, LAYERS * seed + i)
                    for seed, (n, k) in enumerate(SHAPES)
                ]
                for i in range(LAYERS)
            ]
        ]
        for qtype in TYPES
    }
    ones = {k: torch.ones(k) for _, k in SHAPES}
    inputs = {(r, k): torch.randn(r, k) for r in rows_list for _, k in SHAPES}
    outs = {(r, n): torch.empty(r, n) for r in rows_list for n, _ in SHAPES}

    def run(library: Any, qtype: str, rows: int) -> Callable[[], None]:
        def one_pass() -> None:
            for layer in layers[qtype]:
                for packed, fmt, n, k in layer:
                    x, out = inputs[(rows, k)], outs[(rows, n)]
                    code = library.relayc_head_blocks(
                        rows, k, n, x.data_ptr(), ones[k].data_ptr(), 1e-6,
                        packed.data_ptr(), out.data_ptr(), fmt,
                    )  # fmt: skip
                    assert code == 0, code

        return one_pass

    runs = {}
    for qtype in TYPES:
        for rows in rows_list:
            runs[(f"new {qtype}", rows)] = run(lib, qtype, rows)
            runs[(f"base {qtype}", rows)] = run(base, qtype, rows)
    best = round_robin_best(runs, args.iters)
    print(
        f"{LAYERS} layers of TinyLlama-1.1B's matrices, {args.threads} thread(s), best of "
        f"{args.iters}: wall ms, work tree (new) against {args.base} (base), cpu/wall"
    )
    print(f"{'format':<10}" + "".join(f"{f'{r} rows':>34}" for r in rows_list))
    for qtype in TYPES:
        cells = []
        for rows in rows_list:
            (new, new_cpu), (old, old_cpu) = (
                best[(f"new {qtype}", rows)],
                best[(f"base {qtype}", rows)],
            )
            cells.append(
                f"{new * 1e3:6.2f} vs {old * 1e3:6.2f} ({min(new_cpu / new, old_cpu / old):.2f})"
                f" x{new / old:.2f}"
            )
        print(f"{qtype:<10}" + "".join(f"{c:>34}" for c in cells))
    print("xN: new over base (under 1: the work tree's kernels are faster)")


if __name__ == "__main__":
    main()
