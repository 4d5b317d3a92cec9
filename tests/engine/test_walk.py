"""relayc.engine.core.walk: the per-call checks' module walk sees what ``modules()`` and
``parameters()`` see, and a parameter changed in place or replaced changes the stamps."""

from __future__ import annotations

import torch
from torch import nn

from relayc.engine.core.walk import parameter_stamps, submodules


def _tree() -> tuple[nn.Module, nn.Module]:
    shared = nn.Linear(3, 3)
    root = nn.Sequential(nn.Linear(3, 4), nn.Sequential(shared, nn.ReLU()), shared)
    root.register_module("absent", None)
    return root, shared


def test_submodules_are_modules_once_each() -> None:
    root, shared = _tree()
    walked = list(submodules(root, shared))
    assert len(walked) == len({id(m) for m in walked})
    assert {id(m) for m in walked} == {id(m) for m in root.modules()}


def test_stamps_see_in_place_changes_and_replacements() -> None:
    root, shared = _tree()
    before = parameter_stamps(root)
    assert {ptr for ptr, _ in before} == {p.data_ptr() for p in root.parameters()}
    assert parameter_stamps(root) == before
    with torch.no_grad():
        shared.bias.add_(1.0)
    edited = parameter_stamps(root)
    assert edited != before
    root[0].weight = nn.Parameter(torch.zeros(4, 3))
    assert parameter_stamps(root) != edited
