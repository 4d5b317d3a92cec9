"""scripts/sglang_own_tests.py's own logic (no SGLang needed): the overlay a run puts first
on PYTHONPATH, and the per-test comparison of the two pytest reports."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location(
        "sglang_own_tests", REPO / "scripts" / "sglang_own_tests.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolves annotations through it
    spec.loader.exec_module(module)
    return module


def test_overlay_installs_the_drop_in_only_in_the_drop_in_run(tmp_path):
    script = _script()
    original = script.make_overlay("original", tmp_path / "original")
    drop_in = script.make_overlay("drop-in", tmp_path / "drop_in")
    assert sorted(p.name for p in original.iterdir()) == ["sitecustomize.py"]
    assert sorted(p.name for p in drop_in.iterdir()) == [
        "relay_overlap_utils.py",  # overlap_utils.py renamed, as docs/sglang.md installs it
        "relayc_relay_runtime.py",
        "sitecustomize.py",
    ]
    assert "if False:" in (original / "sitecustomize.py").read_text()
    assert "if True:" in (drop_in / "sitecustomize.py").read_text()
    # The copied drop-in imports as top-level modules (absolute imports) without SGLang,
    # and its FutureMap is the generated one.
    probe = (
        "import relay_overlap_utils as m; "
        "print(m.FutureMap.__module__, sorted(m.FutureMap.ALGORITHMS)[:2])"
    )
    out = subprocess.run(
        [sys.executable, "-S", "-c", f"import sys; sys.path[:0] = {sys.path!r}; {probe}"],
        cwd=drop_in,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.split()[0] == "relay_overlap_utils"


def test_comparison_counts_only_tests_passing_on_the_original(tmp_path):
    script = _script()

    def report(name: str, cases: str) -> Path:
        path = tmp_path / name
        path.write_text(f"<testsuites><testsuite>{cases}</testsuite></testsuites>")
        return path

    original = script.read_junit(
        report(
            "original.xml",
            '<testcase classname="a.T" name="test_ok"/>'
            '<testcase classname="a.T" name="test_regressed"/>'
            '<testcase classname="a.T" name="test_broken"><failure message="x"/></testcase>'
            '<testcase classname="a.T" name="test_gpu">'
            '<skipped message="CUDA required"/></testcase>',
        )
    )
    drop_in = script.read_junit(
        report(
            "drop-in.xml",
            '<testcase classname="a.T" name="test_ok"/>'
            '<testcase classname="a.T" name="test_regressed">'
            '<failure message="AttributeError: _fields&#10;more"/></testcase>'
            '<testcase classname="a.T" name="test_broken"><failure message="x"/></testcase>'
            '<testcase classname="a.T" name="test_gpu">'
            '<skipped message="CUDA required"/></testcase>',
        )
    )
    table, regressions = script.compare(original, drop_in)
    assert regressions == 1
    assert "| a.T::test_gpu | skipped (CUDA required) | skipped |" in table
    assert "passing on the original (counted): 2, of which the drop-in passes 1" in table
    assert "a.T::test_regressed: failed AttributeError: _fields" in table
    assert script.read_junit(tmp_path / "absent.xml") == {}
