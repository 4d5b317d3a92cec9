"""The trained models shipped in the package (``relayc/assets``, see the MODEL_CARDs).

``Engine(model=None)`` loads the shipped byte-level target, and for a speculative
algorithm with a trained drafter ``draft_model=None`` then means the drafter shipped for it
(its folder under ``assets/demo``; each algorithm's module says which: ``relayc.engine.
algorithms``). ``model="random"`` is the same architecture with seeded random weights (the
tests' default: fast, and no draft model ever agrees with it).

Named models (``Engine(model="smollm2")``) ship drafters too (an algorithm's
``named_drafters``): the loader marks the model it loads by name
(:func:`mark_named_target`), and the drafter factory looks the drafter up by that mark
(:func:`named_target`, :func:`named_drafter`).
"""

from __future__ import annotations

import json
import weakref
from pathlib import Path

ASSETS_DIR = Path(__file__).resolve().parents[2] / "assets"
DEMO_DIR = ASSETS_DIR / "demo"
RANDOM = "random"  # `Engine(model=RANDOM)`: the tiny default config, random weights
_named_targets: weakref.WeakKeyDictionary[object, str] = weakref.WeakKeyDictionary()


def mark_named_target(model: object, name: str) -> None:
    """Remember that ``model`` was loaded as the named model ``name``."""
    _named_targets[model] = name


def named_target(model: object) -> str | None:
    """The name ``model`` was loaded by (``"smollm2"``), None for a file or a random model."""
    return _named_targets.get(model)


def named_drafter(algorithm: str, model_name: str, folder: str) -> Path:
    """The drafter of ``algorithm`` shipped for the named model in ``ASSETS_DIR / folder``;
    FileNotFoundError when the install lacks its files."""
    directory = ASSETS_DIR / folder
    if not (directory / "config.json").is_file():
        raise FileNotFoundError(
            f"the `{algorithm}` drafter shipped for {model_name!r} is missing from "
            f"{directory}; reinstall relayc or pass draft_model=DIR"
        )
    return directory


def demo_drafter(algorithm: str, folder: str) -> Path:
    """The drafter of ``algorithm`` shipped for the byte-level demo target in
    ``DEMO_DIR / folder``; FileNotFoundError when the install lacks it."""
    directory = DEMO_DIR / folder
    if not directory.is_dir():
        raise FileNotFoundError(
            f"the shipped `{algorithm}` drafter is missing from {directory}; reinstall relayc "
            "or pass draft_model=DIR"
        )
    return directory


def shipped_target() -> Path | None:
    """The shipped target's checkpoint directory, or None in an install without it."""
    target = DEMO_DIR / "target"
    return target if (target / "config.json").is_file() else None


def heldout_prompts() -> list[str]:
    """The held-out prompts of the shipped models (code cut from standard-library files the
    training left out); empty in an install without them."""
    path = DEMO_DIR / "heldout_prompts.json"
    if not path.is_file():
        return []
    return [p["text"] for p in json.loads(path.read_text())["prompts"]]
