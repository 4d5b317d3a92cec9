"""bench/gpu_check.py is run by hand on a lent GPU; its CPU mode (static buffers instead of
graphs, torch kernels) runs here so the script cannot rot between GPU sessions."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_check_passes_on_the_cpu() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--device", "cpu"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("graph == eager") == 6  # every algorithm (eagle twice)
    assert "gpu_check passed" in proc.stdout
