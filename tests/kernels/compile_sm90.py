"""Compile every Triton kernel here for an sm_90 GPU, without one.

The interpreter the other tests use does not type-check kernels the way Triton's
compiler does (loop-carried dtypes, scalar/vector masks, ...), so a kernel can pass
them and still fail to build on a GPU. Run as a script in a process without
TRITON_INTERPRET (the test does that); it prints one line per kernel.
"""

from __future__ import annotations

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from relayc.kernels.build_tree import _build_tree_kernel
from relayc.kernels.chain_sampling import _chain_sampling_kernel
from relayc.kernels.tree_sampling import _tree_sampling_kernel
from relayc.kernels.verify_greedy import _verify_tree_greedy_kernel

OUTPUTS = {"predicts_ptr": "*i32", "accept_index_ptr": "*i32", "accept_token_num_ptr": "*i32"}
TREE = {
    "candidates_ptr": "*i64",
    "retrive_index_ptr": "*i64",
    "retrive_next_token_ptr": "*i64",
    "retrive_next_sibling_ptr": "*i64",
}
FLOATS = {
    "uniform_ptr": "*fp32",
    "uniform_final_ptr": "*fp32",
    "target_probs_ptr": "*fp32",
    "draft_probs_ptr": "*fp32",
}

KERNELS = [
    (
        _verify_tree_greedy_kernel,
        {
            **OUTPUTS,
            **TREE,
            "target_predict_ptr": "*i64",
            "num_draft": "i32",
            "num_spec_step": "i32",
        },
        {"BLOCK_S": 8},
    ),
    (
        _tree_sampling_kernel,
        {
            **OUTPUTS,
            **TREE,
            **FLOATS,
            "num_draft": "i32",
            "num_spec_step": "i32",
            "vocab": "i32",
            "threshold_single": "fp32",
            "threshold_acc": "fp32",
        },
        {"BLOCK_S": 8, "BLOCK_N": 64, "BLOCK_V": 128},
    ),
    *(
        (
            _chain_sampling_kernel,
            {
                **OUTPUTS,
                "draft_token_ids_ptr": "*i64",
                **FLOATS,
                "num_drafts": "i32",
                "vocab": "i32",
            },
            {"BLOCK_S": 8, "BLOCK_V": 1024, "BLOCK_VERIFICATION": block},
        )
        for block in (False, True)
    ),
    *(
        (
            _build_tree_kernel,
            {
                "parent_list_ptr": "*i64",
                "parent_stride": "i64",
                "sel_ptr": "*i64",
                "sel_stride": "i64",
                "seq_lens_ptr": "*i64",
                "block_start_ptr": "*i64",
                "tree_mask_ptr": "*i1",
                "positions_ptr": "*i64",
                "retrive_index_ptr": "*i64",
                "next_token_ptr": "*i64",
                "next_sibling_ptr": "*i64",
                "topk": "i32",
                "spec_steps": "i32",
                "n": "i32",
            },
            {"FULL_MASK": full, "FILL_PREFIX": fill, "BLOCK_N": 8, "BLOCK_PREFIX": 64},
        )
        for full, fill in ((True, True), (True, False), (False, True))
    ),
]
# The number of kernel builds main() prints, for the test to check.
NUM_KERNELS = 7


# Triton turns an integer argument equal to 1 into a compile-time constant, which
# changes the code paths (e.g. `num_spec_step - 1` folds to 0): build those too.
ONES = {"num_draft", "num_spec_step", "num_drafts"}


def compile_sm90(kernel: object, signature: dict[str, str], constexprs: dict[str, int]) -> int:
    signature = {**signature, **dict.fromkeys(constexprs, "constexpr")}
    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
    return len(triton.compile(source, target=GPUTarget("cuda", 90, 32)).asm["cubin"])


def main() -> None:
    for kernel, signature, constexprs in KERNELS:
        size = compile_sm90(kernel, signature, constexprs)
        ones = {name: 1 for name in signature if name in ONES}
        compile_sm90(
            kernel, {k: v for k, v in signature.items() if k not in ones}, {**constexprs, **ones}
        )
        modes = ", ".join(f"{k}={v}" for k, v in constexprs.items() if isinstance(v, bool))
        print(f"{kernel.__name__}({modes}): {size} bytes of sm_90 cubin")


if __name__ == "__main__":
    main()
