"""float32's path per CPU (blocks.FLOAT32_PATHS: GGUF blocks or float32 panels, a table
keyed on the features the native decoder was compiled for, no start-up measurement), and
what `cpu_path` says ran."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import relayc.engine.native.blocks as blocks_module
from relayc.engine import Engine
from relayc.engine.checkpoints.loader import load_model
from relayc.engine.decoder.cpu_decoder import cpu_path
from relayc.engine.native import library as native
from relayc.engine.native.blocks import BLOCKS_Q4, build_features, float32_path
from tests.engine.real_model import smollm2_file


def test_the_table_picks_blocks_with_avx512_and_panels_with_avx2_alone() -> None:
    assert float32_path(("avx512f", "avx2", "fma", "f16c")) == "blocks"
    assert float32_path(("avx2", "fma", "f16c")) == "panels"
    assert float32_path(()) == "blocks"  # unmeasured: the fewest bytes


def test_the_features_are_this_cpus() -> None:
    assert native.native_decoder() is not None, "the native decoder should build here"
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.exists():
        pytest.skip("no /proc/cpuinfo to compare with")
    flags = set(
        next(line for line in cpuinfo.read_text().splitlines() if line.startswith("flags")).split()
    )
    features = set(build_features())
    assert ("avx512f" in features) == ("avx512f" in flags)
    assert ("avx2" in features) == ("avx2" in flags)


@pytest.mark.parametrize("path", ["blocks", "panels"])
def test_the_engine_reads_what_the_table_says(monkeypatch: pytest.MonkeyPatch, path: str) -> None:
    smollm2_file()
    monkeypatch.setattr(blocks_module, "float32_path", lambda features=None: path)
    model = load_model("smollm2", device=torch.device("cpu"), dtype=torch.float32).model
    engine = Engine(model=model)
    weights = engine.model.scripted.native_weights() if engine.model.scripted else None
    assert weights is not None
    assert set(weights.formats) == ({BLOCKS_Q4} if path == "blocks" else {0})
    said = cpu_path(engine.model)
    assert said.startswith("float32 over the GGUF blocks" if path == "blocks" else "float32 panels")
