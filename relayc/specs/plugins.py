"""Installed algorithm packages: the ``relayc.algorithms`` entry point group.

Every algorithm -- relayc's own and a third-party package's alike -- is one object an entry
point names (``eagle = "relayc.engine.algorithms.eagle:ALGORITHM"`` in relayc's
``pyproject.toml``; a plugin's in its own). The object is a
``relayc.engine.algorithms.Algorithm``; this module only finds and loads it, which is why
it sits this low (and imports neither torch nor pydantic): the compiler asks it for the op
declarations a plugin brings (``ops``), the engine and the command line for the rest. A
spec never names code: its ``algorithm:`` name selects one of the installed entry points,
nothing else.

Loading is lazy (one entry point when its name is asked for; all of them only when a
listing or an unknown op asks), cached, and deterministic: relayc's own first, then by
name. A plugin that fails to load, or two distributions registering one name, is an
:class:`AlgorithmPackageError` naming the distribution, raised only to whoever asks for
that name; the other algorithms load as usual.
"""

from __future__ import annotations

import importlib.metadata as metadata
from dataclasses import dataclass
from typing import Any

GROUP = "relayc.algorithms"
OWN_DISTRIBUTION = "relayc"


class AlgorithmPackageError(ValueError):
    """An installed algorithm that cannot be used; the message names its distribution."""


@dataclass(frozen=True)
class Installed:
    """One entry point of the group, not loaded."""

    name: str  # the algorithm's name, as its spec's `algorithm:` writes it
    value: str  # `module:attribute`
    distribution: str  # the distribution (pip package) that registers it

    @property
    def bundled(self) -> bool:
        return self.distribution == OWN_DISTRIBUTION


_installed: dict[str, list[Installed]] | None = None
_loaded: dict[str, Any] = {}
_failed: dict[str, AlgorithmPackageError] = {}


def _distribution(entry_point: metadata.EntryPoint) -> str:
    dist = entry_point.dist
    name = dist.metadata["Name"] if dist is not None else None
    return str(name) if name else "an unknown distribution"


def installed() -> dict[str, list[Installed]]:
    """Every name in the group with what registers it (more than one: a clash), in the
    listing order: relayc's own first, then by name. Reads metadata only, loads nothing."""
    global _installed
    if _installed is None:
        found: dict[str, list[Installed]] = {}
        for ep in metadata.entry_points(group=GROUP):
            entry = Installed(ep.name, ep.value, _distribution(ep))
            entries = found.setdefault(ep.name, [])
            if entry not in entries:  # one distribution seen twice on sys.path
                entries.append(entry)
        order = sorted(found, key=lambda n: (not any(e.bundled for e in found[n]), n))
        _installed = {name: sorted(found[name], key=lambda e: e.distribution) for name in order}
    return _installed


def names() -> list[str]:
    """The installed algorithm names in the listing order (nothing is loaded)."""
    return list(installed())


def load(name: str) -> Any:
    """The object the entry point ``name`` names (loaded once); ``KeyError`` when nothing
    registers ``name``, :class:`AlgorithmPackageError` when it cannot be loaded."""
    if name in _loaded:
        return _loaded[name]
    if name in _failed:
        raise _failed[name]
    entries = installed()[name]
    try:
        if len(entries) > 1:
            raise AlgorithmPackageError(
                f"algorithm `{name}` is registered by "
                + " and by ".join(f"`{e.distribution}` ({e.value})" for e in entries)
                + f": uninstall one, or rename its `{GROUP}` entry point"
            )
        entry = entries[0]
        where = f"`{name}` = {entry.value!r} of distribution `{entry.distribution}`"
        try:
            target = metadata.EntryPoint(name, entry.value, GROUP).load()
        except Exception as exc:  # a plugin's import: whatever it raises is reported
            raise AlgorithmPackageError(
                f"the `{GROUP}` entry point {where} failed to load: "
                f"{type(exc).__name__}: {exc}; fix or uninstall `{entry.distribution}`"
            ) from exc
        if not isinstance(getattr(target, "ops", ()), tuple):
            raise AlgorithmPackageError(
                f"the `{GROUP}` entry point {where} declares `ops` that are not a tuple "
                "(of relayc.nodes.Op)"
            )
    except AlgorithmPackageError as exc:
        _failed[name] = exc
        raise
    _loaded[name] = target
    return target


def loaded_objects() -> list[tuple[str, Any]]:
    """``(name, object)`` of every entry point that loads, in the listing order. One that
    fails to load is left out here: naming its algorithm reports why."""
    objects = []
    for name in installed():
        try:
            objects.append((name, load(name)))
        except AlgorithmPackageError:
            continue
    return objects


def forget() -> None:
    """Read the group afresh on the next call (tests that install a package)."""
    global _installed
    _installed = None
    _loaded.clear()
    _failed.clear()
