"""The native decoder's build is heard (``build_progress``): started, then its seconds; a
cached build is not, so `relayc generate` says "building" only when it compiles."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from relayc.engine.native import library


def test_a_build_is_heard_and_a_cached_one_is_not(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    compiles: list[list[str]] = []

    def run(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        if argv[1:] == ["--version"]:
            return subprocess.CompletedProcess(argv, 0, "fakecc 1.0\n", "")
        compiles.append(argv)
        Path(argv[argv.index("-o") + 1]).write_bytes(b"\x7fELF not really")
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setenv("RELAYC_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(library.subprocess, "run", run)
    heard: list[float | None] = []
    with library.build_progress(heard.append):
        built = library._build("fakecc")
    assert len(compiles) == 1 and built.parent == tmp_path
    assert heard[0] is None and isinstance(heard[1], float) and len(heard) == 2
    heard.clear()
    with library.build_progress(heard.append):
        assert library._build("fakecc") == built  # from the cache: nothing compiled
    assert heard == [] and len(compiles) == 1
    assert library._build_listener is None
