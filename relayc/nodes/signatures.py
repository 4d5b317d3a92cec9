"""The per-request tensor types the ops share: the shared ops here (:mod:`relayc.nodes.ops`)
and the ops each algorithm declares in its own module (``Algorithm.ops``) build their
signatures from them, so that what one op writes and the next reads is one declaration.

Shapes are per request (the batch dimension is implied) in dims; `N` below is
`num_draft_tokens`, the verify window with the root.
"""

from __future__ import annotations

from relayc.nodes.registry import TensorType as T

N = "num_draft_tokens"
PARENTS = "topk*(num_steps-1)+1"

SLOTS = {"req_pool_indices": T("int64", (), doc="request-pool slots")}
LENS = {"seq_lens": T("int64", (), doc="KV length before this iteration")}
# What a drafter hands build_tree.
DRAFTING = {
    "parent_list": T("int64", (PARENTS,), doc="parent of each kept beam, flattened"),
    "top_scores_index": T("int64", (f"{N}-1",), doc="selected candidates, ascending"),
    "draft_tokens": T("int64", (f"{N}-1",), doc="tokens of the selected candidates"),
}
TREE = {
    "candidates": T("int64", (N,), doc="tree tokens, the root first"),
    "tree_mask": T("bool", (N, N), doc="ancestor mask over the window"),
    "positions": T("int64", (N,), doc="position of each tree node"),
    "retrive_index": T("int64", (N,)),
    "retrive_next_token": T("int64", (N,), doc="first child, -1 = none"),
    "retrive_next_sibling": T("int64", (N,), doc="next sibling, -1 = none"),
}
# What target_verify reads of the tree.
VERIFY_INPUTS = {k: TREE[k] for k in ("candidates", "tree_mask", "positions")} | LENS | SLOTS
ACCEPTED = {
    "accept_index": T("int64", (N,), doc="accepted node rows, -1 padded"),
    "accept_lens": T("int32", (), doc="tokens emitted, bonus included"),
    "accept_tokens": T("int64", (N,), doc="emitted tokens, left-aligned"),
    "bonus_tokens": T("int64", (), doc="target token after the last accepted node"),
}
FIRST_TOP_K = {
    "topk_p": T("float32", ("topk",)),
    "topk_index": T("int64", ("topk",)),
}
STEP_TOP_K = {
    "topk_p": T("float32", ("num_steps", "topk")),
    "topk_index": T("int64", ("num_steps", "topk")),
}
PREFILLED = {"next_tokens": T("int64", ()), "seq_lens": T("int64", ())}
# What a draft extend reads of the accepted tokens.
EXTEND_INPUTS = {
    "accept_index": ACCEPTED["accept_index"],
    "accept_lens": ACCEPTED["accept_lens"],
    "accept_tokens": ACCEPTED["accept_tokens"],
    **LENS,
    **SLOTS,
}
