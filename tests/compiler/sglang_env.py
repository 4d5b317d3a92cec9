"""Importing SGLang 0.5.23's relay (`overlap_utils`) on a CPU-only machine, for tests and bench.

What it takes (measured; /work/shared/notes/sglang-on-cpu.md):

- Triton's interpreter (`TRITON_INTERPRET=1`, before Triton is imported): SGLang's EAGLE
  resolve runs its Triton `gather_spec_extras`, which has no CPU path.
- `SGLANG_IS_IN_CI` unset: with it set, SGLang's debug checks go through `torch.compile`.
  The debug-mode test turns them on itself, with the eager function.
- An inert `torchvision`: the first EAGLE stash imports modules that import torchvision,
  whose PyPI build is CUDA-only; nothing on the relay path uses it. transformers is asked
  first whether torchvision is installed, so that it caches False.
- A runtime config: `FutureMap` reads `get_spec()`; `server_args(...)` publishes one.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import os
import sys
import types
from collections.abc import Iterator
from typing import Any

SKIP_REASON = (
    "sglang 0.5.23 is not importable here; the differential test runs in the SGLang venv "
    "(pip install -e '.[sglang-test]' then pip install --no-deps sglang==0.5.23; see "
    "docs/sglang.md)"
)


class _InertModule(types.ModuleType):
    """Any attribute is another inert module, and calling one returns it."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _InertModule(f"{self.__name__}.{name}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self


class _InertTorchvision(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name == "torchvision" or name.startswith("torchvision."):
            return importlib.util.spec_from_loader(name, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> types.ModuleType:
        module = _InertModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def _stub_torchvision() -> None:
    if any(isinstance(finder, _InertTorchvision) for finder in sys.meta_path):
        return
    with contextlib.suppress(ImportError):
        from transformers.utils import is_torchvision_available

        is_torchvision_available()  # caches False before the stub exists
    if importlib.util.find_spec("torchvision") is None:
        sys.meta_path.insert(0, _InertTorchvision())


def sglang_available() -> bool:
    return importlib.util.find_spec("sglang") is not None


def load_sglang() -> types.SimpleNamespace:
    """SGLang's relay module and the types the tests drive it with."""
    os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ.pop("SGLANG_IS_IN_CI", None)
    _stub_torchvision()
    from sglang.srt.managers import overlap_utils
    from sglang.srt.runtime_context import get_context
    from sglang.srt.speculative.eagle_info import EagleDraftInput
    from sglang.srt.speculative.ngram_info import NgramVerifyInput
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    return types.SimpleNamespace(
        overlap_utils=overlap_utils,
        get_context=get_context,
        EagleDraftInput=EagleDraftInput,
        NgramVerifyInput=NgramVerifyInput,
        SpeculativeAlgorithm=SpeculativeAlgorithm,
    )


@contextlib.contextmanager
def server_args(sgl: types.SimpleNamespace, algorithm: str | None, **kwargs: Any) -> Iterator[None]:
    """Publish a runtime config for `algorithm` (SGLang's name, None: non-speculative)."""
    with sgl.get_context().override_server_args(speculative_algorithm=algorithm, **kwargs):
        yield


def eager_debug_check(sgl: types.SimpleNamespace) -> Any:
    """SGLang's `_assert_nonneg_and_invalidate` without its torch.compile wrapper."""
    fn = sgl.overlap_utils._assert_nonneg_and_invalidate
    return getattr(fn, "_torchdynamo_orig_callable", fn)
