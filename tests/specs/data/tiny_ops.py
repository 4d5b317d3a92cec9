"""The user ops of tiny.yaml, the spec the bad-spec catalogue breaks: signatures that match
its steps exactly, so the base spec passes every check `relayc compile` runs."""

from __future__ import annotations

from relayc.nodes import Op, TensorType, register

TOKEN = TensorType("int64")
TOPK_P = TensorType("float32", ("topk",))

register(
    Op(
        "tiny_prefill",
        {"req_pool_indices": TensorType("int64")},
        {"next_tokens": TOKEN, "topk_p": TOPK_P},
    )
)
register(Op("tiny_decode", {"input_ids": TOKEN, "topk_p": TOPK_P}, {"logits": TOPK_P}))
register(Op("tiny_sample", {"logits": TOPK_P}, {"next_tokens": TOKEN, "topk_p": TOPK_P}))
