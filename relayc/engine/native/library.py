"""The native CPU decoder (C units in relayc/engine/native/csrc/ behind one header,
decoder.h): built once per machine, loaded through ctypes.

``native_decoder()`` compiles every unit in one compiler call into one library, as C
(``-x c``, whatever ``$CC`` is: a C++ driver would mangle the exported names) with the C
compiler (``$CC``, else ``cc``, ``-O3 -march=native``) into a cache folder
(``$RELAYC_CACHE_DIR``, ``~`` expanded and made absolute, else ``~/.cache/relayc``), named
by a hash of every unit and the header (with their names), the flags, the compiler's
version and the CPU (model and feature flags: ``-march=native``), so a changed source,
compiler or machine builds anew and nothing stale is loaded; some seconds, once.
Beside each build a ``.json`` records its size and SHA-256; a build is loaded only when it
matches them, else rebuilt (a truncated library would kill the process with SIGBUS when
mapped). Both files are written beside their targets and renamed, so no process sees half
of either. ``RELAYC_NATIVE`` (``0/1``, ``false/true``, ``off/on``, ``no/yes``, any case)
turns it off or on; other values are an error. ``RELAYC_BF16_KERNEL`` (one of
:data:`BF16_KERNELS`, or ``auto`` / unset for the best this CPU runs) picks the kernel of
every bfloat16 GEMM of the process, so the paths a machine would not choose (portable and
avx512bf16 on an AMX CPU) run the whole suite too; one this CPU cannot run is an error. Where it cannot be built (no compiler, a
compile error) relayc warns once and runs the TorchScript layers instead: the cache is
never needed for correctness.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from relayc.engine.native import tape_ops
from relayc.runtime.tape import native_library

CSRC = Path(__file__).with_name("csrc")
HEADER = "decoder.h"  # what every unit includes: without it no unit compiles
# -ffp-contract=off: a * b + c rounds twice whatever the compiler's default (GCC's ISO
# mode already does; clang would fuse), so the bits depend on the source, not the compiler.
FLAGS = ["-O3", "-march=native", "-ffp-contract=off", "-fPIC", "-shared", "-std=c11"]
# The bfloat16 GEMM kernels, by number (decoder.h's BF16_PORTABLE, BF16_AVX512, BF16_AMX):
# one runs every bfloat16 GEMM of a process, the last this CPU and OS support (gemm_bf16.c).
BF16_KERNELS = ("portable", "avx512bf16", "amx")
# The integer-dot GEMM kernels (dtype "int8"), by number (decoder.h's INT8_*): the best this
# CPU runs is used; every one gives the same bits (int8.c).
INT8_KERNELS = ("scalar", "avx2", "vnni")
_TRUE = ("1", "true", "on", "yes")
_FALSE = ("0", "false", "off", "no")

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_tried = False


def enabled() -> bool:
    """``RELAYC_NATIVE`` as a switch: unset or empty is on; an unknown value is an error."""
    value = os.environ.get("RELAYC_NATIVE", "").strip()
    if not value or value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise ValueError(
        f"RELAYC_NATIVE={value!r} is not a switch: set it to one of "
        f"{', '.join(_FALSE)} (the native CPU decoder off) or {', '.join(_TRUE)} (on)"
    )


def bf16_kernel_choice() -> str | None:
    """``RELAYC_BF16_KERNEL``: a name in :data:`BF16_KERNELS`, or None (unset, empty or
    ``auto``: the best this CPU runs); any other value is an error."""
    value = os.environ.get("RELAYC_BF16_KERNEL", "").strip().lower()
    if not value or value == "auto":
        return None
    if value not in BF16_KERNELS:
        raise ValueError(
            f"RELAYC_BF16_KERNEL={os.environ['RELAYC_BF16_KERNEL']!r} is not a bfloat16 kernel: "
            f"set it to one of {', '.join(BF16_KERNELS)} or auto (the best this CPU runs)"
        )
    return value


def cache_dir() -> Path:
    """Where builds are cached: ``$RELAYC_CACHE_DIR`` (``~`` expanded; a relative path
    is taken from the working directory and made absolute), else ``~/.cache/relayc``."""
    root = os.environ.get("RELAYC_CACHE_DIR", "").strip()
    # A quoted "~" reaches us unexpanded; a relative folder must not move with the cwd.
    return Path(root).expanduser().resolve() if root else Path.home() / ".cache" / "relayc"


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")


def _cpu() -> str:
    """What ``-march=native`` compiles for: the CPU's model and feature flags."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    wanted = [line for line in lines if line.startswith(("model name", "flags", "Features"))]
    return "\n".join(dict.fromkeys(wanted)) or f"{platform.machine()} {platform.processor()}"


def _record(path: Path) -> dict[str, object]:
    """What the cache keeps beside a build to verify it: its size and SHA-256."""
    data = path.read_bytes()
    return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _intact(target: Path, record: Path) -> bool:
    """``target`` is a regular file matching its record (size first: cheap, and what an
    interrupted copy or a full disk gets wrong)."""
    try:
        want = json.loads(record.read_text())
        if not isinstance(want, dict) or not target.is_file():
            return False
        if target.stat().st_size != want.get("size"):
            return False
        return _record(target) == want
    except (OSError, ValueError):
        return False


def sources() -> list[Path]:
    """The decoder's C units, sorted by name: every ``*.c`` in :data:`CSRC`, all compiled
    into the one library. An error that names the folder where the header or every unit is
    missing (an install without its package data)."""
    units = sorted(CSRC.glob("*.c"))
    if not (CSRC / HEADER).is_file() or not units:
        raise RuntimeError(
            f"the native decoder's C sources are incomplete: {CSRC} needs {HEADER} and "
            "its *.c units (reinstall relayc, or restore the folder from its repository)"
        )
    return units


# Told None when a compile starts and its seconds when it ends (`relayc generate` prints
# them: a first run otherwise sits silent for the build, which looks like a slow load).
BuildListener = Callable[[float | None], None]
_build_listener: BuildListener | None = None


@contextmanager
def build_progress(listener: BuildListener) -> Iterator[None]:
    """Within the block, ``listener`` hears of every build of the library (not of a cached
    one being loaded)."""
    global _build_listener
    previous, _build_listener = _build_listener, listener
    try:
        yield
    finally:
        _build_listener = previous


def _build(compiler: str) -> Path:
    units = sources()
    version = subprocess.run(
        [compiler, "--version"], capture_output=True, text=True, check=False
    ).stdout
    # Every unit and the header, with their names: an edit to any of them, a unit added,
    # removed or renamed builds anew. A cache folder shared between machines must not hand
    # one CPU another's build.
    texts = [f"{path.name}\0{path.read_text()}" for path in [*units, CSRC / HEADER]]
    key = "\0".join([*texts, " ".join(FLAGS), version, _cpu()])
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    target = cache_dir() / f"decoder-{digest}.so"
    record = target.with_suffix(".json")
    if _intact(target, record):
        return target
    if target.is_dir():
        raise RuntimeError(f"{target} is a folder, not the decoder's library: remove it")
    target.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename: a concurrent process never loads half a file.
    # The library first, its record second: a reader between the two renames finds a
    # mismatch and builds again, never a record vouching for other bytes.
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        built = Path(tmp) / target.name
        # -x c before every unit: C whatever the driver, so CC=g++ or clang++ still exports
        # relayc_decoder unmangled (g++ takes only the one file after an -x c as C).
        as_c = [arg for unit in units for arg in ("-x", "c", str(unit))]
        listener, start = _build_listener, time.perf_counter()
        if listener is not None:
            listener(None)
        result = subprocess.run(
            [compiler, *FLAGS, "-o", str(built), *as_c, "-lm"],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"{compiler} failed: {result.stderr.strip()[:2000]}")
        if listener is not None:
            listener(time.perf_counter() - start)
        written = Path(tmp) / record.name
        written.write_text(json.dumps(_record(built)))
        os.replace(built, target)
        os.replace(written, record)
    return target


def _load(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))  # CDLL: the call releases the GIL
    p, i = ctypes.c_void_p, ctypes.c_int
    # float32 and bfloat16 weights: the same parameters, the weights and caches typed apart
    for fn in (lib.relayc_decoder, lib.relayc_decoder_bf16):
        fn.argtypes = [i] * 7 + [p] * 6 + [i] * 3 + [p] * 10 + [ctypes.c_int64]
        fn.restype = i
    for fn in (lib.relayc_decoder_ex, lib.relayc_decoder_bf16_ex):
        fn.argtypes = [i] * 7 + [p] * 6 + [i] * 3 + [p] * 10 + [ctypes.c_int64, p, i, p, i, p]
        fn.restype = i
    # float32 layers over GGUF block panels: the _ex parameters, each weight's format first
    lib.relayc_decoder_blocks_ex.argtypes = (
        [i] * 7 + [p] * 6 + [i] * 3 + [p] * 10 + [ctypes.c_int64, p, p, i, p, i, p]
    )
    lib.relayc_decoder_blocks_ex.restype = i
    for head in (lib.relayc_head, lib.relayc_head_bf16):
        head.argtypes = [i, i, i, p, p, ctypes.c_float, p, p]
        head.restype = i
    lib.relayc_head_blocks.argtypes = [i, i, i, p, p, ctypes.c_float, p, p, i]
    lib.relayc_head_blocks.restype = i
    lib.relayc_head_argmax.argtypes = [i, i, i, i, p, p, ctypes.c_float, p, p, i, p]
    lib.relayc_head_argmax.restype = i
    lib.relayc_linear.argtypes = [i, i, i, p, p, p, i]  # rows, in, out padded; x, w, out
    lib.relayc_linear.restype = i
    # rows; then per input its width, rows, norm weight and eps; then the output
    lib.relayc_norm_pair.argtypes = [i, i, p, p, ctypes.c_float, i, p, p, ctypes.c_float, p]
    lib.relayc_norm_pair.restype = i
    # a GGUF matrix's raw bytes: type code, rows, columns, then the output (or the weight
    # to compare and its row and column strides)
    q = ctypes.c_int64
    for fn in (lib.relayc_gguf_dequantize, lib.relayc_gguf_panels):
        fn.argtypes = [p, i, q, q, p]
        fn.restype = i
    lib.relayc_gguf_matches.argtypes = [p, i, q, q, p, q, q]
    lib.relayc_gguf_matches.restype = i
    lib.relayc_exp.argtypes = [p, q, p]
    lib.relayc_exp.restype = i
    lib.relayc_argmax.argtypes = [p, ctypes.c_int64, ctypes.c_int64, p]
    lib.relayc_argmax.restype = i
    lib.relayc_gather_rows.argtypes = [p, q, q, p, q, i, p]
    lib.relayc_scatter_rows.argtypes = [p, q, q, p, q, p]
    lib.relayc_cat_bytes.argtypes = [p, q, i, p, p]
    lib.relayc_fill_pattern.argtypes = [p, q, q, p]
    lib.relayc_cast_int.argtypes = [p, i, p, i, q]
    lib.relayc_add_int64.argtypes = [p, p, q, q, q, i, p]
    for fn in (
        lib.relayc_gather_rows,
        lib.relayc_scatter_rows,
        lib.relayc_cat_bytes,
        lib.relayc_fill_pattern,
        lib.relayc_cast_int,
        lib.relayc_add_int64,
    ):
        fn.restype = i
    lib.relayc_copy_bytes.argtypes = [p, p, q]
    lib.relayc_copy_bytes.restype = i
    lib.relayc_zero_bytes.argtypes = [p, q]
    lib.relayc_zero_bytes.restype = i
    # batch, queries, prefix columns; req_to_token, its rows and width; then the pointers
    lib.relayc_paged_meta.argtypes = [i, i, i, p, q, q, p, p, p, p, p, p]
    lib.relayc_paged_meta.restype = i
    # the model (a NativeModel); batch, queries, prefix columns; req_to_token, its rows and
    # width; rows, prefix lengths, slots, tree mask, ids, positions; capture, its count,
    # aux; then the outputs: hidden, logits, argmax
    lib.relayc_forward.argtypes = [p, i, i, i, p, q, q, p, p, p, p, p, p, p, i, p, p, p, p]
    lib.relayc_forward.restype = i
    # the model (its one layer the draft layer's, its head the draft head); batch, steps,
    # prefix columns; req_to_token, its rows and width; rows, sequence lengths, scratch
    # slots, d2t; the two input norms' weights and eps; the first g; the tokens
    f = ctypes.c_float
    lib.relayc_draft_chain.argtypes = [p, i, i, i, p, q, q, p, p, p, p, p, f, p, f, p, p]
    lib.relayc_draft_chain.restype = i
    # batch, nodes, most accepted; the trees' four index arrays and the argmax; then
    # accept_index, accept_lens, accept_tokens, bonus
    lib.relayc_accept_greedy.argtypes = [i, i, i, p, p, p, p, p, p, p, p, p]
    lib.relayc_accept_greedy.restype = i
    # the model (the draft layer and head); batch, width, prefix columns; req_to_token, its
    # rows and width; rows, prefix lengths, lens, slots, ids, features and their width, the
    # feature rows and how many there are; fc and its format; the two input norms' weights
    # and eps; then g, logits, argmax
    lib.relayc_draft_extend.argtypes = [p, i, i, i, p, q, q, *[p] * 6, i, p, q, p, i, p, f, p, f]
    lib.relayc_draft_extend.argtypes += [p, p, p]
    lib.relayc_draft_extend.restype = i
    # batch, window width; the windows and their row stride, accept_index; the K/V buffer,
    # its planes, slots and row bytes; req_to_token, its rows and width; rows, sequence
    # lengths, accept lengths; then the new sequence lengths
    lib.relayc_compact.argtypes = [i, i, p, q, p, p, q, q, q, p, q, q, p, p, p, p]
    lib.relayc_compact.restype = i
    # a recorded step's native calls in one call (relayc.runtime.tape), and their names
    lib.relayc_tape_run.argtypes = [p, ctypes.c_int64, p]
    lib.relayc_tape_run.restype = ctypes.c_int64
    lib.relayc_tape_name.argtypes = [i]
    lib.relayc_tape_name.restype = ctypes.c_char_p
    # the integer-dot GEMMs (int8.c): rows, K, N, x, panels, format, kernel, out; and the
    # activations' quantisation: rows, K, x, q, d, s, sum
    lib.relayc_int8_gemm.argtypes = [i, i, i, p, p, i, i, p]
    lib.relayc_int8_quantize.argtypes = [i, i, p, p, p, p, p]
    for fn in (
        lib.relayc_int8_gemm,
        lib.relayc_int8_quantize,
        lib.relayc_int8_kernels,
        lib.relayc_block_isa,
    ):
        fn.restype = i
    lib.relayc_int8_kernels.argtypes = lib.relayc_block_isa.argtypes = []
    lib.relayc_int8_kernel.argtypes = [i]
    lib.relayc_int8_kernel.restype = i
    lib.relayc_bf16_kernels.argtypes = []
    lib.relayc_bf16_kernels.restype = i
    lib.relayc_bf16_kernel.argtypes = [i]
    lib.relayc_bf16_kernel.restype = i
    return lib


class NativeModel(ctypes.Structure):
    """decoder.h's ``struct relayc_model``: what ``relayc_forward`` reads of one model
    (relayc.engine.decoder.fused_forward fills it and keeps every tensor it points into alive)."""

    _fields_ = [
        *((name, ctypes.c_int) for name in ("hidden", "heads", "kv_heads", "head_dim")),
        *((name, ctypes.c_int) for name in ("inter", "layers", "kind")),
        *(
            (name, ctypes.c_void_p)
            for name in ("formats", "ln1", "w_qkv", "w_o", "ln2", "w_gate_up", "w_down")
        ),
        *((name, ctypes.c_void_p) for name in ("eps1", "eps2", "k_cache", "v_cache")),
        ("cache_rows", ctypes.c_int64),
        ("embed", ctypes.c_void_p),
        ("embed_bf16", ctypes.c_int),
        ("vocab_rows", ctypes.c_int64),
        ("cos_table", ctypes.c_void_p),
        ("sin_table", ctypes.c_void_p),
        ("max_position", ctypes.c_int64),
        ("norm_weight", ctypes.c_void_p),
        ("norm_eps", ctypes.c_float),
        ("head", ctypes.c_void_p),
        *((name, ctypes.c_int) for name in ("head_format", "vocab", "vocab_padded")),
    ]


def native_decoder() -> ctypes.CDLL | None:
    """The loaded library, built on first use; None where it is off or cannot be built.
    While a decode step is recorded for a CPU graph, a stand-in that records each call
    (``relayc.runtime.tape.native_library``)."""
    if _tried:
        return native_library(_lib)
    return native_library(_load_once())


def _load_once() -> ctypes.CDLL | None:
    global _lib, _tried
    if _tried:
        return _lib
    with _lock:
        if _tried:
            return _lib
        if not enabled():  # a bad value raises here, not as a fallback warning
            _tried = True
            return None
        kernel = bf16_kernel_choice()  # likewise
        try:
            compiler = _compiler()
            if compiler is None:
                raise RuntimeError("no C compiler found (set $CC)")
            lib = _load(_build(compiler))
            tape_ops.install(lib)
        except Exception as exc:
            warnings.warn(
                f"relayc: the native CPU decoder is unavailable ({exc}); running the "
                "TorchScript layers instead (slower)",
                RuntimeWarning,
                stacklevel=2,
            )
            lib = None
        if lib is not None and kernel is not None:
            if kernel not in bf16_kernels(lib):
                # Not a fallback: the switch asked for a path this machine cannot run.
                raise ValueError(
                    f"RELAYC_BF16_KERNEL={kernel} does not run on this CPU: it runs "
                    f"{', '.join(bf16_kernels(lib))} (or unset it for the best)"
                )
            use_bf16_kernel(lib, kernel)
        _lib, _tried = lib, True
    return _lib


def bf16_kernels(lib: ctypes.CDLL) -> tuple[str, ...]:
    """The bfloat16 GEMM kernels this CPU and OS run (names from :data:`BF16_KERNELS`)."""
    found = lib.relayc_bf16_kernels()
    return tuple(name for bit, name in enumerate(BF16_KERNELS) if found >> bit & 1)


def bf16_kernel(lib: ctypes.CDLL) -> str:
    """The kernel every bfloat16 GEMM of this process runs: the best in :func:`bf16_kernels`
    unless :func:`use_bf16_kernel` chose another."""
    return BF16_KERNELS[lib.relayc_bf16_kernel(-1)]


def use_bf16_kernel(lib: ctypes.CDLL, name: str) -> str:
    """Make ``name`` the kernel of every later bfloat16 GEMM; returns the one it replaces.
    For tests and benchmarks: the kernels' bits differ (portable and avx512bf16 agree but
    for subnormals; amx may differ in the last place), so a switch while requests run
    would make their decodes and verifies disagree."""
    if name not in BF16_KERNELS:
        raise ValueError(f"unknown bfloat16 kernel {name!r}: one of {', '.join(BF16_KERNELS)}")
    previous = bf16_kernel(lib)
    if lib.relayc_bf16_kernel(BF16_KERNELS.index(name)) < 0:
        raise ValueError(
            f"the {name} kernel does not run on this CPU: it runs {', '.join(bf16_kernels(lib))}"
        )
    return previous
