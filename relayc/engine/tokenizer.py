"""The byte-level tokenizer of the tiny default model: one token per UTF-8 byte."""

from __future__ import annotations

from collections.abc import Iterable

BOS_ID = 256
EOS_ID = 257
PAD_ID = 258
VOCAB_SIZE = 259


class ByteTokenizer:
    bos_id = BOS_ID
    eos_id = EOS_ID
    pad_id = PAD_ID
    vocab_size = VOCAB_SIZE

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        ids = list(text.encode("utf-8"))
        return [BOS_ID, *ids] if add_bos else ids

    def decode(self, ids: Iterable[int]) -> str:
        """Bytes back to text; special ids are dropped, broken UTF-8 becomes U+FFFD."""
        ids = list(ids)
        bad = [t for t in ids if not 0 <= t < VOCAB_SIZE]
        if bad:
            raise ValueError(f"token ids {bad} are outside the vocabulary [0, {VOCAB_SIZE})")
        return bytes(t for t in ids if t < 256).decode("utf-8", errors="replace")
