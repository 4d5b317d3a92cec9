"""A drafter's draft vocabulary: the target tokens its head scores when it drafts.

A drafter that borrows the target's LM head (DFlash) spends most of a draft on it: a
49,152-token head over a block's rows costs more than the draft layers. A draft only
proposes; the target verifies every token, so scoring a subset of the vocabulary -- the
tokens the drafter was trained to tell apart, most of what a self-distilled corpus's answers
use -- changes which tokens are proposed, never which are emitted (the idea of SGLang's
``--speculative-token-map`` and FR-Spec's frequency-ranked draft vocabulary).

The subset ships beside the drafter's safetensors as ``draft_vocab.json`` (``{"format":
"relayc-draft-vocab/1", "token_ids": [...]}``: strictly increasing target ids), so the
weights stay in the public layout that other engines load. :class:`DraftVocabHead` holds the
target head's rows for those ids and maps a draft's argmax back to target ids.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from relayc.engine.core.layers import Linear
from relayc.engine.errors import CheckpointError
from relayc.engine.model.weights import read_json_object

FILENAME = "draft_vocab.json"
FORMAT = "relayc-draft-vocab/1"


def read_draft_vocab(directory: Path, vocab_size: int) -> torch.Tensor | None:
    """``[V']`` int64 sorted target ids from ``directory/draft_vocab.json``, or None when
    the drafter has none; ``CheckpointError`` naming the file and what to fix otherwise
    (its size is checked before it is read)."""
    path = directory / FILENAME
    if not path.is_file():
        return None
    limit = 4096 + 12 * vocab_size  # every id of the vocabulary, with separators
    size = path.stat().st_size
    if size > limit:
        raise CheckpointError(
            f"{size} bytes, more than a draft vocabulary of the target's {vocab_size} tokens "
            f"takes ({limit}); remove the file to score the whole vocabulary",
            path,
        )
    header = read_json_object(path)
    if header.get("format") != FORMAT:
        raise CheckpointError(f"`format` must be {FORMAT!r}, got {header.get('format')!r}", path)
    ids = header.get("token_ids")
    if (
        not isinstance(ids, list)
        or not ids
        or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids)
    ):
        raise CheckpointError("`token_ids` must be a non-empty list of integer token ids", path)
    bad = next((i for i in ids if not 0 <= i < vocab_size), None)
    if bad is not None:
        raise CheckpointError(
            f"`token_ids` holds {bad}, outside the target's vocabulary 0..{vocab_size - 1}", path
        )
    tokens = torch.tensor(ids, dtype=torch.int64)
    if tokens.numel() > 1 and not bool((tokens[1:] > tokens[:-1]).all()):
        raise CheckpointError("`token_ids` must be strictly increasing (sorted, no repeats)", path)
    return tokens


def write_draft_vocab(directory: Path, tokens: torch.Tensor) -> Path:
    """``directory/draft_vocab.json`` holding ``tokens`` (sorted target ids)."""
    path = directory / FILENAME
    body = {"format": FORMAT, "token_ids": [int(t) for t in tokens.tolist()]}
    path.write_text(json.dumps(body, separators=(",", ":")) + "\n")
    return path


class DraftVocabHead:
    """The target LM head's rows for a draft vocabulary, as a ``Linear`` of their own
    (rebuilt when the target's head is moved or cast), and the map back to target ids."""

    def __init__(self, tokens: torch.Tensor) -> None:
        self.tokens = tokens
        self._key: tuple[object, ...] | None = None
        self._linear: Linear | None = None

    def linear(self, lm_head: Linear) -> Linear:
        """``Linear`` over ``lm_head``'s rows of the draft vocabulary."""
        weight = lm_head.weight
        key = (weight.data_ptr(), weight.dtype, weight.device, tuple(weight.shape))
        if self._linear is None or self._key != key:
            rows = self.tokens.to(weight.device)
            linear = Linear(weight.shape[1], rows.numel(), weight.dtype)
            linear.weight = torch.nn.Parameter(
                weight.detach()[rows].contiguous(), requires_grad=False
            )
            self._linear, self._key = linear.to(weight.device), key
            self.tokens = rows
        return self._linear

    def target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Target ids of draft-vocabulary indices (any shape)."""
        return self.tokens[draft_ids]
