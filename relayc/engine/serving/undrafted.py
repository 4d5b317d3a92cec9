"""The one-token step of a decode batch its host drafter proposed nothing for.

A verify step whose trees are the root alone (a host drafter that matched nothing: n-gram,
suffix) emits one token a request, as a plain decode does, at the cost of a tree verify:
splice, verify, accept, KV compaction, eager (on SmolLM2 float32, 0.80x `none`'s
recorded step; 60-73% of suffix's steps on chat prompts draft nothing). When the host
has seen every token of every request in the batch (no step of theirs in flight, so its
proposal is the one the device would splice) and the algorithm says it drafts nothing
for any (``DecodeAlgorithm.drafts_nothing``), the scheduler runs the batch as the
one-token tail steps it already runs at the context end: a prefill row of the last
sampled token, whose relay reads as a verify that accepted the bonus token alone.

Every token is the one the verify would give: the target's next token at the same
position, sampled with the same seed and position.
"""

from __future__ import annotations

from collections.abc import Sequence

from relayc.engine.serving.algorithms import DecodeAlgorithm
from relayc.engine.serving.request import Request


def undrafted(algorithm: DecodeAlgorithm, requests: Sequence[Request]) -> bool:
    """Whether ``requests``' decode step can run as one-token steps (module docstring)."""
    if not requests or algorithm.decode_width == 1:
        return False
    if any(request.inflight for request in requests):  # the host's history lags
        return False
    return algorithm.drafts_nothing([request.req_pool_index for request in requests])
