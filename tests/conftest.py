"""Test-wide setup.

Triton kernels run on the CPU through Triton's interpreter, which must be chosen
before Triton is first imported -- by any test module -- so it is set here, at
the root. An explicit TRITON_INTERPRET=0 (e.g. on a GPU machine) wins.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
