"""The training corpus: this Python's standard library ``*.py`` files (sorted, capped,
excluded directories left out), its SHA-256 and provenance, the file-level held-out split
(every ``HOLDOUT_EVERY``-th file), the held-out prompts of whole lines and the random
``<bos>``-prefixed training windows."""

from __future__ import annotations

import hashlib
import platform
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from relayc.engine.text.bytes import BOS_ID
from relayc.specs.errors import UsageError

# Directories (any path component) left out of the corpus: tests, the IDE, third-party
# packages, demos, generated tables and bundled wheels.
CORPUS_EXCLUDE = (
    "test",
    "tests",
    "idlelib",
    "site-packages",
    "dist-packages",
    "turtledemo",
    "lib2to3",
    "ensurepip",
    "pydoc_data",
    "encodings",
    "__pycache__",
)
HOLDOUT_EVERY = 16  # file i (in sorted order) is held out when i % HOLDOUT_EVERY == HOLDOUT_AT
HOLDOUT_AT = 7
NUM_PROMPTS = 16
PROMPT_BYTES = (64, 200)


@dataclass
class Corpus:
    train: torch.Tensor  # uint8 [N]
    heldout: torch.Tensor  # uint8 [M]
    train_line_starts: torch.Tensor  # int64, offsets just after a newline (or 0)
    heldout_line_starts: torch.Tensor
    heldout_texts: list[tuple[str, bytes]]  # (path relative to stdlib, content)
    sha256: str
    info: dict[str, Any]


def corpus_files(cap_bytes: int) -> tuple[Path, list[Path]]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(
        (
            p
            for p in root.rglob("*.py")
            if not set(p.relative_to(root).parts[:-1]) & set(CORPUS_EXCLUDE)
            and not p.relative_to(root).parts[0].startswith("config-")
        ),
        key=lambda p: p.relative_to(root).as_posix(),
    )
    chosen, total = [], 0
    for path in files:
        size = path.stat().st_size
        if total + size > cap_bytes:
            break
        chosen.append(path)
        total += size
    return root, chosen


def _line_starts(data: bytes) -> torch.Tensor:
    buf = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    starts = (buf == ord("\n")).nonzero().flatten() + 1
    return torch.cat([torch.zeros(1, dtype=torch.int64), starts[starts < len(data)]])


def assemble_corpus(cap_bytes: int) -> Corpus:
    """The standard-library corpus: files in sorted order up to ``cap_bytes``, each ending in
    a newline; every ``HOLDOUT_EVERY``-th file goes to the held-out part."""
    root, files = corpus_files(cap_bytes)
    digest = hashlib.sha256()
    train_parts, heldout_parts, heldout_texts = [], [], []
    for index, path in enumerate(files):
        rel = path.relative_to(root).as_posix()
        data = path.read_bytes()
        if not data.endswith(b"\n"):
            data += b"\n"
        digest.update(rel.encode() + b"\0" + data + b"\0")
        if index % HOLDOUT_EVERY == HOLDOUT_AT:
            heldout_parts.append(data)
            heldout_texts.append((rel, data))
        else:
            train_parts.append(data)
    train, heldout = b"".join(train_parts), b"".join(heldout_parts)
    if not train or not heldout:
        # checked here: which files fit the cap depends on this Python's standard library
        raise UsageError(
            f"--corpus-bytes {cap_bytes}: the files that fit give no "
            f"{'training' if not train else 'held-out'} text ({len(files)} file(s); every "
            f"{HOLDOUT_EVERY}th is held out); raise it (the default is {8 << 20})"
        )
    info = {
        "source": "Python standard library *.py (sysconfig stdlib path), sorted by path",
        "stdlib": str(root),
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "exclude_dirs": list(CORPUS_EXCLUDE),
        "cap_bytes": cap_bytes,
        "files": len(files),
        "heldout_files": len(heldout_texts),
        "heldout_rule": f"file index % {HOLDOUT_EVERY} == {HOLDOUT_AT} (sorted order)",
        "train_bytes": len(train),
        "heldout_bytes": len(heldout),
        "sha256": digest.hexdigest(),
        "sha256_of": "for each file: path + NUL + bytes (newline-terminated) + NUL",
    }
    return Corpus(
        torch.frombuffer(bytearray(train), dtype=torch.uint8),
        torch.frombuffer(bytearray(heldout), dtype=torch.uint8),
        _line_starts(train),
        _line_starts(heldout),
        heldout_texts,
        digest.hexdigest(),
        info,
    )


def sample_batch(
    data: torch.Tensor, starts: torch.Tensor, batch: int, seq: int, generator: torch.Generator
) -> torch.Tensor:
    """``[batch, seq]`` windows: <bos> then ``seq - 1`` bytes from a random line start."""
    starts = starts[starts <= data.numel() - seq]
    pick = starts[torch.randint(starts.numel(), (batch,), generator=generator)]
    offsets = pick[:, None] + torch.arange(seq - 1)[None, :]
    ids = data[offsets].long()
    return torch.cat([torch.full((batch, 1), BOS_ID, dtype=torch.long), ids], dim=1)


def heldout_prompts(corpus: Corpus, seed: int, count: int = NUM_PROMPTS) -> list[dict[str, Any]]:
    """``count`` prompts of whole lines (``PROMPT_BYTES``) from the held-out files: one per file
    in a seeded order first, further rounds only when there are too few held-out files."""
    generator = torch.Generator().manual_seed(seed)
    low, high = PROMPT_BYTES
    prompts: list[dict[str, Any]] = []
    order = torch.randperm(len(corpus.heldout_texts), generator=generator).tolist()
    for _round in range(8):
        for file_index in order:
            if len(prompts) == count:
                return prompts
            rel, data = corpus.heldout_texts[file_index]
            lines = data.splitlines(keepends=True)
            if len(lines) < 4:
                continue
            first = int(torch.randint(len(lines) - 2, (1,), generator=generator))
            text = b""
            for line in lines[first:]:
                if len(text) + len(line) > high:
                    break
                text += line
            stripped = [ln for ln in text.splitlines() if ln.strip()]
            if len(text) < low or len(stripped) < 2 or text.strip().startswith((b"#", b'"""')):
                continue
            if any(p["file"] == rel and p["line"] == first + 1 for p in prompts):
                continue
            try:
                decoded = text.decode("utf-8")
            except UnicodeDecodeError:
                continue
            prompts.append({"file": rel, "line": first + 1, "bytes": len(text), "text": decoded})
    return prompts
