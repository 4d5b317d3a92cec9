from __future__ import annotations

import pytest
import torch

from relayc.kernels.rng import ACCEPT_STREAM, FINAL_STREAM, keyed_uniforms
from tests.kernels.stats import assert_distribution


def test_reproducible_and_independent_of_the_batch():
    seeds = torch.tensor([0, 1, 2**40 + 7, -3])
    positions = torch.tensor([5, 5, 123456, 2**33])
    a = keyed_uniforms(seeds, positions, 6)
    assert a.dtype == torch.float32 and a.shape == (4, 6)
    assert torch.equal(a, keyed_uniforms(seeds, positions, 6))
    # A request's row does not depend on its neighbours or its place in the batch.
    assert torch.equal(a[2:3], keyed_uniforms(seeds[2:3], positions[2:3], 6))
    assert torch.equal(a.flip(0), keyed_uniforms(seeds.flip(0), positions.flip(0), 6))
    # A longer row extends a shorter one.
    assert torch.equal(a[:, :3], keyed_uniforms(seeds, positions, 3))


def test_every_key_part_changes_the_numbers():
    seeds, positions = torch.tensor([11]), torch.tensor([42])
    base = keyed_uniforms(seeds, positions, 8)
    assert not torch.equal(base, keyed_uniforms(seeds + 1, positions, 8))
    assert not torch.equal(base, keyed_uniforms(seeds + 2**32, positions, 8))
    assert not torch.equal(base, keyed_uniforms(seeds, positions + 1, 8))
    assert not torch.equal(base, keyed_uniforms(seeds, positions, 8, FINAL_STREAM))
    assert base.unique().numel() == 8


def test_uniform_on_zero_one():
    # 100k values from consecutive positions of one seed, in 20 equal bins.
    positions = torch.arange(10_000)
    u = keyed_uniforms(torch.full_like(positions, 1234), positions, 10, ACCEPT_STREAM)
    assert (u >= 0).all() and (u < 1).all()
    counts = torch.bincount((u * 20).long().flatten(), minlength=20)
    assert_distribution(counts, torch.full((20,), 1 / 20))


def test_rejects_bad_keys():
    with pytest.raises(TypeError, match="int64"):
        keyed_uniforms(torch.tensor([1], dtype=torch.int32), torch.tensor([1]), 2)
    with pytest.raises(ValueError, match="positions"):
        keyed_uniforms(torch.tensor([1, 2]), torch.tensor([1]), 2)
