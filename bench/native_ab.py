"""The native decoder's C sources of a git revision against the work tree's, on the real
model's forward.

    python bench/native_ab.py [--base HEAD] [--prefix 50,200,1000] [--widths 1,4]
                              [--iters 16] [--threads 1]

Builds the C units in ``relayc/engine/native/csrc/`` (before they were split,
``relayc/engine/decoder.c``) as they are at ``--base`` (any revision ``git show`` takes)
beside the work tree's, loads SmolLM2-135M once (float32 over the GGUF file's
blocks, the engine's default), and times one paged forward per (``--prefix`` tokens
cached, ``--widths`` new tokens: 1 a decode, more a chain verify), switching the library
the native layers call between the two -- one process, the same weights and caches,
round robin, best of ``--iters``, the process CPU time over the wall time of each best run
printed beside it so a starved run shows. For native kernel work: what a change to
the C sources buys, measured on this noisy machine the only way that holds up.
"""

from __future__ import annotations

import sys
from pathlib import Path

# this checkout's relayc, not the one the environment installed (an editable install points
# at another checkout: a worktree's benchmark would otherwise time the main tree's code)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import ctypes
import subprocess
import tempfile
import time
from typing import Any

import torch
from real_model_forward import paged_steps  # bench/, this script's folder

import relayc.engine.native.library as native_module
from relayc.engine.checkpoints.loader import load_model
from relayc.engine.model.llama import use_cpu_matmul_layout

REPO = Path(__file__).resolve().parents[1]


class _Older:
    """A library built from older C sources: entry points it lacks read as stand-ins,
    so native._load can set every signature it knows (the forward never calls them)."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._lib = lib

    def __getattr__(self, name: str) -> Any:
        try:
            return getattr(self._lib, name)
        except AttributeError:
            return ctypes.CFUNCTYPE(None)()


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True
    ).stdout


def _base_sources(revision: str, folder: Path) -> None:
    """The C sources at ``revision`` into ``folder``: its csrc/ units and header, or, before
    the split, its one decoder.c (which includes no header: an empty one stands in)."""
    paths = _git("ls-tree", "--name-only", revision, "relayc/engine/native/csrc/").split()
    for path in paths:
        (folder / Path(path).name).write_text(_git("show", f"{revision}:{path}"))
    if not paths:
        (folder / "decoder.c").write_text(_git("show", f"{revision}:relayc/engine/decoder.c"))
        (folder / native_module.HEADER).write_text("")


def _base_library(revision: str, folder: Path) -> Any:
    _base_sources(revision, folder)
    compiler = native_module._compiler()
    if compiler is None:
        raise SystemExit("no C compiler found (set $CC)")
    real_csrc, real_cdll = native_module.CSRC, native_module.ctypes.CDLL
    native_module.CSRC = folder
    try:
        built = native_module._build(compiler)
        native_module.ctypes.CDLL = lambda name: _Older(real_cdll(name))  # type: ignore[assignment,misc]
        return native_module._load(built)
    finally:
        native_module.CSRC, native_module.ctypes.CDLL = real_csrc, real_cdll


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="HEAD")
    parser.add_argument("--prefix", default="50,200,1000")
    parser.add_argument("--widths", default="1,4")
    parser.add_argument("--iters", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    prefixes = [int(p) for p in args.prefix.split(",")]
    widths = [int(w) for w in args.widths.split(",")]
    new = native_module.native_decoder()
    if new is None:
        raise SystemExit("the work tree's native decoder did not build")
    with tempfile.TemporaryDirectory() as tmp:
        libraries = {"base": _base_library(args.base, Path(tmp)), "new": new}
    model = load_model("smollm2", device=torch.device("cpu"), dtype=torch.float32).model
    use_cpu_matmul_layout(model)
    steps = {p: paged_steps(model, p, widths) for p in prefixes}
    best: dict[tuple[int, int, str], tuple[float, float]] = {}
    try:
        with torch.inference_mode():
            for round_ in range(args.iters + 1):  # round 0 warms up
                for p in prefixes:
                    for w in widths:
                        for name, lib in libraries.items():
                            native_module._lib = lib
                            start, cpu = time.perf_counter(), time.process_time()
                            model(steps[p][w])
                            wall, used = time.perf_counter() - start, time.process_time() - cpu
                            key = (p, w, name)
                            if round_ and wall < best.get(key, (float("inf"), 0.0))[0]:
                                best[key] = (wall, used)
    finally:
        native_module._lib = new
    print(
        f"SmolLM2-135M float32 (GGUF blocks), {args.threads} thread(s), best of {args.iters}: "
        f"the C sources at {args.base} (base) against the work tree's (new), ms (cpu/wall)"
    )
    for p in prefixes:
        for w in widths:
            (bw, bc), (nw, nc) = best[(p, w, "base")], best[(p, w, "new")]
            print(
                f"  prefix {p:>5}, {w} row{'s' if w > 1 else ' '}: base {bw * 1e3:7.2f} "
                f"({bc / bw:.2f})  new {nw * 1e3:7.2f} ({nc / nw:.2f})  new/base x{nw / bw:.2f}"
            )


if __name__ == "__main__":
    main()
