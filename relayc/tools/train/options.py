"""What the training commands (``python -m relayc.tools.train [eagle3|dflash]``) share on the
command line: the argparse types of their folder and layer-list flags, and
:func:`run_command`, which reports their typed errors in one line.

A flag's value is checked where it is read: its syntax, and what can be known before a
model loads (a folder exists, layer ids are distinct), by the argparse types here; what
needs the target (how many layers it has) right after it loads, as a ``UsageError`` naming
the flag. Files read from ``--work`` or a flag's folder fail as ``CheckpointError`` naming
the file (``relayc.tools.train.work``). Anything else escaping a command is a bug: its
traceback is shown, then one line saying so.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from relayc.engine.errors import CheckpointError
from relayc.specs.errors import (
    EXIT_BUG,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    UsageError,
    one_line,
    report_bug,
)

MAX_LAYER_ID = 4095  # far above any model's depth; the target's own bound is checked later


def run_command(prog: str, body: Callable[[], int], *, resumable: bool = True) -> int:
    """``body()``'s exit code; a ``UsageError`` or ``CheckpointError`` (a bad flag, a bad
    file) becomes one line on stderr and exit 2, Ctrl-C one line (saying the command
    resumes from ``--work`` when it is ``resumable``) and exit 130. Any other exception is
    a bug in relayc: its traceback, then one line asking for a report."""
    try:
        return body()
    except (UsageError, CheckpointError) as exc:
        print(one_line(f"{prog}: error: {exc}"), file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        resume = " (the same command resumes from --work)" if resumable else ""
        print(f"\n{prog}: interrupted{resume}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception:
        report_bug(prog)
        return EXIT_BUG


def folder(text: str) -> str:
    """An argparse type: an existing folder."""
    path = Path(text)
    if not path.is_dir():
        what = "is a file, not a folder" if path.exists() else "does not exist"
        raise argparse.ArgumentTypeError(f"{text!r} {what}")
    return text


def head_folder(text: str) -> str:
    """An argparse type: a stored model's folder (``config.json`` and safetensors)."""
    folder(text)
    if not (Path(text) / "config.json").is_file():
        raise argparse.ArgumentTypeError(
            f"{text!r} has no config.json (give the folder a training run wrote with --out)"
        )
    return text


def corpus_folders(text: str) -> str:
    """An argparse type: one chat corpus folder, or several separated by commas, each with
    an ``examples.jsonl`` (``relayc.tools.train.chat_corpus``)."""
    for part in text.split(","):
        corpus_folder(part)
    return text


def corpus_folder(text: str) -> str:
    """An argparse type: a chat corpus folder (``examples.jsonl`` in it)."""
    folder(text)
    if not (Path(text) / "examples.jsonl").is_file():
        raise argparse.ArgumentTypeError(
            f"{text!r} has no examples.jsonl (give a chat corpus folder: "
            "python -m relayc.tools.train.chat_corpus writes one)"
        )
    return text


def output_folder(text: str) -> str:
    """An argparse type: a folder to write into, which may not exist yet (but is not a
    file)."""
    if Path(text).exists() and not Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a file; give a folder")
    return text


def _whole_numbers(text: str, low: int) -> list[int]:
    items = [x.strip() for x in text.split(",")]
    numbers = []
    for position, item in enumerate(items, start=1):
        try:
            value = int(item)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"item {position} is {item!r}, not a whole number (e.g. 0,2,4)"
            ) from None
        if not low <= value <= MAX_LAYER_ID:
            raise argparse.ArgumentTypeError(
                f"item {position} is {value}; layer ids lie in {low}..{MAX_LAYER_ID}"
            )
        numbers.append(value)
    return numbers


def layer_ids(text: str) -> list[int]:
    """An argparse type: distinct target layer ids in increasing order, ``0,2,4`` (whether the
    target has them is checked once it is loaded: :func:`check_layer_ids`)."""
    ids = _whole_numbers(text, 0)
    if len(set(ids)) != len(ids):
        raise argparse.ArgumentTypeError(f"{text!r} names a layer twice; give distinct ids")
    if ids != sorted(ids):
        raise argparse.ArgumentTypeError(f"{text!r}: give the ids in increasing order")
    return ids


def layer_offsets(text: str) -> list[int]:
    """An argparse type: target layers by index, negative counting from the end
    (``-2,-1``); empty for none."""
    return _whole_numbers(text, -MAX_LAYER_ID) if text.strip() else []


def check_layer_ids(flag: str, ids: list[int], num_layers: int) -> None:
    """``UsageError`` unless every id names a target layer whose output another layer reads
    (``0..num_layers - 2``), as drafters that tap the target's features need."""
    bad = [i for i in ids if i > num_layers - 2]
    if bad:
        raise UsageError(
            f"{flag} {','.join(map(str, ids))}: the target has {num_layers} layers; give ids "
            f"in 0..{num_layers - 2} (outputs of a layer another layer reads), not {bad}"
        )
