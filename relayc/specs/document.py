"""What loading a spec file produces: the records the checks and the compiler read.

:class:`Parts` (the well-formed entities of one file, as the checks see them),
:class:`Spec` (a validated algorithm) and :class:`Library` (validated shared
definitions). They sit below both :mod:`relayc.specs.loader` and
:mod:`relayc.specs.checks` so that neither has to import the other's caller.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from relayc.specs.errors import SourceLoc
from relayc.specs.schema import (
    Capture,
    Dim,
    Import,
    Input,
    Outputs,
    RelayField,
    Rule,
    SGLangTarget,
    Staging,
    Step,
    VLLMTarget,
)
from relayc.specs.yamlsrc import LocIndex, Path


@dataclass(frozen=True)
class OpsModule:
    """A Python module named under `ops:` (or with `--ops`) that registers user ops."""

    name: str
    loc: SourceLoc
    from_cli: bool = False


@dataclass
class Parts:
    """The well-formed entities of one file, each with its path in the document.

    Built from a fully valid file or, when some entities are broken, from those
    that validate on their own; ``broken`` holds names of entities that did not,
    so references to them do not produce follow-on errors.
    """

    path: str
    index: LocIndex
    algorithm: str | None = None
    library: str | None = None
    description: str = ""
    imports: list[tuple[Path, Import]] = field(default_factory=list)
    ops: list[OpsModule] = field(default_factory=list)
    dims: dict[str, Dim] = field(default_factory=dict)
    rules: list[Rule] = field(default_factory=list)  # each located at its rule's text
    inputs: dict[str, Input] = field(default_factory=dict)
    fields: dict[str, RelayField] = field(default_factory=dict)
    prefill: Step | None = None
    steps: list[tuple[Path, Step]] = field(default_factory=list)
    capture: Capture | None = None
    outputs: Outputs | None = None
    sglang: SGLangTarget | None = None
    vllm: VLLMTarget | None = None
    staging: Staging | None = None
    broken: set[tuple[str, str]] = field(default_factory=set)
    has: set[str] = field(default_factory=set)  # top-level keys present in the file


@dataclass(frozen=True)
class Spec:
    """A validated algorithm spec with its imports resolved.

    ``dims``, ``inputs`` and ``fields`` merge the imported definitions (first,
    in import order) with the file's own, in declaration order: that order is
    the order of everything generated from the spec.
    """

    path: str
    algorithm: str
    algorithm_loc: SourceLoc  # where the `algorithm:` name is, for errors about it
    description: str
    content_hash: str
    dims: dict[str, Dim]
    inputs: dict[str, Input]
    fields: dict[str, RelayField]
    prefill: Step
    steps: tuple[Step, ...]
    capture: Capture
    outputs: Outputs
    origin: dict[str, str]  # relay field -> the file that defines it
    # Modules registering the user ops the steps may name (`ops:` then `--ops`), and the
    # folder they are imported from first: the spec's own, so an `ops.py` beside it works.
    ops: tuple[OpsModule, ...] = ()
    ops_dir: str = ""
    # (step name, "reads" | "writes" | "stash", parameter / output / field) -> where it is
    entry_locs: dict[tuple[str, str, str], SourceLoc] = field(default_factory=dict)
    sglang: SGLangTarget | None = None  # SGLang target settings (a plugin's name)
    vllm: VLLMTarget | None = None  # vLLM target settings (the vLLM method)
    staging: Staging | None = None  # staged inputs (`staging:`); None: refused
    rules: tuple[Rule, ...] = ()  # dims rules (`rules:`), each located at its text

    def locate(self, step: str, section: str, key: str) -> SourceLoc:
        """Where a step's read, write or stash entry is, falling back to the step."""
        loc = self.entry_locs.get((step, section, key))
        if loc is not None:
            return loc
        return next(s.loc for s in (self.prefill, *self.steps) if s.name == step)

    def locate_output(self, phase: str, name: str) -> SourceLoc:
        """Where `outputs.<phase>.<name>` is (``phase``: `prefill` or `decode`)."""
        return self.entry_locs.get(("outputs", phase, name), self.outputs.loc)

    @property
    def relay_fields(self) -> list[str]:
        return list(self.fields)


@dataclass(frozen=True)
class Library:
    """A validated library file: shared dims, inputs and fields."""

    path: str
    name: str
    description: str
    dims: dict[str, Dim]
    inputs: dict[str, Input]
    fields: dict[str, RelayField]
