"""Generated engine modules check the relay runtime they were generated for."""

from __future__ import annotations

import importlib.util
import re
import sys

import pytest

from relayc.compiler.writer import GENERATED_DIR
from relayc.runtime.relay import RUNTIME_VERSION, RuntimeVersionError, require_runtime


def test_the_matching_runtime_is_accepted() -> None:
    require_runtime(RUNTIME_VERSION, "relayc.generated.none")


def test_a_module_for_another_runtime_fails_at_import(tmp_path) -> None:
    source = (GENERATED_DIR / "none.py").read_text()
    call = f"require_runtime({RUNTIME_VERSION}, __name__)"
    assert call in source
    old = tmp_path / "old_none.py"
    old.write_text(source.replace(call, f"require_runtime({RUNTIME_VERSION - 1}, __name__)"))
    spec = importlib.util.spec_from_file_location("old_none", old)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    message = re.escape(
        f"old_none was generated for relay runtime version {RUNTIME_VERSION - 1}, but "
        f"relayc.runtime.relay is version {RUNTIME_VERSION}: regenerate it"
    )
    with pytest.raises(RuntimeVersionError, match=message):
        spec.loader.exec_module(module)
    assert "old_none" not in sys.modules
