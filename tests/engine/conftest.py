"""Fixtures the engine tests share."""

from __future__ import annotations

import pytest

import relayc.engine.native as native_module
from tests.engine.helpers import record_native_forwards


@pytest.fixture
def native_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The token count of every forward the native decoder ran."""
    assert native_module.native_decoder() is not None, "the native decoder should build here"
    calls: list[int] = []
    record_native_forwards(monkeypatch, lambda tokens, dtype: calls.append(tokens))
    return calls
