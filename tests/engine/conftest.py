"""Fixtures the engine tests share."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import relayc.engine.native.library as native_module
from tests.engine.helpers import record_native_forwards


@pytest.fixture
def native_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The token count of every forward the native decoder ran."""
    assert native_module.native_decoder() is not None, "the native decoder should build here"
    calls: list[int] = []
    record_native_forwards(monkeypatch, lambda tokens, dtype: calls.append(tokens))
    return calls


@pytest.fixture
def seeded_cache(tmp_path: Path) -> Path:
    """``tmp_path`` holding a copy of the native library this run has built (and its
    record) under the same cache key, so ``native._build`` with ``RELAYC_CACHE_DIR`` there
    finds it instead of compiling the C units again (some 15 s on two cores); the path of
    the copy."""
    compiler = native_module._compiler()
    assert compiler is not None, "a C compiler should be installed here"
    built = native_module._build(compiler)  # the run's own cache: built once per run
    assert built.parent != tmp_path
    for path in (built, built.with_suffix(".json")):
        shutil.copy2(path, tmp_path / path.name)
    return tmp_path / built.name
