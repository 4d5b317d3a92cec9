"""The one description of a relay field, from the compiler's plan to the generated module.

:class:`RelayField` is plain data (strings, numbers, tuples) so that it lives in the layer
generated code imports, which needs only torch: the compiler's relay plan
(:mod:`relayc.plan`) holds these records, and a generated module instantiates the very
same class in its ``FIELDS`` table (``RelayField("topk_p", "float32", ("topk",), ...)``),
so the record a target reads and the record the runtime allocates from are one class.
The spec's YAML syntax for a field (``relayc.specs.schema.RelayField``, a pydantic model)
is only the parser's view; the plan converts it into this record once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Alloc = Literal["eager", "lazy"]
Owner = Literal["relay", "graph"]
Publish = Literal["stash", "early"]
InitValue = str | bool | int | float


@dataclass(frozen=True)
class HostMirror:
    """Pinned host copies of a field's device rows, each taken when the field is published.

    ``lag`` publishes between a copy and the host read that returns it (0: the read waits
    for the latest publish); ``depth`` copies in a ring; ``generation_check``: each copy
    snapshots the pool's slot generations so a reader tells a reused slot apart.
    """

    lag: int = 0
    depth: int = 1
    generation_check: bool = False

    @property
    def waits(self) -> bool:
        """Whether a host read waits for the latest publish (one copy, lag 0)."""
        return self.lag == 0 and self.depth == 1 and not self.generation_check

    @property
    def text(self) -> str:
        """How `relayc explain` and `relayc graph` say it."""
        if self.waits:
            return "host mirror"
        checked = ", generation-checked" if self.generation_check else ""
        return f"to the host, {self.lag} publishes late (ring {self.depth}{checked})"


@dataclass(frozen=True)
class RelayField:
    """Per-request state carried from one decode iteration to the next, indexed by slot.

    ``shape`` is the row shape in named dims (entries are dim names, whole numbers or
    arithmetic over dims, evaluated by :func:`relayc.runtime.dims.eval_dim`); the buffer
    is ``[req_pool_size, *row]``. ``origin`` is the ``path:line`` of the spec entry that
    defines the field (generated comments and error messages quote it).
    """

    name: str
    dtype: str  # a spec dtype name; `model` is the model's dtype
    shape: tuple[str | int, ...] = ()
    alloc: Alloc = "eager"  # lifetime: with the relay, or on the first stash carrying it
    init: InitValue = "empty"  # `empty`, `zeros` or a fill value
    poison: bool | int | float | None = None  # debug-mode start value (None: NaN / minimum)
    host_mirror: HostMirror | None = None
    owner: Owner = "relay"  # `graph`: a captured graph owns the buffer, the relay adopts it
    publish: Publish = "stash"  # `early`: visible right after the step that writes it
    export: bool = False  # the engine itself reads it
    doc: str = ""
    origin: str = ""

    @property
    def lazy(self) -> bool:
        return self.alloc == "lazy"

    @property
    def early(self) -> bool:
        return self.publish == "early"
