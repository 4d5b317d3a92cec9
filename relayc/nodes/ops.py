"""The built-in node ops named by the bundled specs.

Shapes are per request (the batch dimension is implied) in dims; `N` below is
`num_draft_tokens`, the verify window with the root. Implementations are bound
by the engine that runs them.
"""

from __future__ import annotations

from relayc.nodes.registry import Effect, Op, TensorType, register

T = TensorType
N = "num_draft_tokens"
PARENTS = "topk*(num_steps-1)+1"

# The DFlash family's draft KV cache: the prefill and inject_kv write the target's tapped
# context into it, the draft forward attends to it. No tensor of theirs carries it.
_WRITES_DRAFT_KV = (Effect("draft_kv_cache", "writes", "the tapped target context"),)
_READS_DRAFT_KV = (Effect("draft_kv_cache", "reads", "the context the block attends to"),)

_SLOTS = {"req_pool_indices": T("int64", (), doc="request-pool slots")}
_LENS = {"seq_lens": T("int64", (), doc="KV length before this iteration")}
_DRAFTING = {
    "parent_list": T("int64", (PARENTS,), doc="parent of each kept beam, flattened"),
    "top_scores_index": T("int64", (f"{N}-1",), doc="selected candidates, ascending"),
    "draft_tokens": T("int64", (f"{N}-1",), doc="tokens of the selected candidates"),
}
_TREE = {
    "candidates": T("int64", (N,), doc="tree tokens, the root first"),
    "tree_mask": T("bool", (N, N), doc="ancestor mask over the window"),
    "positions": T("int64", (N,), doc="position of each tree node"),
    "retrive_index": T("int64", (N,)),
    "retrive_next_token": T("int64", (N,), doc="first child, -1 = none"),
    "retrive_next_sibling": T("int64", (N,), doc="next sibling, -1 = none"),
}
_ACCEPTED = {
    "accept_index": T("int64", (N,), doc="accepted node rows, -1 padded"),
    "accept_lens": T("int32", (), doc="tokens emitted, bonus included"),
    "accept_tokens": T("int64", (N,), doc="emitted tokens, left-aligned"),
    "bonus_tokens": T("int64", (), doc="target token after the last accepted node"),
}
_FIRST_TOP_K = {
    "topk_p": T("float32", ("topk",)),
    "topk_index": T("int64", ("topk",)),
}
_STEP_TOP_K = {
    "topk_p": T("float32", ("num_steps", "topk")),
    "topk_index": T("int64", ("num_steps", "topk")),
}
_PREFILLED = {"next_tokens": T("int64", ()), "seq_lens": T("int64", ())}
_EXTEND_INPUTS = {
    "accept_index": _ACCEPTED["accept_index"],
    "accept_lens": _ACCEPTED["accept_lens"],
    "accept_tokens": _ACCEPTED["accept_tokens"],
    **_LENS,
    **_SLOTS,
}

# The chain accept ops (token-wise and block verification) read the same values.
_CHAIN_ACCEPT_INPUTS = {
    "logits": T("float32", (N, "vocab")),
    "candidates": _TREE["candidates"],
    "positions": _TREE["positions"],
    "draft_probs": T("float32", ("num_steps", "vocab")),
}


for op in (
    # Non-speculative decoding.
    Op(
        "target_prefill",
        {**_SLOTS, **_LENS},
        {"next_tokens": T("int64", ())},
        doc="target forward over the prompt, first sampled token",
    ),
    Op(
        "target_decode",
        {"input_ids": T("int64", ()), **_SLOTS, **_LENS},
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
        {"bonus_tokens": T("int64", ()), **_DRAFTING, **_LENS},
        _TREE,
        doc="verify tree from drafting results (relayc.kernels.build_tree)",
    ),
    Op(
        "target_verify",
        {k: _TREE[k] for k in ("candidates", "tree_mask", "positions")} | _LENS | _SLOTS,
        {"logits": T("float32", (N, "vocab")), "hidden_states": T("model", (N, "hidden"))},
        doc="one target forward over every tree node",
    ),
    Op(
        "accept_tree",
        {
            "logits": T("float32", (N, "vocab")),
            "candidates": _TREE["candidates"],
            "positions": _TREE["positions"],
            "retrive_index": _TREE["retrive_index"],
            "retrive_next_token": _TREE["retrive_next_token"],
            "retrive_next_sibling": _TREE["retrive_next_sibling"],
        },
        _ACCEPTED,
        doc="greedy or target-only sampling acceptance over the tree",
    ),
    Op(
        "compact_accepted_kv",
        {
            "accept_index": _ACCEPTED["accept_index"],
            "accept_lens": _ACCEPTED["accept_lens"],
            **_LENS,
            **_SLOTS,
        },
        {"new_seq_lens": T("int64", ())},
        doc="move accepted KV to contiguous positions",
    ),
    # EAGLE.
    Op(
        "eagle_prefill",
        {**_SLOTS, **_LENS},
        {
            **_PREFILLED,
            **_FIRST_TOP_K,
            "hidden_states": T("model", ("hidden",)),
            "draft_probs": T("float32", ("vocab",)),
        },
        doc="target prefill, then the draft head over the prompt",
    ),
    Op(
        "eagle_draft",
        {
            **_FIRST_TOP_K,
            "hidden_states": T("model", ("hidden",)),
            "draft_probs": T("float32", ("vocab",), optional=True),
            **_LENS,
            **_SLOTS,
        },
        {**_DRAFTING, "chain_draft_probs": T("float32", ("num_steps", "vocab"))},
        doc="expand the relayed top-k for num_steps draft-head steps",
    ),
    Op(
        "eagle_draft_extend",
        {"hidden_states": T("model", (N, "hidden")), **_EXTEND_INPUTS},
        {
            **_FIRST_TOP_K,
            "hidden_states": T("model", ("hidden",)),
            "draft_probs": T("float32", ("vocab",)),
        },
        doc="draft head over the accepted tokens; next top-k",
    ),
    # EAGLE-3: the inputs of three target layers feed the head's fc; it drafts in its own
    # (reduced) vocabulary, whose ids a d2t map takes to target ids before the tree is built.
    Op(
        "eagle3_prefill",
        {**_SLOTS, **_LENS},
        {**_PREFILLED, **_FIRST_TOP_K, "hidden_states": T("model", ("hidden",))},
        doc="target prefill capturing three layers' inputs, then the head over the prompt",
    ),
    Op(
        "eagle3_draft",
        {**_FIRST_TOP_K, "hidden_states": T("model", ("hidden",)), **_LENS, **_SLOTS},
        dict(_DRAFTING),
        doc="expand the relayed top-k for num_steps head steps; draft-vocabulary ids",
    ),
    Op(
        "draft_to_target",
        {"draft_tokens": _DRAFTING["draft_tokens"]},
        {"draft_tokens": T("int64", (f"{N}-1",), doc="the same tokens as target ids")},
        doc="map draft-vocabulary ids to target ids (the head's d2t)",
    ),
    Op(
        "target_verify_aux",
        {k: _TREE[k] for k in ("candidates", "tree_mask", "positions")} | _LENS | _SLOTS,
        {
            "logits": T("float32", (N, "vocab")),
            "aux_hidden_states": T("model", (N, "3*hidden"), doc="three layers' inputs"),
        },
        doc="target_verify, returning the inputs of the three layers the head reads",
    ),
    Op(
        "eagle3_draft_extend",
        {"aux_hidden_states": T("model", (N, "3*hidden")), **_EXTEND_INPUTS},
        {**_FIRST_TOP_K, "hidden_states": T("model", ("hidden",))},
        doc="head over the accepted tokens and their target features; next top-k",
    ),
    # Multi-layer EAGLE (MTP).
    Op(
        "mtp_prefill",
        {**_SLOTS, **_LENS},
        {**_PREFILLED, **_STEP_TOP_K},
        doc="target prefill, then every draft layer proposes its step",
    ),
    Op(
        "mtp_select",
        dict(_STEP_TOP_K),
        dict(_DRAFTING),
        doc="drafting results from the relayed per-step top-k",
    ),
    Op(
        "mtp_draft_extend",
        {"hidden_states": T("model", (N, "hidden")), **_EXTEND_INPUTS},
        dict(_STEP_TOP_K),
        doc="draft layers over the accepted tokens",
    ),
    # N-gram.
    Op(
        "ngram_prefill",
        {**_SLOTS, **_LENS},
        {
            "next_tokens": _PREFILLED["next_tokens"],
            "accept_tokens": _ACCEPTED["accept_tokens"],
            "accept_lens": _ACCEPTED["accept_lens"],
            "seq_lens": T("int64", ()),
        },
        doc="target prefill; first token, also as a one-token accept row",
    ),
    Op(
        "ngram_propose",
        dict(_SLOTS),
        {"proposals": T("int64", (N, N)), "proposal_keys": T("int64", (N,))},
        placement="host",
        doc="suffix-match proposals from the host's token history",
    ),
    Op(
        "ngram_splice",
        {
            "accept_tokens": _ACCEPTED["accept_tokens"],
            "accept_lens": _ACCEPTED["accept_lens"],
            "proposals": T("int64", (N, N)),
            "proposal_keys": T("int64", (N,)),
            **_LENS,
        },
        _TREE,
        doc="pick proposals for the relayed accepted tokens; lay out the tree",
    ),
    # Standalone draft model.
    Op(
        "standalone_prefill",
        {**_SLOTS, **_LENS},
        {**_PREFILLED, **_FIRST_TOP_K, "draft_probs": T("float32", ("vocab",))},
        doc="target and draft prefill",
    ),
    Op(
        "standalone_draft",
        {**_FIRST_TOP_K, "draft_probs": T("float32", ("vocab",)), **_LENS, **_SLOTS},
        {**_DRAFTING, "chain_draft_probs": T("float32", ("num_steps", "vocab"))},
        doc="continue the chain with num_steps - 1 draft forwards",
    ),
    Op(
        "accept_chain",
        _CHAIN_ACCEPT_INPUTS,
        _ACCEPTED,
        doc="greedy or rejection sampling with real draft probabilities",
    ),
    Op(
        "accept_chain_block",
        _CHAIN_ACCEPT_INPUTS,
        _ACCEPTED,
        doc="accept_chain with block verification (Sun et al. 2024) for sampled rows",
    ),
    Op(
        "standalone_draft_extend",
        {
            k: _EXTEND_INPUTS[k]
            for k in ("accept_tokens", "accept_lens", "seq_lens", "req_pool_indices")
        },
        {**_FIRST_TOP_K, "draft_probs": T("float32", ("vocab",))},
        doc="draft model over the accepted tokens; next top-k",
    ),
    # Block drafters (SGLang 0.5.23's DFLASH, DSPARK and UNO): the whole draft chain comes
    # from one draft forward, and only the bonus token and the lengths cross iterations.
    Op(
        "dflash_prefill",
        {**_SLOTS, **_LENS},
        _PREFILLED,
        doc="target prefill; its layer features go straight into the draft KV cache",
        effects=_WRITES_DRAFT_KV,
    ),
    Op(
        "dflash_draft",
        {"bonus_tokens": T("int64", ()), **_LENS, **_SLOTS},
        _DRAFTING,
        doc="one draft forward over a block (the bonus token, then masks): the whole chain",
        effects=_READS_DRAFT_KV,
    ),
    Op(
        "dflash_verify",
        {k: _TREE[k] for k in ("candidates", "tree_mask", "positions")} | _LENS | _SLOTS,
        {
            "logits": T("float32", (N, "vocab")),
            "hidden_states": T(
                "model",
                (N, "hidden"),
                doc="the draft context: fc + hidden_norm of the tapped layers",
            ),
        },
        doc="target_verify, returning each node's draft context (the drafter's projection "
        "of the target layers it reads) instead of the last hidden state",
    ),
    Op(
        "dflash_inject_kv",
        {
            "hidden_states": T("model", (N, "hidden")),
            "accept_index": _ACCEPTED["accept_index"],
            "accept_lens": _ACCEPTED["accept_lens"],
            **_LENS,
            **_SLOTS,
        },
        {"draft_seq_lens": T("int64", (), doc="the draft KV cache's length after the write")},
        doc="write the accepted positions' draft context (dflash_verify's) into the draft KV cache",
        effects=_WRITES_DRAFT_KV,
    ),
    Op(
        "dspark_draft",
        {"bonus_tokens": T("int64", ()), **_LENS, **_SLOTS},
        {
            **_DRAFTING,
            "confidence": T("float32", (N,), doc="the confidence head's, per block position"),
        },
        doc="dflash_draft with DSpark's Markov head refining the block",
        effects=_READS_DRAFT_KV,
    ),
    Op(
        "uno_prefill",
        {**_SLOTS, **_LENS},
        _PREFILLED,
        doc="target prefill (the LoRA self-drafter keeps no draft state of its own)",
    ),
    Op(
        "uno_draft",
        {"bonus_tokens": T("int64", ()), **_LENS, **_SLOTS},
        _DRAFTING,
        doc="one LoRA-adapted target forward over a block of masks: the whole chain",
    ),
):
    register(op)
