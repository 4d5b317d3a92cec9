"""GraphRunner's own contract on the CPU (mode "static"): buckets, slot-0 padding rows that
never drift, row slicing of mapping and dataclass outputs, eager fallback, mode checks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import torch

from relayc.generated import none
from relayc.runtime.graph_runner import GraphRunner, StaticInput, resolve_mode, slice_rows


class CountingStep:
    """A device part that resolves `bonus_tokens`, records what every row saw and stashes
    it plus one: a padding row that resolved its own earlier stash would see it grow."""

    def __init__(self) -> None:
        self.relay = none.FutureMap(16, "cpu", dims={"hidden": 4, "vocab": 8})
        self.seen: list[torch.Tensor] = []

    def run_device(
        self, ctx: Any, *, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor, host: Any
    ) -> dict[str, torch.Tensor]:
        tokens = self.relay.resolve(req_pool_indices).bonus_tokens
        self.seen.append(tokens.clone())
        following = tokens + 1
        self.relay.stash(req_pool_indices, none.RelayPayload(bonus_tokens=following))
        return {"next_tokens": following}


def runner_for(step: CountingStep) -> GraphRunner:
    inputs = {"req_pool_indices": StaticInput(torch.int64), "seq_lens": StaticInput(torch.int64)}
    return GraphRunner(step, device="cpu", batch_sizes=[4, 1, 2], inputs=inputs, mode="static")


def test_padding_rows_read_slot_0_as_zeros_on_every_step() -> None:
    step = CountingStep()
    slots = torch.tensor([3, 7, 5])
    step.relay.stash(slots, none.RelayPayload(bonus_tokens=torch.tensor([10, 20, 30])))
    runner = runner_for(step)
    assert runner.batch_sizes == [1, 2, 4] and runner.bucket_for(3) == 4
    for i in range(1, 4):
        out = runner.run(None, {"req_pool_indices": slots, "seq_lens": torch.tensor([1, 2, 3])})
        assert out["next_tokens"].tolist() == [10 + i, 20 + i, 30 + i]
        assert step.seen[-1].shape == (4,)  # ran on the bucket
        assert step.seen[-1][3].item() == 0, "the padding row saw a stale slot 0"
    assert (runner.replays, runner.eager_runs) == (3, 0)


def test_batches_above_the_largest_bucket_run_eagerly_and_off_never_pads() -> None:
    step = CountingStep()
    runner = runner_for(step)
    slots = torch.arange(1, 6)
    out = runner.run(None, {"req_pool_indices": slots, "seq_lens": torch.ones(5, dtype=torch.long)})
    assert out["next_tokens"].shape == (5,) and step.seen[-1].shape == (5,)
    assert (runner.replays, runner.eager_runs) == (0, 1)
    inputs = {"req_pool_indices": StaticInput(torch.int64), "seq_lens": StaticInput(torch.int64)}
    off = GraphRunner(step, device="cpu", batch_sizes=[4], inputs=inputs, mode="off")
    assert off.bucket_for(3) is None


@dataclass
class Outputs:
    tokens: torch.Tensor
    counts: torch.Tensor


def test_slice_rows_keeps_the_output_type() -> None:
    rows = slice_rows(Outputs(torch.arange(8).view(4, 2), torch.arange(4)), 3)
    assert isinstance(rows, Outputs)
    assert rows.tokens.tolist() == [[0, 1], [2, 3], [4, 5]] and rows.counts.tolist() == [0, 1, 2]
    assert slice_rows({"a": torch.arange(4)}, 1)["a"].tolist() == [0]
    with pytest.raises(TypeError, match="mapping or a dataclass"):
        slice_rows([torch.arange(4)], 1)


def test_modes_are_checked() -> None:
    assert resolve_mode("auto", "cpu") == "off"
    assert resolve_mode("static", "cpu") == "static"
    with pytest.raises(ValueError, match="needs a CUDA device"):
        resolve_mode("graph", "cpu")
    with pytest.raises(ValueError, match="one of auto, graph, tape, static, off"):
        resolve_mode("eager", "cpu")
