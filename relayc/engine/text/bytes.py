"""The byte-level tokenizer of the tiny default model: one token per UTF-8 byte.

It has the same interface as a real model's tokenizer (``relayc.engine.text.tokenizer``)
where the engine uses one: ``encode_prompt`` (a BOS first), ``decode``, ``eog_ids``
(none: the demo models were trained on documents separated by ``<bos>``, never ended by
``<eos>``, so they have no end-of-generation token to stop at) and no chat template.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from relayc.engine.text.chat import ChatError

BOS_ID = 256
EOS_ID = 257
PAD_ID = 258
VOCAB_SIZE = 259


class ByteTokenizer:
    bos_id = BOS_ID
    eos_id = EOS_ID
    pad_id = PAD_ID
    vocab_size = VOCAB_SIZE
    eog_ids: tuple[int, ...] = ()
    chat_template: str | None = None

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        ids = list(text.encode("utf-8"))
        return [BOS_ID, *ids] if add_bos else ids

    def encode_prompt(self, text: str) -> list[int]:
        return self.encode(text, add_bos=True)

    def decode(self, ids: Iterable[int]) -> str:
        """Bytes back to text; special ids are dropped, broken UTF-8 becomes U+FFFD."""
        ids = list(ids)
        bad = [t for t in ids if not 0 <= t < VOCAB_SIZE]
        if bad:
            raise ValueError(f"token ids {bad} are outside the vocabulary [0, {VOCAB_SIZE})")
        return bytes(t for t in ids if t < 256).decode("utf-8", errors="replace")

    def encode_chat(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True
    ) -> list[int]:
        raise ChatError(
            "the byte-level demo model has no chat template (it continues Python source); "
            "pass the prompt text instead"
        )
