"""The native CPU decoder (decoder.c): built once per machine, loaded through ctypes.

``native_decoder()`` compiles ``decoder.c`` with the C compiler (``$CC``, else ``cc``,
``-O3 -march=native``) into a cache folder (``$RELAYC_CACHE_DIR``, else
``~/.cache/relayc``), named by a hash of the source, the flags, the compiler's version
and the CPU (model and feature flags: ``-march=native``), so a changed source, compiler
or machine builds anew and nothing stale is loaded; about a second, once. ``RELAYC_NATIVE=0`` turns it off. Where it cannot be built (no
compiler, a compile error) relayc warns once and runs the TorchScript layers instead:
the cache is never needed for correctness.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path

SOURCE = Path(__file__).with_name("decoder.c")
# -ffp-contract=off: a * b + c rounds twice whatever the compiler's default (GCC's ISO
# mode already does; clang would fuse), so the bits depend on the source, not the compiler.
FLAGS = ["-O3", "-march=native", "-ffp-contract=off", "-fPIC", "-shared", "-std=c11"]

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_tried = False


def cache_dir() -> Path:
    root = os.environ.get("RELAYC_CACHE_DIR")
    return Path(root) if root else Path.home() / ".cache" / "relayc"


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


def _build(compiler: str) -> Path:
    version = subprocess.run(
        [compiler, "--version"], capture_output=True, text=True, check=False
    ).stdout
    # A cache folder shared between machines must not hand one CPU another's build.
    key = "\0".join([SOURCE.read_text(), " ".join(FLAGS), version, _cpu()])
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    target = cache_dir() / f"decoder-{digest}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename: a concurrent process never loads half a file.
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        built = Path(tmp) / target.name
        result = subprocess.run(
            [compiler, *FLAGS, "-o", str(built), str(SOURCE), "-lm"],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"{compiler} failed: {result.stderr.strip()[:2000]}")
        os.replace(built, target)
    return target


def _load(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))  # CDLL: the call releases the GIL
    fn = lib.relayc_decoder
    p, i = ctypes.c_void_p, ctypes.c_int
    fn.argtypes = [i] * 7 + [p] * 6 + [i] * 3 + [p] * 10 + [ctypes.c_int64]
    fn.restype = i
    head = lib.relayc_head
    head.argtypes = [i, i, i, p, p, ctypes.c_float, p, p]
    head.restype = i
    return lib


def native_decoder() -> ctypes.CDLL | None:
    """The loaded library, built on first use; None where it is off or cannot be built."""
    global _lib, _tried
    if _tried:
        return _lib
    with _lock:
        if _tried:
            return _lib
        try:
            if os.environ.get("RELAYC_NATIVE", "1") == "0":
                return None
            compiler = _compiler()
            if compiler is None:
                raise RuntimeError("no C compiler found (set $CC)")
            _lib = _load(_build(compiler))
        except Exception as exc:
            warnings.warn(
                f"relayc: the native CPU decoder is unavailable ({exc}); running the "
                "TorchScript layers instead (slower)",
                RuntimeWarning,
                stacklevel=2,
            )
            _lib = None
        finally:
            _tried = True
    return _lib
