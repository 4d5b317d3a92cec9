"""Code-generation targets besides relayc's own module per algorithm.

`sglang`: one module with SGLang 0.5.23's relay surface (`relayc compile --target sglang`),
from `sglang.compile_sglang`; `sglang_base` is the fixed part of that module.
"""
