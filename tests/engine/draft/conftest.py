"""One intra-op thread for these tests: the models are tiny, and on a loaded 2-core machine
two spinning threads made each small matmul ~100x slower (measured 0.3 s vs 3 ms)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True, scope="package")
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
