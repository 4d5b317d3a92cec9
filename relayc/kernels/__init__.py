"""Shared verify kernels: Triton kernels, vectorised torch paths and plain-torch references.

Every entry point takes ``backend="auto"`` (Triton on CUDA, torch on the CPU) and
keeps SGLang's (0.5.23) argument names, order, dtypes and in-place outputs; each
docstring names the SGLang function and file it follows. The verify kernels share one
degenerate-input policy (``_inverse_cdf``) and are checked rule by rule against SGLang's
semantics in ``tests/kernels/test_sglang_semantics.py``.
"""

from __future__ import annotations

from relayc.kernels.build_tree import (
    BuiltTree,
    TreeMaskMode,
    build_tree,
    build_tree_reference,
    packed_mask_dtype,
    unpack_tree_mask,
)
from relayc.kernels.chain_sampling import (
    chain_speculative_sampling,
    chain_speculative_sampling_reference,
)
from relayc.kernels.kv import (
    AcceptedCacheLocs,
    assign_req_to_token_pool,
    assign_req_to_token_pool_reference,
    fill_accept_out_cache_loc,
    fill_accept_out_cache_loc_reference,
    read_req_to_token_pool,
    read_req_to_token_pool_reference,
)
from relayc.kernels.rng import keyed_uniforms
from relayc.kernels.tree_sampling import (
    tree_speculative_sampling_target_only,
    tree_speculative_sampling_target_only_reference,
)
from relayc.kernels.verify_greedy import verify_tree_greedy, verify_tree_greedy_reference

__all__ = [
    "AcceptedCacheLocs",
    "BuiltTree",
    "TreeMaskMode",
    "assign_req_to_token_pool",
    "assign_req_to_token_pool_reference",
    "build_tree",
    "build_tree_reference",
    "chain_speculative_sampling",
    "chain_speculative_sampling_reference",
    "fill_accept_out_cache_loc",
    "fill_accept_out_cache_loc_reference",
    "keyed_uniforms",
    "packed_mask_dtype",
    "read_req_to_token_pool",
    "read_req_to_token_pool_reference",
    "tree_speculative_sampling_target_only",
    "tree_speculative_sampling_target_only_reference",
    "unpack_tree_mask",
    "verify_tree_greedy",
    "verify_tree_greedy_reference",
]
