"""The trained models shipped in the package (``relayc/assets``, see the MODEL_CARDs).

``Engine(model=None)`` loads the shipped byte-level target, and for a speculative
algorithm with a trained drafter (``eagle``, ``eagle_multilayer``, ``standalone``,
``eagle3``, ``dflash``) ``draft_model=None`` then means the shipped drafter for it. ``model="random"``
is the same architecture with seeded random weights (the tests' default: fast, and
no draft model ever agrees with it).

Named models (``Engine(model="smollm2")``) ship drafters too (``NAMED_DRAFTERS``): the
loader marks the model it loads by name (:func:`mark_named_target`), and the drafter
factory looks the head up by that mark (:func:`named_drafter`).
"""

from __future__ import annotations

import json
import weakref
from pathlib import Path

ASSETS_DIR = Path(__file__).resolve().parents[2] / "assets"
DEMO_DIR = ASSETS_DIR / "demo"
RANDOM = "random"  # `Engine(model=RANDOM)`: the tiny default config, random weights
# subdirectories of DEMO_DIR
_DRAFTERS = ("eagle", "eagle_multilayer", "standalone", "eagle3", "dflash")
# {named model: {algorithm: subdirectory of ASSETS_DIR}}
NAMED_DRAFTERS = {"smollm2": {"eagle3": "smollm2/eagle3", "dflash": "smollm2/dflash"}}
_named_targets: weakref.WeakKeyDictionary[object, str] = weakref.WeakKeyDictionary()


def mark_named_target(model: object, name: str) -> None:
    """Remember that ``model`` was loaded as the named model ``name``."""
    _named_targets[model] = name


def named_drafter(model: object, algorithm: str) -> Path | None:
    """The drafter of ``algorithm`` shipped for ``model`` when it was loaded by a name that
    ships one (None otherwise); FileNotFoundError when the install lacks its files."""
    name = _named_targets.get(model)
    subdir = NAMED_DRAFTERS.get(name or "", {}).get(algorithm)
    if subdir is None:
        return None
    directory = ASSETS_DIR / subdir
    if not (directory / "config.json").is_file():
        raise FileNotFoundError(
            f"the `{algorithm}` drafter shipped for {name!r} is missing from {directory}; "
            "reinstall relayc or pass draft_model=DIR"
        )
    return directory


def refuse_untrained_drafter(model: object, algorithm: str) -> None:
    """``ValueError`` when ``model`` was loaded by name and ``algorithm`` would draft for it
    with random weights (no ``draft_model``, none shipped): it accepts next to nothing, and
    silently. Names what ships for the model instead."""
    name = _named_targets.get(model)
    if name is None:
        return
    ships = ", ".join(f"`{a}`" for a in NAMED_DRAFTERS.get(name, {})) or "no drafter"
    raise ValueError(
        f"no `{algorithm}` drafter ships for {name!r} and a random one would draft garbage: "
        f"use an algorithm whose drafter ships ({ships}) or `ngram` (needs none), or pass "
        "a trained one as draft_model=DIR (`--draft-model DIR`)"
    )


def shipped_target() -> Path | None:
    """The shipped target's checkpoint directory, or None in an install without it."""
    target = DEMO_DIR / "target"
    return target if (target / "config.json").is_file() else None


def shipped_drafter(algorithm: str, num_steps: int) -> Path | None:
    """The shipped drafter of ``algorithm`` (None for ``none`` / ``ngram``).

    The MTP drafter has one layer per draft step, so it serves only its own ``num_steps``.
    """
    if algorithm not in _DRAFTERS:
        return None
    directory = DEMO_DIR / algorithm
    if not directory.is_dir():
        raise FileNotFoundError(
            f"the shipped `{algorithm}` drafter is missing from {directory}; reinstall relayc "
            "or pass draft_model=DIR"
        )
    if algorithm == "eagle_multilayer":
        layers = _mtp_layers(directory)
        if layers is not None and layers != num_steps:
            raise ValueError(
                f"the shipped eagle_multilayer drafter has {layers} layers, one per draft step: "
                f"use num_steps={layers}, or pass draft_model=DIR (a drafter trained for "
                f"num_steps={num_steps})"
            )
    return directory


def _mtp_layers(directory: Path) -> int | None:
    path = directory / "config.json"
    if not path.is_file():
        return None
    value = json.loads(path.read_text()).get("num_steps")
    return int(value) if isinstance(value, int) else None


def heldout_prompts() -> list[str]:
    """The held-out prompts of the shipped models (code cut from standard-library files the
    training left out); empty in an install without them."""
    path = DEMO_DIR / "heldout_prompts.json"
    if not path.is_file():
        return []
    return [p["text"] for p in json.loads(path.read_text())["prompts"]]
