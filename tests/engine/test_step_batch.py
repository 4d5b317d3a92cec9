"""Decode steps built from a kept batch composition equal steps built from scratch."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from relayc.engine import SamplingParams
from relayc.engine.serving.request import Request
from relayc.engine.serving.step_batch import DecodeRows, HostStep, LengthRing


def _request(rid: int, slot: int, kv_len: int, inflight: int, temperature: float) -> Request:
    request = Request(
        rid=rid,
        prompt_ids=[256, 1, 2],
        params=SamplingParams(max_new_tokens=8, temperature=temperature, top_k=5),
        seed=100 + rid,
        max_new_tokens=8,
        decode_width=3,
    )
    request.req_pool_index, request.kv_len, request.inflight_decodes = slot, kv_len, inflight
    return request


def _value(value: object) -> object:
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return value.tolist()
    if isinstance(value, tuple):  # host_lengths: NumPy views
        return tuple(_value(v) for v in value)
    return value


def _fields(step: HostStep) -> dict[str, object]:
    return {f.name: _value(getattr(step, f.name)) for f in dataclasses.fields(step)}


def test_decode_rows_give_the_same_step_and_hold_only_their_own_batch() -> None:
    a, b = _request(0, 3, 10, 1, 0.0), _request(1, 5, 7, 0, 0.7)
    slots = torch.arange(12, dtype=torch.int64)
    for width in (1, 3):
        rows = DecodeRows.build([a, b], width, pin=False)
        assert rows.holds([a, b], width) and not rows.all_greedy
        assert not rows.holds([b, a], width) and not rows.holds([a], width)
        assert not rows.holds([a, b], width + 1)
        kept = HostStep.decode([a, b], width, slots[: 2 * width], False, rows)
        a.kv_len += 1  # lengths move between steps; the composition tensors do not
        fresh = HostStep.decode([a, b], width, slots[: 2 * width], False)
        again = HostStep.decode([a, b], width, slots[: 2 * width], False, rows)
        assert _fields(again) == _fields(fresh) != _fields(kept)
        assert fresh.positions.tolist() == [
            p for r in (a, b) for p in range(r.kv_len_hint, r.kv_len_hint + width)
        ]
        assert fresh.sample_positions.tolist() == [r.kv_len_hint + width for r in (a, b)]
        assert fresh.commit_rows.tolist() == [3] * width + [5] * width
    assert DecodeRows.build([a], 1, pin=False).all_greedy


def test_length_ring_sets_hold_their_step_until_reused() -> None:
    """The CPU's length tensors: the values a decode step's torch.tensor calls made, and a
    set handed out keeps them while the next SIZE - 1 steps take theirs."""
    for width in (1, 4):
        ring = LengthRing(2, width)
        handed = []
        for step in range(2 * LengthRing.SIZE):
            hints = [10 + step, 3 * step]
            (prefix, positions, sample), views = ring.fill(hints)
            assert [v.tolist() for v in views] == [
                prefix.tolist(),
                positions.view(2, width).tolist(),
                sample.tolist(),
            ]
            assert prefix.tolist() == hints
            assert positions.tolist() == [p + j for p in hints for j in range(width)]
            assert sample.tolist() == [p + width for p in hints]
            assert (positions is prefix) == (width == 1)
            handed.append((hints, prefix))
            for earlier_hints, earlier in handed[-LengthRing.SIZE :]:
                assert earlier.tolist() == earlier_hints
        assert handed[0][1] is handed[LengthRing.SIZE][1]  # reused after SIZE steps
