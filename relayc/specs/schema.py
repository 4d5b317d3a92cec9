"""The spec language: pydantic models of one YAML spec file.

A file is either an *algorithm* spec (``algorithm: eagle``: dims, relay fields,
engine inputs, the prefill step and the decode steps of one algorithm) or a
*library* (``library: common``: dims, inputs and fields that several algorithms
import, so a shared relay field is defined once).

Every model is frozen and rejects unknown keys; every field carries a
description, which feeds ``relayc schema`` (the JSON Schema editors use).
These models check the *shape* of a file; cross-references (dims named by a
shape, values a step reads, imports) are checked by :mod:`relayc.specs.checks`.
"""

from __future__ import annotations

import keyword
import math
import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    PrivateAttr,
    WithJsonSchema,
)
from pydantic_core import PydanticCustomError, PydanticKnownError

from relayc.specs.errors import SourceLoc

DTYPES: tuple[str, ...] = ("int32", "int64", "float32", "bfloat16", "float16", "bool", "model")
INTEGER_DTYPES = frozenset({"int32", "int64"})
FLOAT_DTYPES = frozenset({"float32", "bfloat16", "float16", "model"})
DType = Literal["int32", "int64", "float32", "bfloat16", "float16", "bool", "model"]

IDENTIFIER_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
REF_KINDS = ("relay", "input")
# Largest literal size, dim default or batch size: sizes index int32 tensors in kernels,
# and a larger one is a typo that would otherwise overflow far from the spec.
MAX_SIZE = 2**31 - 1
# Names become attributes, and the algorithm's name a file name (<= 255 bytes on disk).
MAX_NAME_LENGTH = 64
# Deepest host ring: each copy is a pinned [req_pool_size, *row] tensor.
MAX_HOST_RING = 16
# Largest finite value per float dtype; `model` may be float16, so it gets float16's.
_FLOAT_MAX = {
    "float32": 3.4028234663852886e38,
    "bfloat16": 3.3895313892515355e38,
    "float16": 65504.0,
}
_INT_RANGES = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}


def _identifier(value: Any) -> Any:
    if not isinstance(value, str):
        return value  # the str type check reports it
    if len(value) > MAX_NAME_LENGTH:
        raise PydanticCustomError(
            "relayc_identifier",
            "a name of {length} characters is too long (at most {limit}: names become "
            "attributes and file names in generated code)",
            {"length": len(value), "limit": MAX_NAME_LENGTH},
        )
    if not IDENTIFIER_RE.match(value) or keyword.iskeyword(value):
        raise PydanticCustomError(
            "relayc_identifier",
            "`{value}` is not a valid name (use letters, digits and `_`, not starting with a "
            "digit, and not a Python keyword: names become attributes in generated code)",
            {"value": value},
        )
    return value


def _ref(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    head, dot, tail = value.partition(".")
    if not dot or not IDENTIFIER_RE.match(head) or not IDENTIFIER_RE.match(tail):
        raise PydanticCustomError(
            "relayc_ref",
            "`{value}` is not a value reference (write `relay.<field>` for a relay field "
            "resolved at the start of the iteration, `input.<name>` for an engine input, or "
            "`<step>.<output>` for the output of an earlier step)",
            {"value": value},
        )
    return value


def _module_name(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    parts = value.split(".")
    if not all(IDENTIFIER_RE.match(p) and not keyword.iskeyword(p) for p in parts):
        raise PydanticCustomError(
            "relayc_module",
            "`{value}` is not a Python module name (dotted names such as `mypkg.relay_ops`; "
            "a module beside the spec is named after its file, `ops` for `ops.py`)",
            {"value": value},
        )
    return value


@dataclass(frozen=True)
class Ref:
    """A parsed value reference: `relay.<field>`, `input.<name>` or `<step>.<output>`.

    Parsed once when the spec is loaded; later stages read ``source`` and ``name``
    instead of splitting the text again.
    """

    source: str  # `relay`, `input` or a step name
    name: str  # the field, input or step output

    @property
    def kind(self) -> str:
        """`relay`, `input` or `step`."""
        return self.source if self.source in REF_KINDS else "step"

    def __str__(self) -> str:
        return f"{self.source}.{self.name}"


def _parse_value_ref(value: Any) -> Ref:
    if isinstance(value, Ref):
        return value
    if not isinstance(value, str):
        raise PydanticKnownError("string_type")
    _ref(value)
    source, _, name = value.partition(".")
    return Ref(source, name)


def _parse_output_ref(value: Any) -> Ref:
    if isinstance(value, Ref):
        return value
    if not isinstance(value, str):
        raise PydanticKnownError("string_type")
    source, dot, name = value.partition(".")
    if not dot or not IDENTIFIER_RE.match(source) or not IDENTIFIER_RE.match(name):
        raise PydanticCustomError(
            "relayc_output_ref",
            "`{value}` is not a step output (write `<step>.<output>`, e.g. `accept.bonus_tokens`)",
            {"value": value},
        )
    return Ref(source, name)


_REF_SCHEMA = {"type": "string", "pattern": r"^[A-Za-z_][A-Za-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*$"}


def _not_bool(value: Any) -> Any:
    if isinstance(value, bool):  # Literal[1] would take `true`, which equals 1
        raise PydanticCustomError(
            "relayc_not_bool", "expected a number, got `{value}`", {"value": str(value).lower()}
        )
    return value


def _dim_entry(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise PydanticCustomError(
            "relayc_dim_entry",
            "shape entries are dim names or positive integers, got {value!r}",
            {"value": value},
        )
    if isinstance(value, int) and value <= 0:
        raise PydanticCustomError(
            "relayc_dim_entry",
            "a literal size in a shape must be positive, got {value}",
            {"value": value},
        )
    if isinstance(value, int) and value > MAX_SIZE:
        raise PydanticCustomError(
            "relayc_dim_entry",
            "a literal size of {value} is too large (at most {limit}: 2**31 - 1)",
            {"value": value, "limit": MAX_SIZE},
        )
    return _identifier(value) if isinstance(value, str) else value


def _init_policy(value: Any) -> Any:
    if value in ("empty", "zeros"):
        return value
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return value
    raise PydanticCustomError(
        "relayc_init",
        "`init` must be `empty`, `zeros` or a number to fill with, got {value!r}",
        {"value": value},
    )


Identifier = Annotated[str, BeforeValidator(_identifier)]
ModuleName = Annotated[str, BeforeValidator(_module_name)]

# Both parse to a `Ref` once, at load time; YAML and the JSON Schema see the text.
ValueRef = Annotated[
    Ref, PlainValidator(_parse_value_ref), PlainSerializer(str), WithJsonSchema(_REF_SCHEMA)
]
OutputRef = Annotated[
    Ref, PlainValidator(_parse_output_ref), PlainSerializer(str), WithJsonSchema(_REF_SCHEMA)
]
DimEntry = Annotated[str | int, BeforeValidator(_dim_entry)]
InitPolicy = Annotated[
    Literal["empty", "zeros"] | bool | int | float, BeforeValidator(_init_policy)
]


class SpecModel(BaseModel):
    """Base of every spec entity: frozen, unknown keys rejected, a source location."""

    # Strict: YAML already gives typed values, so `default: true` or `default: "16"` is a
    # mistake to report, not a value to coerce into 1 or 16.
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)
    _loc: SourceLoc | None = PrivateAttr(default=None)

    @property
    def loc(self) -> SourceLoc:
        if self._loc is None:
            raise RuntimeError(f"{type(self).__name__} was built without a source location")
        return self._loc


class Dim(SpecModel):
    """A symbolic size bound at run time."""

    default: int | None = Field(
        default=None,
        gt=0,
        le=MAX_SIZE,
        description="Value used when the engine does not bind this dim.",
    )
    supplied_by: str | None = Field(
        default=None,
        description="Where the engine takes the value from (e.g. `model hidden size`), for "
        "dims with no sensible default.",
    )
    doc: str = Field(default="", description="What the dim measures.")


class Input(SpecModel):
    """A per-iteration value the engine provides (e.g. `seq_lens`, `req_pool_indices`)."""

    dtype: DType = Field(description="Element type.")
    shape: list[DimEntry] = Field(
        default_factory=list,
        description="Per-request row shape in dims (`[]` for one value per request).",
    )
    device: Literal["device", "host"] = Field(
        default="device", description="Where the engine provides it: on the device or the host."
    )
    doc: str = Field(default="", description="What the input holds.")


class HostMirror(SpecModel):
    """A relay field read on the host: pinned host copies of its device rows, each taken
    when the field is published, read `lag` publishes late."""

    lag: int = Field(
        ge=0,
        le=MAX_HOST_RING,
        description="Publishes between a copy and the host read that returns it: `0` waits "
        "for the latest publish (SGLang's `new_seq_lens`, the same as `host_mirror: true`); "
        "`2` returns the copy two publishes old and never waits (DSPARK's confidence).",
    )
    ring: int | None = Field(
        default=None,
        ge=1,
        le=MAX_HOST_RING,
        description="Pinned host copies kept in a ring, each filled on the copy stream behind "
        "the publish event; more than `lag` (default `lag + 1`).",
    )
    generation_check: bool = Field(
        default=False,
        description="Snapshot the request pool's slot generations (`req_generation`) with "
        "each copy, so a reader tells a reused slot from the request that wrote the row.",
    )

    @property
    def depth(self) -> int:
        """Copies in the ring (`ring`, or `lag + 1` when not given)."""
        return self.lag + 1 if self.ring is None else self.ring

    @property
    def text(self) -> str:
        """How `relayc explain` and `relayc graph` say it: `host mirror` (lag 0, one copy),
        else `to the host, 2 publishes late (ring 3, generation-checked)`."""
        if self.lag == 0 and self.depth == 1 and not self.generation_check:
            return "host mirror"
        checked = ", generation-checked" if self.generation_check else ""
        return f"to the host, {self.lag} publishes late (ring {self.depth}{checked})"


def _host_mirror(value: Any) -> Any:
    if value is True:
        return HostMirror(lag=0)
    if value is False or value is None:
        return None
    if isinstance(value, dict | HostMirror):
        return value
    raise PydanticCustomError(
        "relayc_host_mirror",
        "must be `true` or `false`, or a mapping, got {value} (e.g. `{example}`: a ring of 3 "
        "host copies read 2 publishes late)",
        {"value": repr(value), "example": "{lag: 2, ring: 3, generation_check: true}"},
    )


# `true` is the lag-0 mirror; YAML and the JSON Schema see a bool or a mapping.
HostMirrorSetting = Annotated[
    HostMirror | None,
    BeforeValidator(_host_mirror, json_schema_input_type=bool | HostMirror),
]


class RelayField(SpecModel):
    """Per-request state carried from one decode iteration to the next."""

    dtype: DType = Field(description="Element type; `model` is the model's dtype.")
    shape: list[DimEntry] = Field(
        default_factory=list,
        description="Per-row shape in dims: `[]`, `[topk]`, `[num_steps, topk]`, `[hidden]`.",
    )
    init: InitPolicy = Field(
        default="empty",
        description="Initial buffer contents: `empty` (uninitialised), `zeros`, or a fill value.",
    )
    poison: bool | int | float | None = Field(
        default=None,
        description="Value the buffer starts with in debug mode, so a read-before-write is "
        "caught. Default: NaN for floats, the dtype's minimum for integers.",
    )
    alloc: Literal["eager", "lazy"] = Field(
        default="eager",
        description="`eager`: allocated with the FutureMap; `lazy`: on the first stash that "
        "carries the field.",
    )
    host_mirror: HostMirrorSetting = Field(
        default=None,
        description="Relay the field to the host too: `true` keeps one pinned host copy, "
        "filled after the publish event that a host read waits for (SGLang's `new_seq_lens`); "
        "`{lag: L, ring: R, generation_check: G}` keeps a ring of R copies and reads the one "
        "L publishes old without waiting, with the pool's slot generations if G (DSPARK's "
        "confidence).",
    )
    owner: Literal["relay", "graph"] = Field(
        default="relay",
        description="Who owns the field's buffer: `relay` allocates it; `graph`: a graph "
        "captured before the relay exists owns it and scatters the field into it, the relay "
        "adopts it when the engine offers it (SGLang's `FutureRelayBuffers` / "
        "`offer_future_relay_buffers`), and a publish or stash of the very tensor the graph "
        "already scattered skips its own write (DSPARK's verify graph).",
    )
    publish: Literal["stash", "early"] = Field(
        default="stash",
        description="Which event makes the field visible: `stash` at the end of the iteration, "
        "or `early` right after the step that writes it (SGLang publishes `new_seq_lens` at the "
        "end of verify, before draft extend).",
    )
    export: bool = Field(
        default=False,
        description="The engine itself reads the field (so stashing it without a decode step "
        "reading it is not a dead relay field).",
    )
    doc: str = Field(min_length=1, description="What the field is for.")


class Step(SpecModel):
    """One step of a decode iteration (or the prefill step): runs a node op."""

    name: Identifier = Field(
        description="Unique step name; outputs are referenced as `<name>.<output>`."
    )
    op: Identifier = Field(
        description="The node op the step runs; ops are registered in `relayc/nodes/`."
    )
    placement: Literal["device", "host"] = Field(
        default="device",
        description="`device`: may run inside the captured graph; `host`: runs on the host "
        "before the graph (e.g. n-gram drafting).",
    )
    reads: dict[Identifier, ValueRef] = Field(
        default_factory=dict,
        description="Op parameter -> value: `relay.<field>`, `input.<name>` or `<step>.<output>`.",
    )
    writes: list[Identifier] = Field(
        default_factory=list, description="The op outputs this step produces."
    )
    stash: dict[Identifier, Identifier] = Field(
        default_factory=dict,
        description="Relay field -> output of this step, written to the relay for the next "
        "iteration.",
    )
    doc: str = Field(default="", description="What the step does.")


class Capture(SpecModel):
    """CUDA-graph capture settings for the device part of the decode step."""

    batch_sizes: list[Annotated[int, Field(gt=0, le=MAX_SIZE)]] = Field(
        description="Batch-size buckets captured as graphs, ascending."
    )
    max_batch_size: int = Field(gt=0, le=MAX_SIZE, description="Largest batch the engine runs.")


class Outputs(SpecModel):
    """What the engine reads back after each step: generated as the dataclasses
    `PrefillOutputs` and `DecodeOutputs` that the generated steps return."""

    prefill: dict[Identifier, OutputRef] = Field(
        description="Name -> `prefill.<output>`: the `PrefillOutputs` fields. The engine "
        "needs `next_tokens` (the first sampled token of each request)."
    )
    decode: dict[Identifier, OutputRef] = Field(
        description="Name -> `<step>.<output>`: the `DecodeOutputs` fields. The engine needs "
        "`next_tokens` (the last new token of each request) and, for algorithms that emit "
        "several tokens per step, both `tokens` (`[bs, K]`, left-aligned) and `counts` "
        "(`[bs]`, valid entries of `tokens`). Other names are exported for the user."
    )


class Import(SpecModel):
    """Shared definitions taken from a library file."""

    file: str = Field(min_length=1, description="Library file, relative to this file.")
    fields: list[Identifier] = Field(
        default_factory=list,
        description="The library's relay fields this algorithm relays (dims and inputs of the "
        "library are all visible).",
    )


class Staging(SpecModel):
    """Staged inputs: a request may enter a decode iteration carrying nothing but its relay
    slot (SGLang's HiSparse staging, `make_staged_spec_input`), the iteration's resolve
    filling its draft input from what the relay holds."""

    capture_hidden: Literal["last", "none"] = Field(
        description="Whether the staged request's target forward captures the target's "
        "hidden state at the last position (`last`: EAGLE's draft extend reads it; `none`: a "
        "drafter of its own, as STANDALONE).",
    )
    doc: str = Field(default="", description="Why requests of this algorithm are staged.")


def staging_text(staging: Staging) -> str:
    """How `relayc explain` says a `staging:` section."""
    captured = (
        "capturing the target's last hidden state"
        if staging.capture_hidden == "last"
        else "capturing no target hidden state"
    )
    return f"a request may enter decode with only its relay slot ({captured})"


# A name SGLang spells in upper case: a `SpeculativeAlgorithm` member or a plugin's.
SGLangName = Annotated[str, Field(pattern=r"^[A-Z][A-Z0-9_]*$")]


class SGLangTarget(SpecModel):
    """How the SGLang target (`relayc compile --target sglang`) serves this algorithm."""

    plugin: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z][A-Za-z0-9_]*$",
        description="The name the algorithm is registered under with SGLang's plugin registry "
        "(`SpeculativeAlgorithm.register(NAME)` / `spec_registry.register_algorithm`); the "
        "generated FutureMap relays this spec's fields for it. Not one of SGLang's built-in "
        "algorithm names. Absent: one of SGLang's own algorithms.",
    )
    hooks: dict[Literal["confidence"], Identifier] = Field(
        default_factory=dict,
        description="The relay field each of SGLang's fixed-name call sites reaches: "
        "`confidence` is the field `publish(..., confidence=)` feeds and "
        "`resolve_confidence_cpu` reads (a `host_mirror: {lag: ...}` field; default: the "
        "field named `confidence`).",
    )
    members: list[SGLangName] = Field(
        default_factory=list,
        description="SGLang's own `SpeculativeAlgorithm` members this spec relays for (`EAGLE`, "
        "`FROZEN_KV_MTP`, ...): the generated `FutureMap` builds this spec's class for them. A "
        "member two specs list goes to the one whose `when:` flag is set, else to the other.",
    )
    when: Identifier | None = Field(
        default=None,
        description="A flag of SGLang's speculative config (`get_spec()`, e.g. "
        "`enable_multi_layer_eagle`) under which this spec relays its `members`; absent: always.",
    )
    fallback: list[SGLangName] = Field(
        default_factory=list,
        description="Members this spec relays only in a module compiled without a spec listing "
        "them in `members` (SGLang relays EAGLE3 with EAGLE's buffers: eagle.yaml falls back "
        "for it).",
    )


def _rule_entry(value: Any) -> Any:
    # A bare string is the rule itself; the mapping form adds the message.
    return {"rule": value} if isinstance(value, str) else value


class Rule(SpecModel):
    """A condition between dims that every binding must meet (`topk == 1`), checked when the
    spec is compiled (with the dims' defaults) and when an engine binds the dims."""

    rule: str = Field(
        min_length=1,
        description="The condition: dim names and integers with `+ - * //` and parentheses, "
        "compared by `== != < <= > >=`, joined by `and` (e.g. `num_draft_tokens == "
        "num_steps + 1`). Parsed as data, never run as code.",
    )
    message: str = Field(
        default="",
        description="Why the rule holds and how to meet it, shown when a binding breaks it.",
    )


RuleEntry = Annotated[Rule, BeforeValidator(_rule_entry, json_schema_input_type=str | Rule)]


VLLMHook = Literal["last_sampled_tokens", "num_computed_tokens", "draft_logits", "confidence"]


class VLLMTarget(SpecModel):
    """How the vLLM target (`relayc compile --target vllm`) serves this algorithm."""

    method: Literal["eagle", "eagle3", "mtp", "dflash", "dspark"] | None = Field(
        default=None,
        description="vLLM's `speculative_config.method` this algorithm runs as under Model "
        "Runner V2 (relayc's `eagle_multilayer` is vLLM's `mtp`). Absent: no speculation "
        "(the state of plain decoding, no `draft_tokens`).",
    )
    hooks: dict[VLLMHook, Identifier] = Field(
        default_factory=dict,
        description="The relay field each of vLLM's per-request state tensors holds: "
        "`last_sampled_tokens` (default: `bonus_tokens`), `num_computed_tokens` (default: "
        "`new_seq_lens`, when relayed), `draft_logits`, the draft distribution probabilistic "
        "rejection sampling reads (default: `draft_probs`, when relayed) and `confidence`, "
        "the adaptive-verification confidence relay (default: the field named `confidence`, "
        "when relayed).",
    )


class SpecFile(SpecModel):
    """One spec file: an algorithm (`algorithm:`) or a shared library (`library:`)."""

    version: Annotated[Literal[1], BeforeValidator(_not_bool)] = Field(
        default=1, description="Spec format version."
    )
    algorithm: Identifier | None = Field(
        default=None, description="Algorithm name; the generated module is named after it."
    )
    library: Identifier | None = Field(
        default=None, description="Library name, for files that only hold shared definitions."
    )
    description: str = Field(default="", description="What this file describes.")
    imports: list[Import] = Field(default_factory=list, description="Libraries imported.")
    ops: list[ModuleName] = Field(
        default_factory=list,
        description="Python modules that register user ops with `relayc.nodes.register`, "
        "imported before the steps are checked (the spec's folder is importable, so `ops` "
        "names an `ops.py` beside the spec). Importing runs the module's code: list only "
        "modules you trust.",
    )
    dims: dict[Identifier, Dim] = Field(default_factory=dict, description="Symbolic sizes.")
    rules: list[RuleEntry] = Field(
        default_factory=list,
        description="Conditions between dims (`topk == 1`, `num_draft_tokens == num_steps + 1`): "
        "a rule as a string, or `{rule: ..., message: ...}` with why it holds.",
    )
    inputs: dict[Identifier, Input] = Field(
        default_factory=dict, description="Values the engine provides each iteration."
    )
    fields: dict[Identifier, RelayField] = Field(
        default_factory=dict, description="Relay fields, per request-pool slot."
    )
    prefill: Step | None = Field(
        default=None, description="The step that seeds the relay for a new request."
    )
    steps: list[Step] = Field(
        default_factory=list, description="The ordered steps of one decode iteration."
    )
    capture: Capture | None = Field(default=None, description="Graph capture settings.")
    outputs: Outputs | None = Field(
        default=None,
        description="What the engine reads after the prefill and after each decode iteration.",
    )
    staging: Staging | None = Field(
        default=None,
        description="Staged inputs: a request may enter decode with only its relay slot, its "
        "draft input filled from the relay (HiSparse staging); absent, staging is refused.",
    )
    sglang: SGLangTarget | None = Field(
        default=None,
        description="SGLang target settings: the SGLang algorithms this spec relays for "
        "(`members`, or a plugin's registered name) and the fields SGLang's hooks reach.",
    )
    vllm: VLLMTarget | None = Field(
        default=None,
        description="vLLM target settings: the vLLM method the algorithm runs as.",
    )


def fill_fits_dtype(value: bool | int | float, dtype: str) -> bool:
    """Whether a fill/poison value is representable in ``dtype``."""
    if dtype == "bool":
        return isinstance(value, bool)
    if isinstance(value, bool):  # `true` for a number is a slip, not 1
        return False
    if dtype in INTEGER_DTYPES:
        if isinstance(value, float) and not value.is_integer():
            return False
        if isinstance(value, float) and not math.isfinite(value):
            return False
        lo, hi = _INT_RANGES[dtype]
        return lo <= int(value) <= hi
    try:
        number = float(value)
    except OverflowError:  # an int beyond any float
        return False
    # inf and NaN are fine fills (NaN is the float poison); a finite value must stay finite.
    return not math.isfinite(number) or abs(number) <= _FLOAT_MAX.get(dtype, _FLOAT_MAX["float16"])
