"""The greedy tokens of the last logits the native LM head made, kept for the ops that read them.

Greedy decoding takes the argmax of every logits row the target makes, and so does a greedy
verify. Done as its own pass after the forward, that argmax re-reads the whole rows
(49,152 floats each for SmolLM2) from caches the forward's weight reads have just
emptied: 90-120 us an iteration in the engine, several times its cost back to back. The
native LM head (``relayc_head_argmax``) makes the logits a chunk of columns at a time and
scans each chunk while it is still in L1, so the argmax comes nearly free with the logits.

The ops see only the logits tensor (the spec's contract), so the head leaves its argmax
here and :func:`relayc.engine.ops.target.greedy_tokens` asks for it. An answer is given
only for the very logits it was made for: the same memory (held here, so no other tensor
can take it over), the same rows, and no in-place change since (the tensor's version
counter, which views share). Anything else -- a copy, a slice of other rows, logits
changed after the head, another thread -- gets None, and the caller takes the argmax
itself: the same indices either way.
"""

from __future__ import annotations

import threading

import torch

# The native head asks for the argmax of at most this many rows: the logits of more (a long
# prefill's, when every row is kept) are not held, which would double what they take until
# the next forward.
MAX_ROWS = 64

_local = threading.local()


def remember(logits: torch.Tensor, argmax: torch.Tensor) -> None:
    """``argmax`` (``logits.shape[:-1]``, int64) is the greedy token of each row of
    ``logits`` (contiguous float32), until the next call on this thread."""
    # An inference tensor (torch.inference_mode) keeps no version counter, so a later
    # in-place change could not be told: those logits are not held.
    if not logits.is_contiguous() or logits.is_inference():
        _local.entry = None
        return
    _local.entry = (logits, argmax, logits._version)


def forget() -> None:
    """Drop what this thread holds (the logits and their argmax)."""
    _local.entry = None


def lookup(logits: torch.Tensor) -> torch.Tensor | None:
    """The argmax of ``logits`` over its last dimension, shaped ``logits.shape[:-1]``, if
    these are the rows the native head last made on this thread and unchanged since; else
    None."""
    entry = getattr(_local, "entry", None)
    if entry is None:
        return None
    held, argmax, version = entry
    if (
        logits.data_ptr() != held.data_ptr()
        or logits.device != held.device
        or logits.dtype != held.dtype
        or logits.numel() != held.numel()
        or logits.dim() == 0
        or logits.shape[-1] != held.shape[-1]
        or not logits.is_contiguous()
        or logits.is_inference()
        or logits._version != version
    ):
        return None
    return argmax.view(logits.shape[:-1])
