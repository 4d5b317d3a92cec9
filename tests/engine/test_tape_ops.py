"""relayc.engine.native.tape_ops: a recorded step's row gathers, scatters, fills and copies as
native calls -- the same values as ATen's ops, ATen's own op where the tensors are not
plain memory, and a refused index stopping the replay."""

from __future__ import annotations

import gc

import pytest
import torch

from relayc.engine.native import library as native
from relayc.runtime.tape import Recorder

pytestmark = pytest.mark.skipif(
    native.native_decoder() is None, reason="the native library is not built here"
)


def _step(table: torch.Tensor, rows: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    picked = table.index_select(0, rows)  # gather
    kept = picked.clone()
    table[0].zero_()  # a padding slot
    table.index_copy_(0, rows, src)  # scatter
    kept.copy_(kept * 3)
    ends = table[rows - 7]  # advanced indexing: negative rows count from the end
    marks = torch.full_like(kept, 5)
    return torch.cat([kept, ends, marks], dim=1)  # side by side along a middle dimension


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bfloat16])
def test_row_ops_are_native_and_replay_as_aten_runs_them(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    table = (torch.randn(7, 3, 2, generator=gen) * 9).to(dtype)
    rows = torch.tensor([2, 5, 2])  # a repeated row: the last write wins, as on the CPU
    src = (torch.randn(3, 3, 2, generator=gen) * 9).to(dtype)
    with Recorder() as recorder:
        kept = _step(table, rows, src)
    tape = recorder.tape()
    lowered = [name for name in tape.names if name.endswith("(native)")]
    # index_select, clone, zero_, index_copy_, copy_, rows - 7, index, full_like, cat
    assert len(lowered) == 9, tape.names
    assert tape.batched == 9  # replayed by the library in one call (no ATen op between)
    for seed in (1, 2):
        gen.manual_seed(seed)
        fresh = (torch.randn(7, 3, 2, generator=gen) * 9).to(dtype)
        new_src = (torch.randn(3, 3, 2, generator=gen) * 9).to(dtype)
        table.copy_(fresh)
        src.copy_(new_src)
        rows.copy_(torch.tensor([6, 1, 6]) if seed == 1 else torch.tensor([0, 3, 4]))
        want_table = fresh.clone()
        want = _step(want_table, rows, new_src)
        assert tape.replay()
        assert torch.equal(kept, want) and torch.equal(table, want_table)


def test_integer_casts_are_native_and_wrap_as_atens() -> None:
    wide = torch.tensor([1, -2, 2**40 + 5, -(2**33) - 1])
    narrow = torch.zeros(4, dtype=torch.int32)
    with Recorder() as recorder:
        made = wide.to(torch.int32)  # _to_copy
        narrow.copy_(wide)
        back = narrow.to(torch.int64)
    assert all(name.endswith("(native)") for name in recorder.tape().names)
    wide.copy_(torch.tensor([2**31, -(2**31) - 1, 7, -1]))
    assert recorder.tape().replay()
    want = wide.to(torch.int32)
    assert torch.equal(made, want) and torch.equal(narrow, want)
    assert torch.equal(back, want.to(torch.int64))


def test_int64_sums_are_native_with_a_trailing_broadcast() -> None:
    a = torch.tensor([[1, 2, 3], [4, 5, 2**62]])
    row, one = torch.tensor([10, -20, 2**62]), torch.tensor(7)
    column = torch.tensor([[100], [-(2**62)]])  # [2, 1]: a column against a row of 3

    def sums() -> list[torch.Tensor]:
        return [
            a + row,
            a - row,
            a + one,
            a - a,
            (a.float() + 1).long(),
            a + 3,
            column + row,
            column - row,
            row + column,  # the row first: ATen's op
        ]

    with Recorder() as recorder:
        got = sums()
    names = recorder.tape().names
    # not the float add, nor the row broadcast along the column
    assert sum(name.endswith("(native)") for name in names) == 7, names
    gc.collect()  # the wrapped 3 lives in the tape
    a.copy_(torch.tensor([[-(2**63), 0, 9], [3, -3, 2**63 - 1]]))  # wraps both ways
    row.copy_(torch.tensor([1, 2, 3]))
    column.copy_(torch.tensor([[2**63 - 2], [-(2**63)]]))
    assert recorder.tape().replay()
    for replayed, expected in zip(got, sums(), strict=True):
        assert torch.equal(replayed, expected)


def test_strided_tensors_keep_atens_op() -> None:
    table, rows = torch.randn(6, 4), torch.tensor([1])
    with Recorder() as recorder:
        table.t().index_select(0, rows)  # a transposed source
        table[:, 1].zero_()  # a strided view
    assert not any(name.endswith("(native)") for name in recorder.tape().names)


def test_a_refused_row_stops_the_replay_or_raises_after_a_lasting_write() -> None:
    table, rows = torch.randn(5, 2), torch.tensor([1, 2])
    with Recorder() as recorder:
        picked = table.index_select(0, rows)  # first: nothing lasting written before it
        table.index_copy_(0, rows, picked * 2)
    tape = recorder.tape()
    rows.copy_(torch.tensor([1, 9]))  # outside the table
    before = table.clone()
    assert tape.replay() is False  # the caller reruns ATen's path, which names the error
    assert torch.equal(table, before)
    with pytest.raises(IndexError):
        table.index_select(0, rows)

    rows.copy_(torch.tensor([0, 1]))
    ones = torch.ones(2, 2)
    with Recorder() as recorder:
        table.mul_(1.0)  # a lasting write first
        table.index_copy_(0, rows, ones)
    tape = recorder.tape()
    rows.copy_(torch.tensor([0, -1]))
    with pytest.raises(RuntimeError, match=r"index_copy_.* returned -2"):
        tape.replay()


def test_a_call_refused_inside_a_batch_stops_the_replay_or_raises_after_a_lasting_write() -> None:
    """Four native calls replayed as one batch: a refusal before the lasting write (the
    third call) stops the replay with nothing written; one after it raises, naming it."""
    table = torch.arange(10.0).reshape(5, 2)
    rows, others, last = torch.tensor([1, 2]), torch.tensor([3, 4]), torch.tensor([0])
    with Recorder() as recorder:
        picked = table.index_select(0, rows)
        swapped = table.index_select(0, others)
        table.index_copy_(0, rows, swapped)  # lasting: the table existed before the step
        end = table.index_select(0, last)
    tape = recorder.tape()
    assert tape.batched == len(tape) == 4
    table.copy_(torch.arange(10.0).reshape(5, 2) * 2)
    assert tape.replay()
    assert torch.equal(picked, torch.tensor([[4.0, 6.0], [8.0, 10.0]]))
    assert torch.equal(end, torch.tensor([[0.0, 2.0]]))
    assert torch.equal(table[1:3], torch.tensor([[12.0, 14.0], [16.0, 18.0]]))
    others.copy_(torch.tensor([3, 7]))  # the second call's row is outside the table
    before = table.clone()
    assert tape.replay() is False
    assert torch.equal(table, before)
    others.copy_(torch.tensor([3, 4]))
    last.copy_(torch.tensor([5]))  # the fourth's, after the write
    with pytest.raises(RuntimeError, match=r"call 3 \(aten.index_select.default \(native\)\)"):
        tape.replay()
