"""The shared node ops: those any algorithm's spec may name (the target's forwards,
sampling, the verify tree, acceptance, KV compaction).

An algorithm's own ops (its prefill, drafting and draft extend) are declared in its module
(``Algorithm.ops`` in :mod:`relayc.engine.algorithms`), as a third-party algorithm package
declares its own, and reach the compiler through its entry point. Shapes are per request
(:mod:`relayc.nodes.signatures`). Implementations are bound by the engine that runs them.
"""

from __future__ import annotations

from relayc.nodes.registry import Effect, Op, register
from relayc.nodes.registry import TensorType as T
from relayc.nodes.signatures import (
    ACCEPTED,
    DRAFTING,
    LENS,
    PREFILLED,
    SLOTS,
    TREE,
    VERIFY_INPUTS,
    N,
)

# The chain accept ops (token-wise and block verification) read the same values.
_CHAIN_ACCEPT_INPUTS = {
    "logits": T("float32", (N, "vocab")),
    "candidates": TREE["candidates"],
    "positions": TREE["positions"],
    "draft_probs": T("float32", ("num_steps", "vocab")),
}


for op in (
    # Non-speculative decoding.
    Op(
        "target_prefill",
        {**SLOTS, **LENS},
        {"next_tokens": T("int64", ())},
        doc="target forward over the prompt, first sampled token",
    ),
    Op(
        "target_decode",
        {"input_ids": T("int64", ()), **SLOTS, **LENS},
        {"logits": T("float32", ("vocab",))},
        doc="one target forward per request",
    ),
    Op(
        "sample",
        {"logits": T("float32", ("vocab",))},
        {"next_tokens": T("int64", ())},
        doc="greedy or sampled next token",
    ),
    # Shared by the tree algorithms.
    Op(
        "build_tree",
        {"bonus_tokens": T("int64", ()), **DRAFTING, **LENS},
        TREE,
        doc="verify tree from drafting results (relayc.kernels.build_tree)",
    ),
    Op(
        "target_verify",
        VERIFY_INPUTS,
        {"logits": T("float32", (N, "vocab")), "hidden_states": T("model", (N, "hidden"))},
        doc="one target forward over every tree node",
    ),
    Op(
        "accept_tree",
        {
            "logits": T("float32", (N, "vocab")),
            "candidates": TREE["candidates"],
            "positions": TREE["positions"],
            "retrive_index": TREE["retrive_index"],
            "retrive_next_token": TREE["retrive_next_token"],
            "retrive_next_sibling": TREE["retrive_next_sibling"],
        },
        ACCEPTED,
        doc="greedy or target-only sampling acceptance over the tree",
    ),
    Op(
        "compact_accepted_kv",
        {
            "accept_index": ACCEPTED["accept_index"],
            "accept_lens": ACCEPTED["accept_lens"],
            **LENS,
            **SLOTS,
        },
        {"new_seq_lens": T("int64", ())},
        doc="move accepted KV to contiguous positions",
    ),
    # Chain verification with real draft probabilities (any chain drafter).
    Op(
        "accept_chain",
        _CHAIN_ACCEPT_INPUTS,
        ACCEPTED,
        doc="greedy or rejection sampling with real draft probabilities",
    ),
    Op(
        "accept_chain_block",
        _CHAIN_ACCEPT_INPUTS,
        ACCEPTED,
        doc="accept_chain with block verification (Sun et al. 2024) for sampled rows",
    ),
    # DSpark's and UNO's drafting (SGLang only: the engine runs neither) stay here for now:
    # the engine and vLLM targets refuse those algorithms by these op names
    # (codegen.ENGINE_TARGET, vllm.UNO_OPS), and every target takes an op an installed
    # algorithm declares as implemented. Moving them needs that check to ask whether the
    # declaring algorithm runs on the target.
    Op(
        "dspark_draft",
        {"bonus_tokens": T("int64", ()), **LENS, **SLOTS},
        {
            **DRAFTING,
            "confidence": T("float32", (N,), doc="the confidence head's, per block position"),
        },
        doc="dflash_draft with DSpark's Markov head refining the block",
        effects=(Effect("draft_kv_cache", "reads", "the context the block attends to"),),
    ),
    Op(
        "uno_prefill",
        {**SLOTS, **LENS},
        PREFILLED,
        doc="target prefill (the LoRA self-drafter keeps no draft state of its own)",
    ),
    Op(
        "uno_draft",
        {"bonus_tokens": T("int64", ()), **LENS, **SLOTS},
        DRAFTING,
        doc="one LoRA-adapted target forward over a block of masks: the whole chain",
    ),
):
    register(op)
