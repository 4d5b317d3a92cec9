from __future__ import annotations

import os

# Must precede the first `import triton` anywhere in the session: Triton reads it at
# import time, and it is what lets backend="triton" run the kernels on the CPU.
os.environ.setdefault("TRITON_INTERPRET", "1")
