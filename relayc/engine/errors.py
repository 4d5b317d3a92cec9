"""The error every checkpoint and tokenizer reader raises: the engine's lowest room, so that
text/, checkpoints/ and model/ share it without importing each other."""

from __future__ import annotations

from pathlib import Path


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded into the model; the message says why and, when
    one file is at fault, starts with it (``path``).

    Every checkpoint format's reader raises this or a subclass, so one ``except`` (the
    command line's, which turns it into one line and exit 2) covers them all.
    """

    def __init__(self, message: str, path: str | Path | None = None) -> None:
        self.path = None if path is None else Path(path)
        super().__init__(message if path is None else f"{path}: {message}")


class GGUFError(CheckpointError):
    """A GGUF file that cannot be loaded; the message names the file and what is wrong
    (here, beside ``CheckpointError``, because the tokenizer reads a GGUF file's keys too)."""
