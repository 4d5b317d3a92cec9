"""`python bench/X.py` puts bench/ first on sys.path, so a bench script named like a package a
library probes for shadows it: transformers finds bench/kernels.py as the hub `kernels`
package and fails to import its Llama (bench/peers.py died that way). The peers' imports
must work with bench/ on the path as a script would have it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_transformers_llama_imports_with_bench_first_on_the_path() -> None:
    pytest.importorskip("transformers")
    code = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "from transformers import LlamaConfig, LlamaForCausalLM\n"
        "LlamaConfig(); print('ok')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(BENCH)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-2000:]
