"""Argument checks shared by the tools' command lines (`relayc generate`, `relayc demo`,
`python -m relayc.tools.train`).

Every value is checked while the arguments are parsed, before any model is loaded, so a
mistake costs a one-line message (exit 2) instead of a traceback after minutes of work.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from pathlib import Path

# Counts and sizes end up in int64 tensors and Python loops; anything above this is a typo.
MAX_COUNT = 2**31 - 1
MAX_SEED = 2**63 - 1


def int_in(low: int, high: int = MAX_COUNT) -> Callable[[str], int]:
    """An argparse type: a whole number in [low, high]."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value > high and high == MAX_COUNT:  # 10**26 is not "below 1": say the bound
            raise argparse.ArgumentTypeError(f"is too large: must be at most {high}, got {value}")
        if not low <= value <= high:
            bounds = f"at least {low}" if high == MAX_COUNT else f"between {low} and {high}"
            raise argparse.ArgumentTypeError(f"must be {bounds}, got {value}")
        return value

    parse.__name__ = "integer"  # argparse names the type in its messages
    return parse


def float_in(
    low: float, high: float = math.inf, *, low_open: bool = False
) -> Callable[[str], float]:
    """An argparse type: a finite number in [low, high] ((low, high] with ``low_open``)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        below = value <= low if low_open else value < low
        if not math.isfinite(value) or below or value > high:
            bracket = "(" if low_open else "["
            raise argparse.ArgumentTypeError(
                f"must be a finite number in {bracket}{low:g}, {high:g}], got {text}"
            )
        return value

    parse.__name__ = "number"
    return parse


def utf8_text(text: str) -> str:
    """An argparse type: text that is valid UTF-8 (argv bytes that are not arrive as
    surrogate escapes, which no tokenizer can encode)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        byte = ord(text[exc.start]) - 0xDC00 if "\udc80" <= text[exc.start] <= "\udcff" else None
        what = f"byte 0x{byte:02x}" if byte is not None else f"U+{ord(text[exc.start]):04X}"
        raise argparse.ArgumentTypeError(
            f"is not valid UTF-8 ({what} at character {exc.start})"
        ) from None
    return text


def token_ids(text: str) -> list[int]:
    """An argparse type: token ids separated by commas or spaces ("1,2,3"), each a whole
    number >= 0 (the model's vocabulary bounds them once it is loaded)."""
    items = text.replace(",", " ").split()
    if not items:
        raise argparse.ArgumentTypeError("give at least one token id, e.g. 1,2,3")
    ids = []
    for position, item in enumerate(items, start=1):
        try:
            value = int(item)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"token id {position} is {item!r}, not a whole number (e.g. 1,2,3)"
            ) from None
        if not 0 <= value <= MAX_COUNT:
            raise argparse.ArgumentTypeError(
                f"token id {position} is {value}; token ids are between 0 and {MAX_COUNT}"
            )
        ids.append(value)
    return ids


def model_dir(text: str) -> str:
    """An argparse type: an existing checkpoint folder, or `random`."""
    if text != "random" and not Path(text).is_dir():
        raise argparse.ArgumentTypeError(
            f"no checkpoint folder {text!r} (give a folder with config.json and "
            "*.safetensors, or `random`)"
        )
    return text


# The names `Engine(model=...)` knows (relayc.engine.checkpoints.named; kept here as text
# so the command line does not import torch to parse its arguments -- a test keeps them equal).
MODEL_NAMES = ("smollm2",)


def model_arg(text: str) -> str:
    """An argparse type: a model name (`smollm2`), `random`, a .gguf file or a checkpoint
    folder."""
    path = Path(text).expanduser()
    if text in (*MODEL_NAMES, "random") or path.is_dir() or path.is_file():
        return text
    names = ", ".join(f"`{n}`" for n in (*MODEL_NAMES, "random"))
    raise argparse.ArgumentTypeError(
        f"no model {text!r}: give {names}, a .gguf file or a checkpoint folder "
        "(config.json + *.safetensors)"
    )


def writable_file(text: str) -> str:
    """An argparse type: a file path whose folder exists and can be written."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a folder; give a file name")
    folder = path.parent
    if not folder.is_dir():
        raise argparse.ArgumentTypeError(f"folder {str(folder)!r} does not exist")
    if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise argparse.ArgumentTypeError(f"cannot write {text!r}: permission denied")
    return text


def torch_device(text: str) -> str:
    """An argparse type: a device this torch can run on (cpu, cuda[:N], mps)."""
    import torch

    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise argparse.ArgumentTypeError(f"unknown device {text!r}; use cpu or cuda[:N]") from None
    if device.type == "cpu":
        return text
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise argparse.ArgumentTypeError(
                f"{text}: CUDA is not available here (torch {torch.__version__}, "
                f"{'built without CUDA' if torch.version.cuda is None else 'no GPU visible'}); "
                "use --device cpu"
            )
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise argparse.ArgumentTypeError(
                f"{text}: only {torch.cuda.device_count()} CUDA device(s) visible"
            )
        return text
    if device.type == "mps" and torch.backends.mps.is_available():
        return text
    raise argparse.ArgumentTypeError(f"device {text!r} is not supported here; use cpu or cuda")
