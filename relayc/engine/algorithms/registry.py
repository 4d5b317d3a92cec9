"""The algorithms the engine knows: one :class:`Algorithm` record per algorithm, found
through the ``relayc.algorithms`` entry point group (:mod:`relayc.specs.plugins`).

An algorithm is a spec and one module. The module (relayc's own in this folder, a plugin's
in its package) defines ``ALGORITHM = Algorithm(...)``, and its distribution registers it::

    [project.entry-points."relayc.algorithms"]
    suffix = "relayc.engine.algorithms.suffix:ALGORITHM"

The record (the interface; fields are added with defaults, never renamed):

- ``name``: the spec's ``algorithm:`` name; ``spec``: the spec file.
- ``make_drafting(request: DraftingRequest) -> Drafting``: the drafter and the decode
  step's shape (``decode_width`` KV slots per request, scratch slots included;
  ``max_tokens_per_step``; ``bonus_slots``; the dims it settled; ``tracks_history`` for a
  drafter fed each request's tokens on the host). None: no engine drafter (SGLang only);
  ``no_engine_drafter`` then says what running it here would take.
- ``impls()``: the engine's implementations of the ops that drive its drafter
  (``ctx.drafter``), by op name; ``ops``: op declarations the algorithm brings beyond
  the built-in ones (a plugin's; the compiler finds them through the entry point).
- ``relay_module``: its generated module (default ``relayc.generated.<name>``).
- ``shipped_drafter(num_steps)``: the toy model's trained drafter, if one ships;
  ``named_drafters``: ``{named model: drafter folder}`` it ships for real models;
  ``drafter_weights``: whether it drafts with weights (False: runs on any model).
- ``default_dims``: ``(num_steps, num_draft_tokens)`` when the caller gives none (None:
  the drafter decides); ``dynamic_draft_length``: takes ``draft_confidence``.
- ``demo``: the sizes ``relayc demo`` and ``bench/peers.py`` run it with, on the toy
  model and on real ones; ``rank``: where listings put it (the baseline first).

Modules stay cheap to import (a listing loads every record, ``relayc --help`` included):
they import the drafters and op implementations inside ``make_drafting`` / ``impls``.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from relayc.engine.checkpoints.shipped import named_drafter, named_target
from relayc.specs import plugins

if TYPE_CHECKING:
    from relayc.engine.draft.speculative import Drafting
    from relayc.engine.model.llama import LlamaForCausalLM
    from relayc.nodes.registry import Op

SPECS_DIR = Path(__file__).resolve().parents[2] / "specs"
# The Engine arguments a demo or benchmark run sets (num_steps, topk, num_draft_tokens,
# draft_confidence, draft_quantization)
Sizes = Mapping[str, Any]


@dataclass(frozen=True)
class DraftingRequest:
    """What the engine asks an algorithm's drafting factory for (the caller's choices)."""

    model: LlamaForCausalLM
    req_pool_size: int
    num_steps: int | None
    topk: int
    num_draft_tokens: int | None
    draft_model: str | Path | None  # a trained drafter's folder (None: shipped or random)
    seed: int

    def sizes(self, name: str) -> tuple[int, int, int]:
        """``(num_steps, topk, num_draft_tokens)``, for an algorithm whose dims the caller
        must give (all but those whose drafter settles them)."""
        if self.num_steps is None or self.num_draft_tokens is None:
            raise ValueError(f"`{name}` needs `num_steps` and `num_draft_tokens`")
        return self.num_steps, self.topk, self.num_draft_tokens


@dataclass(frozen=True)
class DemoRun:
    """One configuration ``relayc demo`` / ``bench/peers.py`` runs an algorithm with."""

    sizes: Sizes = field(default_factory=dict)
    label: str = ""  # what tells it from the algorithm's other runs (`topk 4`, `block 4`)

    def title(self, name: str) -> str:
        """The demo table's row label: ``eagle (topk 4)``."""
        return f"{name} ({self.label})" if self.label else name


@dataclass(frozen=True)
class Demo:
    """How the demo and the benchmark run an algorithm: on the byte-level toy model and on
    real models (none: no drafter ships for them). ``bench/peers.py`` runs the demo's runs
    and its own ``bench_*`` ones besides (sweeps the demo's table would drown in)."""

    toy: tuple[DemoRun, ...] = ()
    real: tuple[DemoRun, ...] = ()
    bench_toy: tuple[DemoRun, ...] = ()
    bench_real: tuple[DemoRun, ...] = ()


def _no_impls() -> Mapping[str, Callable[..., Any]]:
    return {}


def _no_shipped_drafter(num_steps: int) -> Path | None:
    return None


@dataclass(frozen=True)
class Algorithm:
    """One algorithm's engine side; see the module docstring for each field's contract."""

    name: str  # the spec's `algorithm:` name, and the entry point's
    spec: Path  # its spec file
    summary: str = ""  # one line for `relayc generate --help`
    # the drafter and the decode step's shape; None: no engine drafter (SGLang only)
    make_drafting: Callable[[DraftingRequest], Drafting] | None = None
    no_engine_drafter: str = ""  # with make_drafting None: what the engine would need
    # the engine's implementations of the ops that drive its drafter, by op name
    impls: Callable[[], Mapping[str, Callable[..., Any]]] = _no_impls
    ops: tuple[Op, ...] = ()  # declarations of ops its spec names that are not built in
    relay_module: str = ""  # its generated module; "" = relayc.generated.<name>
    drafter_weights: bool = True  # False: drafts without weights, so runs on any model
    # the toy model's trained drafter for these num_steps (None: none ships)
    shipped_drafter: Callable[[int], Path | None] = _no_shipped_drafter
    named_drafters: Mapping[str, str] = field(default_factory=dict)  # model -> assets folder
    # (num_steps, num_draft_tokens) when the caller gives none; None: the drafter settles it
    default_dims: tuple[int | None, int | None] = (3, 4)
    dynamic_draft_length: bool = False  # takes `draft_confidence`
    demo: Demo = Demo()  # what `relayc demo` and bench/peers.py run
    rank: int = 100  # listing order (then the name): the baseline 0, relayc's own 10..60

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise ValueError(f"algorithm name {self.name!r} is not an identifier")
        if self.make_drafting is None and not self.no_engine_drafter:
            raise ValueError(
                f"algorithm `{self.name}` has no `make_drafting`: say in `no_engine_drafter` "
                "what running it in the engine would take"
            )

    @property
    def module_name(self) -> str:
        """The importable name of its generated relay module."""
        return self.relay_module or f"relayc.generated.{self.name}"

    @property
    def runs_in_engine(self) -> bool:
        return self.make_drafting is not None


class UnknownAlgorithmError(ValueError):
    """A name no installed algorithm has, or one the engine cannot run."""


def _loaded(name: str) -> Algorithm:
    target = plugins.load(name)
    entry = plugins.installed()[name][0]
    where = (
        f"the `{plugins.GROUP}` entry point `{name}` = {entry.value!r} of `{entry.distribution}`"
    )
    if not isinstance(target, Algorithm) or target.name != name:
        what = (
            f"an Algorithm named `{target.name}`"
            if isinstance(target, Algorithm)
            else type(target).__name__
        )
        raise plugins.AlgorithmPackageError(
            f"{where} names {what}; it must name a relayc.engine.algorithms.Algorithm "
            f"whose `name` is `{name}`"
        )
    if not isinstance(target.spec, Path) or not target.spec.is_file():
        raise plugins.AlgorithmPackageError(
            f"{where} names spec {target.spec}, which is not a file: ship the spec in the "
            "package and point `spec` at it (`Path(__file__).with_name(...)`)"
        )
    if target.ops:
        # Imported here, not at the top: listing algorithms (the command line's help) needs
        # no torch, which relayc.nodes imports.
        from relayc.nodes.registry import Op

        bad = [type(op).__qualname__ for op in target.ops if not isinstance(op, Op)]
        if bad:
            raise plugins.AlgorithmPackageError(
                f"{where} declares `ops` holding {', '.join(bad)}: declare each op as a "
                "relayc.nodes.Op"
            )
    return target


def algorithms() -> list[Algorithm]:
    """Every installed algorithm that loads, in the listing order (``rank``, then name)."""
    found = []
    for name in plugins.names():
        try:
            found.append(_loaded(name))
        except plugins.AlgorithmPackageError:
            continue  # reported to whoever names it (lookup); the others still run
    return sorted(found, key=lambda a: (a.rank, a.name))


def engine_algorithms() -> list[Algorithm]:
    """The installed algorithms the reference engine runs (those with a drafter here)."""
    return [a for a in algorithms() if a.runs_in_engine]


def engine_names() -> tuple[str, ...]:
    return tuple(a.name for a in engine_algorithms())


def lookup(name: str, *, engine: bool = False) -> Algorithm:
    """The installed algorithm ``name``; with ``engine``, one the engine can run.

    Raises :class:`UnknownAlgorithmError` (unknown, with "did you mean"; or no engine
    drafter, saying what it would take) or ``AlgorithmPackageError`` (its package broke).
    """
    if not isinstance(name, str) or name not in plugins.installed():
        known = list(engine_names()) if engine else [a.name for a in algorithms()]
        close = difflib.get_close_matches(str(name), known, n=1)
        hint = f"; did you mean `{close[0]}`?" if close else ""
        if not plugins.installed():
            hint += (
                "; no algorithm is registered at all: reinstall relayc (`pip install -e .` "
                "registers its `relayc.algorithms` entry points)"
            )
        elif (
            isinstance(name, str) and name.isidentifier() and (SPECS_DIR / f"{name}.yaml").is_file()
        ):
            hint += (
                f"; relayc/specs/{name}.yaml exists but no entry point registers it: add it to "
                "pyproject.toml's `relayc.algorithms` and reinstall (`pip install -e .`)"
            )
        raise UnknownAlgorithmError(f"unknown algorithm `{name}` (known: {', '.join(known)}){hint}")
    algorithm = _loaded(name)
    if engine and not algorithm.runs_in_engine:
        raise UnknownAlgorithmError(
            f"the reference engine cannot run `{name}` yet: {_spec_text(algorithm)} needs "
            f"{algorithm.no_engine_drafter}, which the engine does not have; compile the spec "
            "for SGLang (`relayc compile --target sglang`), or pick one of "
            + ", ".join(engine_names())
        )
    return algorithm


def _spec_text(algorithm: Algorithm) -> str:
    try:
        return str(algorithm.spec.relative_to(SPECS_DIR.parent.parent))
    except ValueError:
        return str(algorithm.spec)


def drafter_of() -> dict[str, str]:
    """op name -> the algorithm whose drafter the engine's implementation drives: what
    ``check_pairing`` reads to refuse a module compiled for another algorithm."""
    owners: dict[str, str] = {}
    for algorithm in engine_algorithms():
        for op_name in algorithm.impls():
            owners.setdefault(op_name, algorithm.name)
    return owners


def drafting_implementations() -> dict[str, Callable[..., Any]]:
    """Every installed algorithm's drafter-driving op implementations, by op name (the
    first in the listing order wins a name two of them implement)."""
    impls: dict[str, Callable[..., Any]] = {}
    for algorithm in engine_algorithms():
        for op_name, fn in algorithm.impls().items():
            impls.setdefault(op_name, fn)
    return impls


def shipping_for(model_name: str) -> tuple[str, ...]:
    """The algorithms whose drafter ships for the named model, in the listing order."""
    return tuple(a.name for a in engine_algorithms() if model_name in a.named_drafters)


def named_models() -> tuple[str, ...]:
    """The named models some algorithm ships a drafter for, sorted."""
    return tuple(sorted({m for a in engine_algorithms() for m in a.named_drafters}))


def toy_drafters() -> tuple[str, ...]:
    """The algorithms whose drafter ships with the byte-level demo model, in this install."""
    shipped = []
    for algorithm in engine_algorithms():
        if algorithm.shipped_drafter is _no_shipped_drafter:
            continue
        steps = algorithm.default_dims[0]
        try:
            algorithm.shipped_drafter(3 if steps is None else steps)
        except FileNotFoundError:
            continue  # an install without it does not offer it
        except ValueError:
            pass  # it ships, for other dims than these
        shipped.append(algorithm.name)
    return tuple(shipped)


def drafter_free() -> tuple[str, ...]:
    """The algorithms that draft without weights: they run on any model."""
    return tuple(a.name for a in engine_algorithms() if not a.drafter_weights)


def trained_drafter(algorithm: Algorithm, request: DraftingRequest) -> Path | None:
    """The trained drafter ``algorithm`` runs with: ``draft_model`` if given, else the one it
    ships for the named model, else None (random weights, which the factory draws) -- but
    for a model loaded by name, random weights would draft garbage, silently, so that is
    refused, naming what ships for the model instead."""
    if request.draft_model is not None:
        return (
            request.draft_model
            if isinstance(request.draft_model, Path)
            else Path(request.draft_model)
        )
    model_name = named_target(request.model)
    if model_name is None:
        return None
    folder = algorithm.named_drafters.get(model_name)
    if folder is not None:
        return named_drafter(algorithm.name, model_name, folder)
    ships = [f"`{name}`" for name in shipping_for(model_name)] or ["no drafter"]
    free = [f"`{name}`" for name in drafter_free()]
    raise ValueError(
        f"no `{algorithm.name}` drafter ships for {model_name!r} and a random one would draft "
        f"garbage: use an algorithm whose drafter ships ({', '.join(ships)}) or one that "
        f"needs none ({', '.join(free)}), or pass a trained one as draft_model=DIR "
        "(`--draft-model DIR`)"
    )


def shipped_drafter(name: str, num_steps: int) -> Path | None:
    """The toy model's shipped drafter of algorithm ``name`` (None: it ships none)."""
    return lookup(name, engine=True).shipped_drafter(num_steps)


def default_dims(name: str, num_steps: int | None, num_draft_tokens: int | None) -> tuple[Any, Any]:
    """``(num_steps, num_draft_tokens)`` with the algorithm's defaults filled in where the
    caller left them None (a default of None: its drafter decides when it loads)."""
    steps, tokens = lookup(name, engine=True).default_dims
    return (
        steps if num_steps is None else num_steps,
        tokens if num_draft_tokens is None else num_draft_tokens,
    )
