"""Building, caching and switching the native CPU decoder (relayc.engine.native.library).

Most tests stand a fake compiler in for ``cc`` (it writes fixed bytes where ``-o`` says),
so the cache's bookkeeping is tested in milliseconds; the end-to-end tests compile and
load the real library.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
import tomllib
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import relayc.engine.native.library as native_module
from relayc.engine import Engine

REPO = Path(__file__).resolve().parents[2]


class FakeCompiler:
    """``subprocess.run`` for native.py: a fixed version string, and a build that writes
    16 KiB to the ``-o`` path, its last byte the build's number (a compiler need not be
    byte-for-byte reproducible), and counts itself."""

    def __init__(self) -> None:
        self.builds: list[list[str]] = []
        self.last = b""

    def __call__(self, cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        if "--version" in cmd:
            return subprocess.CompletedProcess(cmd, 0, "fakecc 1.0\n", "")
        self.builds.append(cmd)
        self.last = bytes(range(256)) * 63 + bytes(range(255)) + bytes([len(self.builds)])
        Path(cmd[cmd.index("-o") + 1]).write_bytes(self.last)
        return subprocess.CompletedProcess(cmd, 0, "", "")


@pytest.fixture
def fake_cc(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> FakeCompiler:
    fake = FakeCompiler()
    monkeypatch.setattr(native_module, "subprocess", SimpleNamespace(run=fake))
    monkeypatch.setenv("RELAYC_CACHE_DIR", str(tmp_path / "cache"))
    return fake


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """native_decoder() as in a new process: nothing tried, nothing loaded."""
    monkeypatch.setattr(native_module, "_lib", None)
    monkeypatch.setattr(native_module, "_tried", False)


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


DAMAGE: dict[str, Callable[[Path], None]] = {
    "truncated": _truncate,
    "one byte changed": _flip_a_byte,
    "empty": lambda so: so.write_bytes(b""),
    "record missing": lambda so: so.with_suffix(".json").unlink(),
    "record not JSON": lambda so: so.with_suffix(".json").write_text("{size"),
    "record a list": lambda so: so.with_suffix(".json").write_text("[1, 2]"),
    "record of other bytes": lambda so: so.with_suffix(".json").write_text(
        '{"size": 16384, "sha256": "' + "0" * 64 + '"}'
    ),
}


def test_an_intact_build_is_reused(fake_cc: FakeCompiler) -> None:
    first = native_module._build("cc")
    assert first.read_bytes() == fake_cc.last and first.with_suffix(".json").is_file()
    assert native_module._build("cc") == first
    assert len(fake_cc.builds) == 1


@pytest.fixture
def csrc(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A copy of the C sources that native.py builds from instead, free to edit."""
    folder = tmp_path / "csrc"
    shutil.copytree(native_module.CSRC, folder, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(native_module, "CSRC", folder)
    return folder


def _compiled(cmd: list[str]) -> list[str]:
    """The sources of one compile command (between the output path and ``-lm``), each after
    its own ``-x c``: C for every unit, whatever the driver."""
    sources = cmd[cmd.index("-o") + 2 : cmd.index("-lm")]
    assert sources[0::3] == ["-x"] * len(sources[2::3]) and set(sources[1::3]) == {"c"}
    return sources[2::3]


def test_every_unit_is_compiled_in_one_call_and_every_source_keys_the_build(
    fake_cc: FakeCompiler, csrc: Path
) -> None:
    """One compiler call gets every unit, sorted; an edit to the header or to any unit, a
    unit added or renamed, is another build under another name, never the stale library."""

    def edit(name: str) -> Callable[[], None]:
        return lambda: (csrc / name).write_text((csrc / name).read_text() + "\n/* edited */\n")

    units = sorted(path.name for path in csrc.glob("*.c"))
    assert len(units) > 1 and (csrc / native_module.HEADER).is_file()
    changes: list[Callable[[], None]] = [
        edit(native_module.HEADER),
        edit(units[0]),
        edit(units[-1]),
        lambda: (csrc / "zz_added.c").write_text('#include "decoder.h"\n'),
        # the same place among the sorted units, the same text: only the name tells
        lambda: (csrc / units[1]).rename(csrc / units[1].replace(".c", "_renamed.c")),
    ]
    targets = [native_module._build("cc")]
    for change in changes:
        change()
        targets.append(native_module._build("cc"))
        assert native_module._build("cc") == targets[-1]  # and then reused
    assert len(set(targets)) == len(targets) == len(fake_cc.builds)
    assert _compiled(fake_cc.builds[0]) == [str(csrc / name) for name in units]
    assert _compiled(fake_cc.builds[-1]) == sorted(str(path) for path in csrc.glob("*.c"))


@pytest.mark.parametrize("missing", ["the header", "every unit"])
def test_missing_sources_are_named_not_compiled(
    fake_cc: FakeCompiler, csrc: Path, fresh: None, missing: str
) -> None:
    """An install without the header (or without the units) says which folder lacks what,
    and the engine falls back to the TorchScript layers with that message."""
    doomed = [csrc / native_module.HEADER] if missing == "the header" else csrc.glob("*.c")
    for path in list(doomed):
        path.unlink()
    message = f"C sources are incomplete: {re.escape(str(csrc))} needs decoder.h and its"
    with pytest.raises(RuntimeError, match=message):
        native_module._build("cc")
    with pytest.warns(RuntimeWarning, match=message):
        assert native_module.native_decoder() is None
    assert fake_cc.builds == []


def test_the_package_data_ships_every_unit_and_the_header() -> None:
    """pyproject's package data for relayc.engine covers every file of the C sources: a
    wheel without one could not build the library on first use."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["relayc.engine"]
    engine = REPO / "relayc" / "engine"
    shipped = {path for pattern in patterns for path in engine.glob(pattern)}
    folder = engine / "native" / "csrc"
    sources = {path for path in folder.iterdir() if path.suffix in (".c", ".h")}
    assert folder / native_module.HEADER in sources and len(sources) > 2
    assert sorted(p.name for p in sources - shipped) == []
    assert sorted(p.name for p in shipped - sources) == []


def test_the_library_exports_its_entry_points_alone(seeded_cache: Path) -> None:
    """The units' shared helpers are hidden: a process loading another library with a
    ``gemm_any`` or ``rms_norm`` of its own gets its own."""
    lib = native_module._load(seeded_cache)
    assert lib.relayc_forward is not None and lib.relayc_tape_run is not None
    for name in ("gemm_any", "gemm_blocks", "gemm_bf16", "block_bytes", "rms_norm"):
        with pytest.raises(AttributeError):
            getattr(lib, name)
    for name in ("exp_rows", "attend_group", "decode_layers", "paged_meta_fill", "live_prefix"):
        with pytest.raises(AttributeError):
            getattr(lib, name)


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_build_is_rebuilt_not_loaded(fake_cc: FakeCompiler, damage: str) -> None:
    target = native_module._build("cc")
    DAMAGE[damage](target)
    assert native_module._build("cc") == target
    assert len(fake_cc.builds) == 2
    assert target.read_bytes() == fake_cc.last
    assert native_module._build("cc") == target and len(fake_cc.builds) == 2  # intact again


def test_a_build_interrupted_between_its_renames_is_rebuilt(
    fake_cc: FakeCompiler, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The library is in place but its record is not (a full disk, a kill): not trusted."""
    target = native_module._build("cc")
    _truncate(target)  # damaged: the next call builds and renames again
    real_replace = os.replace
    renames: list[str] = []

    def replace(src: Any, dst: Any) -> None:
        renames.append(str(dst))
        if len(renames) == 2:
            raise OSError(28, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(native_module.os, "replace", replace)
    with pytest.raises(OSError, match="No space"):
        native_module._build("cc")
    monkeypatch.setattr(native_module.os, "replace", real_replace)
    # The library was replaced, the record is the old one: a mismatch, so built again.
    assert native_module._build("cc") == target and len(fake_cc.builds) == 3
    assert target.read_bytes() == fake_cc.last


def test_a_folder_in_place_of_the_build_is_named(fake_cc: FakeCompiler) -> None:
    target = native_module._build("cc")
    target.unlink()
    target.mkdir()
    with pytest.raises(RuntimeError, match=r"decoder-\w+\.so is a folder.*remove it"):
        native_module._build("cc")


def test_a_truncated_cached_library_does_not_kill_the_engine(
    tmp_path: Path, seeded_cache: Path
) -> None:
    """The real library in a fresh cache (a copy of this run's build: the same cache key
    as the child's), truncated (an interrupted copy): a new process running the engine
    rebuilds it and decodes natively instead of dying with SIGBUS when the loader maps
    the missing pages."""
    env = {**os.environ, "RELAYC_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(REPO)}
    env.pop("RELAYC_NATIVE", None)
    target = seeded_cache
    intact = target.read_bytes()
    _truncate(target)
    script = textwrap.dedent(
        """
        import relayc.engine.native.library as native
        from relayc.engine import Engine, SamplingParams

        with Engine("random", algorithm="none", overlap=False) as engine:
            out = engine.generate([[5, 6, 7]], SamplingParams(max_new_tokens=3))
        print(len(out[0].token_ids), native.native_decoder() is not None)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, (result.returncode, result.stderr[-2000:])
    assert result.stdout.split() == ["3", "True"], result.stdout
    assert target.read_bytes() == intact  # rebuilt in place


@pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler driver (g++) here")
def test_a_cpp_compiler_in_cc_still_builds_c(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``CC=g++`` compiles the C units as C: the exported names are not mangled."""
    monkeypatch.setenv("RELAYC_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", "g++")
    compiler = native_module._compiler()
    assert compiler is not None and Path(compiler).name == "g++"
    lib = native_module._load(native_module._build(compiler))
    assert lib.relayc_decoder is not None and lib.relayc_head is not None


@pytest.mark.parametrize("value", ["0", "false", "FALSE", "Off", "no", " No "])
def test_relayc_native_off_spellings(
    value: str, monkeypatch: pytest.MonkeyPatch, fake_cc: FakeCompiler, fresh: None
) -> None:
    monkeypatch.setenv("RELAYC_NATIVE", value)
    assert native_module.native_decoder() is None
    assert fake_cc.builds == []  # off means not built either
    assert native_module.enabled() is False


@pytest.mark.parametrize("value", ["1", "true", "True", "ON", "yes", ""])
def test_relayc_native_on_spellings(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RELAYC_NATIVE", value)
    assert native_module.enabled() is True


@pytest.mark.parametrize("value", ["2", "disable", "nein", "0.0"])
def test_relayc_native_other_values_are_an_error_before_any_work(
    value: str, monkeypatch: pytest.MonkeyPatch, fake_cc: FakeCompiler, fresh: None
) -> None:
    monkeypatch.setenv("RELAYC_NATIVE", value)
    message = rf"RELAYC_NATIVE='{value}' is not a switch: set it to one of 0, false"
    with pytest.raises(ValueError, match=message):
        native_module.native_decoder()
    with pytest.raises(ValueError, match=message):
        Engine("random", algorithm="none", overlap=False)  # at construction, not generate()
    assert fake_cc.builds == []


@pytest.mark.parametrize("name", native_module.BF16_KERNELS)
def test_relayc_bf16_kernel_forces_a_kernel_or_says_this_cpu_lacks_it(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The switch CI runs the bfloat16 tests under (scripts/test.sh): the named kernel runs
    every bfloat16 GEMM of the process; one this CPU lacks is an error, not a fallback."""
    lib = native_module.native_decoder()
    assert lib is not None, "the native decoder should build here"
    previous = native_module.bf16_kernel(lib)
    monkeypatch.setenv("RELAYC_BF16_KERNEL", f" {name.upper()} ")
    monkeypatch.setattr(native_module, "_lib", None)
    monkeypatch.setattr(native_module, "_tried", False)
    try:
        if name in native_module.bf16_kernels(lib):
            assert native_module.native_decoder() is not None
            assert native_module.bf16_kernel(lib) == name
        else:
            with pytest.raises(ValueError, match=f"RELAYC_BF16_KERNEL={name} does not run on"):
                native_module.native_decoder()
    finally:
        native_module.use_bf16_kernel(lib, previous)


@pytest.mark.parametrize("value", ["tiles", "avx512", "1"])
def test_relayc_bf16_kernel_other_values_are_an_error_before_any_work(
    value: str, monkeypatch: pytest.MonkeyPatch, fake_cc: FakeCompiler, fresh: None
) -> None:
    monkeypatch.setenv("RELAYC_BF16_KERNEL", value)
    message = rf"RELAYC_BF16_KERNEL='{value}' is not a bfloat16 kernel: set it to one of portable"
    with pytest.raises(ValueError, match=message):
        native_module.native_decoder()
    assert fake_cc.builds == []
    monkeypatch.setenv("RELAYC_BF16_KERNEL", "auto")
    assert native_module.bf16_kernel_choice() is None


def test_relayc_cache_dir_expands_home_and_resolves_relative_paths(
    monkeypatch: pytest.MonkeyPatch, fake_cc: FakeCompiler, tmp_path: Path
) -> None:
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    monkeypatch.setenv("RELAYC_CACHE_DIR", "~/relayc-cache")  # a quoted ~: not expanded
    assert native_module.cache_dir() == home / "relayc-cache"
    assert native_module._build("cc").parent == home / "relayc-cache"
    monkeypatch.setenv("RELAYC_CACHE_DIR", "rel/cache")
    assert native_module.cache_dir() == work / "rel" / "cache"
    assert native_module.cache_dir().is_absolute()
    monkeypatch.chdir(tmp_path)  # the process moved on: the folder it named is the same
    monkeypatch.setenv("RELAYC_CACHE_DIR", "work/rel/cache")
    assert native_module._build("cc").parent == work / "rel" / "cache"
    assert sorted(p.name for p in work.iterdir()) == ["rel"]  # no literal "~" folder
