"""Fixtures the engine tests share."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import relayc.engine.cpu_decoder as cpu_module
import relayc.engine.native as native_module


@pytest.fixture
def native_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The token count of every forward the native decoder ran."""
    assert native_module.native_decoder() is not None, "the native decoder should build here"
    calls: list[int] = []
    real = cpu_module._NativeWeights.run

    def run(self: Any, lib: Any, args: Any, x: torch.Tensor, *rest: Any) -> torch.Tensor:
        calls.append(x.shape[0])
        return real(self, lib, args, x, *rest)

    monkeypatch.setattr(cpu_module._NativeWeights, "run", run)
    return calls
