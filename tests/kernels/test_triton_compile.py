from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from relayc.kernels._backend import triton_available
from tests.kernels.compile_sm90 import NUM_KERNELS

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not triton_available(), reason="Triton is not installed on this platform")
def test_kernels_compile_for_sm90_without_a_gpu():
    # A fresh process: this one imported Triton with TRITON_INTERPRET=1, which swaps
    # the compiler out for the interpreter.
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    result = subprocess.run(
        [sys.executable, "-m", "tests.kernels.compile_sm90"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert result.stdout.count("bytes of sm_90 cubin") == NUM_KERNELS, result.stdout
