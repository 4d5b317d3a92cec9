"""Code-generation targets besides relayc's own module per algorithm.

`sglang`: a drop-in with SGLang 0.5.23's relay surface (`relayc compile --target sglang`),
from `sglang.compile_sglang`; `sglang_runtime` is its hand-written runtime, copied beside it.
"""
