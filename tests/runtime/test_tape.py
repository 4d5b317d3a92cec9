"""relayc.runtime.tape: a step's ATen ops and native calls recorded once, replayed on the
same memory with the bits of running it again; what it refuses; when a replay stops."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from relayc.runtime.tape import Recorder, TapeRefused, native_library, recording


def _step(buffers: dict[str, torch.Tensor], rows: torch.Tensor) -> dict[str, torch.Tensor]:
    """A relay-like step: gather rows, compute, scatter back, a factory and a view."""
    table, values = buffers["table"], buffers["values"]
    picked = table.index_select(0, rows)  # fresh: recorded as its out= form
    scaled = (picked * 2 + values[: rows.numel()].unsqueeze(1)).softmax(-1)
    top_p, top_i = scaled.topk(2, dim=-1)  # two outputs: topk.values
    marks = torch.full_like(top_i, 7) + torch.arange(2)  # factories
    table.index_copy_(0, rows, scaled)  # writes its argument: recorded as called
    return {"top_p": top_p, "top_i": top_i.view(-1), "marks": marks}


def _buffers(seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {"table": torch.randn(6, 5, generator=gen), "values": torch.randn(4, generator=gen)}


def test_replay_runs_the_recorded_ops_on_new_values() -> None:
    static = _buffers(0)
    rows = torch.tensor([3, 1, 4])
    with Recorder() as recorder:
        outputs = _step(static, rows)
    tape = recorder.tape()
    # (the engine's native library, once loaded, records the row moves as its own calls)
    assert "aten.topk.default" in tape.names
    assert any(name.startswith("aten.index_copy_.default") for name in tape.names)
    assert not any("view" in name or "unsqueeze" in name for name in tape.names)
    for seed in (1, 2):
        fresh = _buffers(seed)
        for name, value in fresh.items():
            static[name].copy_(value)
        rows.copy_(torch.tensor([0, 5, 2]) if seed == 1 else torch.tensor([2, 2, 1]))
        want = _step({k: v.clone() for k, v in fresh.items()}, rows)
        assert tape.replay()
        for key, value in want.items():
            assert torch.equal(outputs[key], value), key
        eager = _buffers(seed)
        _step(eager, rows)
        assert torch.equal(static["table"], eager["table"])


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (lambda t: t.sum().item(), "host"),
        (lambda t: t.tolist(), "tolist"),
        (lambda t: t + torch.tensor([1.0, 2.0, 3.0]), "host data"),
        (lambda t: t[t > 0], "boolean mask|data-dependent"),
    ],
    ids=["item", "tolist", "torch.tensor", "mask"],
)
def test_what_a_tape_cannot_replay_is_refused_with_where(body: Any, match: str) -> None:
    with pytest.raises(TapeRefused, match=match) as refused, Recorder():
        body(torch.randn(3))
    assert "test_tape.py" in str(refused.value)  # the line that ran it


class _Library:
    """A stand-in native library: ``write`` adds to a tensor (a lasting write), ``check``
    returns the code held in ``codes``."""

    def __init__(self) -> None:
        self.codes = {"check": 0, "write": 0}
        self.calls: list[str] = []

    def check(self, pointer: int) -> int:
        self.calls.append("check")
        return self.codes["check"]

    def write(self, pointer: int) -> int:
        self.calls.append("write")
        return self.codes["write"]


def test_native_calls_are_recorded_and_a_decline_before_any_lasting_write_reruns() -> None:
    lib = _Library()
    assert native_library(lib) is lib and recording() is None  # outside a recording
    state = torch.zeros(2)
    with Recorder() as recorder:
        assert recording() is recorder
        wrapped = native_library(lib)
        assert wrapped.check(state.data_ptr()) == 0
        state.add_(1)  # a lasting write: the state existed before the step
        assert wrapped.write(state.data_ptr()) == 0
    tape = recorder.tape()
    assert tape.names == ("check", "aten.add_.Tensor", "write")
    lib.calls.clear()
    assert tape.replay() and lib.calls == ["check", "write"]
    assert torch.equal(state, torch.full((2,), 2.0))
    lib.codes["check"] = 1  # declines first: nothing written yet, the caller reruns
    assert tape.replay() is False
    assert torch.equal(state, torch.full((2,), 2.0))
    lib.codes.update(check=0, write=-2)  # refused after a lasting write: an error
    with pytest.raises(RuntimeError, match=r"call 2 \(write\) returned -2"):
        tape.replay()


def test_a_native_call_that_declines_while_recording_is_refused() -> None:
    lib = _Library()
    lib.codes["check"] = 1
    with pytest.raises(TapeRefused, match="check returned 1"), Recorder():
        native_library(lib).check(0)


def test_a_recording_restores_the_host_reads_it_replaced() -> None:
    t = torch.arange(3)
    with pytest.raises(TapeRefused), Recorder():
        t.tolist()
    assert t.tolist() == [0, 1, 2] and recording() is None
