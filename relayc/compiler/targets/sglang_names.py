"""Spec names the SGLang drop-in cannot hold, found by parsing the drop-in it emits.

Unlike the engine target's modules (whose buffers are dict entries), the drop-in keeps
SGLang's surface: a relay field is a `RelayPayload` attribute, an attribute set on SGLang's
draft input, and a FutureMap attribute derived from its name (`topk_p_buf`); an algorithm
is a class derived from its name (`EagleFutureMap`). A spec name that lands on a name the
drop-in already uses silently changes what the code does: a field `output_tokens` would be
held in `output_tokens_buf`, the bonus-token buffer that becomes the next input tokens.

What is reserved is read from the emitted modules' source (their AST), not listed by hand,
so that the check stays true whatever the target emits: every module-level name and class,
and every method, class attribute and `self.` attribute of the FutureMap classes (SGLang's
`FutureMap`, the classes it derives from in any parsed module, such as the runtime's base,
and every class deriving from those), the members of `RelayPayload` that are not its
fields, and the attributes the relay reads or sets on SGLang's draft inputs. Only what a
parse cannot tell comes from the target as a :class:`DropInNaming`: how it derives a class
name from an algorithm and a buffer attribute from a field, which fields are SGLang's own
(the buffers its fixed code names belong to them), and which module holds the per-field
code (there a field's own buffer and draft-input attribute are expected, not reserved).
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from relayc.plan import RelayPlan
from relayc.specs.errors import SourceLoc, SpecError

# SGLang's names for what the drop-in defines: its FutureMap (it, its bases and the classes
# deriving from them hold the buffers), its payload, and where the relay finds a batch's
# draft input.
FUTURE_MAP = "FutureMap"
PAYLOAD = "RelayPayload"
_DRAFT_INPUT_NAMES = frozenset({"draft_input", "spec_info"})


@dataclass(frozen=True)
class DropInNaming:
    """How a target derives generated names from spec names (what no parse can tell)."""

    class_of: Callable[[str], str]  # algorithm -> the class generated for it
    buffer_of: Callable[[str], str]  # relay field -> the FutureMap attribute holding it
    # SGLang's own relay fields: the buffer attributes its fixed code names are theirs.
    sglang_fields: tuple[str, ...]
    # The module whose per-field code writes `self.<buffer>` and `draft_input.<field>` for
    # each relayed field: there those names are the fields' own. None: every module is
    # fixed code, whose every name is reserved.
    field_module: str | None = None


@dataclass(frozen=True)
class Definition:
    """A module-level name of one of the drop-in's modules."""

    name: str
    module: str
    kind: str  # `class`, `function`, `import` or `assignment`
    line: int  # two classes of one name are two definitions


@dataclass(frozen=True)
class DropInNames:
    """The names the emitted drop-in uses, by where a spec name could land on them."""

    definitions: tuple[Definition, ...]  # module-level names (classes included), per module
    map_members: frozenset[str]  # FutureMap classes: methods, class and `self.` attributes
    payload_members: frozenset[str]  # RelayPayload's methods and class attributes
    draft_input_attributes: frozenset[str]  # read or set on SGLang's draft inputs
    # The same two, less the attributes only the per-field module names (a relayed field's
    # own buffer or draft-input attribute may be one of those: see field_reserved).
    fixed_map_members: frozenset[str]
    fixed_draft_input_attributes: frozenset[str]

    def defined(self, name: str) -> list[Definition]:
        """The module-level definitions spelled like ``name``, ignoring case."""
        key = name.casefold()
        return [d for d in self.definitions if d.name.casefold() == key]


def drop_in_names(sources: Mapping[str, str], field_module: str | None = None) -> DropInNames:
    """The names the modules ``sources`` (file name -> Python source) use; ``field_module``:
    the one holding per-field code (:attr:`DropInNaming.field_module`)."""
    trees = {module: ast.parse(text) for module, text in sources.items()}
    definitions: dict[Definition, None] = {}
    classes: list[tuple[str, ast.ClassDef]] = []
    for module, tree in trees.items():
        for node in _module_level(tree.body):
            for name, kind in _defines(node):
                definitions[Definition(name, module, kind, node.lineno)] = None
            if isinstance(node, ast.ClassDef):
                classes.append((module, node))
    maps = _future_map_classes(classes)
    payloads = [c for _, c in classes if c.name == PAYLOAD]
    map_members: set[str] = set()
    fixed_members: set[str] = set()
    for module, cls in maps:
        for name, attribute in _members(cls, self_attributes=True):
            map_members.add(name)
            if module != field_module or not attribute:  # methods are never a field's
                fixed_members.add(name)
    draft_attributes: set[str] = set()
    fixed_draft_attributes: set[str] = set()
    for module, tree in trees.items():
        found = {n for node in _outside(tree, payloads) for n in _draft_input_attribute(node)}
        draft_attributes |= found
        if module != field_module:
            fixed_draft_attributes |= found
    return DropInNames(
        definitions=tuple(definitions),
        map_members=frozenset(map_members),
        payload_members=frozenset(
            name for c in payloads for name, _ in _members(c, self_attributes=False)
        ),
        draft_input_attributes=frozenset(draft_attributes),
        fixed_map_members=frozenset(fixed_members),
        fixed_draft_input_attributes=frozenset(fixed_draft_attributes),
    )


def _module_level(body: Sequence[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements of a module body, those under a module-level `if` / `try` included
    (`if __package__: from . import x` / `else: import x` both define `x`)."""
    for node in body:
        if isinstance(node, ast.If):
            yield from _module_level([*node.body, *node.orelse])
        elif isinstance(node, ast.Try):
            yield from _module_level(
                [
                    *node.body,
                    *(s for h in node.handlers for s in h.body),
                    *node.orelse,
                    *node.finalbody,
                ]
            )
        else:
            yield node


def _defines(node: ast.stmt) -> Iterator[tuple[str, str]]:
    if isinstance(node, ast.ClassDef):
        yield node.name, "class"
    elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        yield node.name, "function"
    elif isinstance(node, ast.Import | ast.ImportFrom):
        for alias in node.names:
            yield (alias.asname or alias.name).split(".")[0], "import"
    elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for target in targets:
            for name in ast.walk(target):
                if isinstance(name, ast.Name):
                    yield name.id, "assignment"


def _future_map_classes(
    classes: Sequence[tuple[str, ast.ClassDef]],
) -> list[tuple[str, ast.ClassDef]]:
    """FutureMap, the classes it derives from in any of the modules (the runtime's base,
    whatever its name), and every class deriving from any of those: each with its module."""
    by_name: dict[str, list[ast.ClassDef]] = {}
    for _, cls in classes:
        by_name.setdefault(cls.name, []).append(cls)
    names = {FUTURE_MAP}
    pending = [FUTURE_MAP]
    while pending:  # up: the bases FutureMap is built on
        for cls in by_name.get(pending.pop(), []):
            for base in _base_names(cls):
                if base in by_name and base not in names:
                    names.add(base)
                    pending.append(base)
    grew = True
    while grew:  # down: every class deriving from one of them
        grew = False
        for _, cls in classes:
            if cls.name not in names and set(_base_names(cls)) & names:
                names.add(cls.name)
                grew = True
    return [(module, cls) for module, cls in classes if cls.name in names]


def _base_names(cls: ast.ClassDef) -> list[str]:
    """The bases' class names: `Base`, or `module.Base` for a base taken from another of
    the modules (`runtime.RelayMap`)."""
    return [
        b.id if isinstance(b, ast.Name) else b.attr
        for b in cls.bases
        if isinstance(b, ast.Name | ast.Attribute)
    ]


def _members(cls: ast.ClassDef, *, self_attributes: bool) -> Iterator[tuple[str, bool]]:
    """Methods and class attributes of ``cls``, and with ``self_attributes`` its annotated
    entries and every attribute its methods read or set on `self` / `cls`. Without it (a
    dataclass) only ClassVar annotations are members: the other annotations are its fields.
    Each with whether it is an attribute (False: a method or a nested class)."""
    for node in cls.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            yield node.name, False
        elif isinstance(node, ast.Assign):
            yield from ((t.id, True) for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if self_attributes or "ClassVar" in ast.unparse(node.annotation):
                yield node.target.id, True
    if self_attributes:
        for inner in ast.walk(cls):
            if (
                isinstance(inner, ast.Attribute)
                and isinstance(inner.value, ast.Name)
                and inner.value.id in ("self", "cls")
            ):
                yield inner.attr, True


def _outside(tree: ast.Module, skipped: Sequence[ast.ClassDef]) -> Iterator[ast.AST]:
    """Every node of ``tree`` except those inside the classes ``skipped``."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if node in skipped:
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def _is_draft_input(node: ast.AST) -> bool:
    return (isinstance(node, ast.Name) and node.id in _DRAFT_INPUT_NAMES) or (
        isinstance(node, ast.Attribute) and node.attr in _DRAFT_INPUT_NAMES
    )


def _draft_input_attribute(node: ast.AST) -> Iterator[str]:
    """Attributes read or set on a draft input (`draft_input.x`, `batch.spec_info.x`,
    `getattr(draft_input, "x", ...)`), and the keywords a draft input is built with
    (`EagleDraftInput(future_indices=...)`). RelayPayload's converters are skipped by the
    caller: they read the relay fields."""
    if isinstance(node, ast.Attribute) and _is_draft_input(node.value):
        yield node.attr
    elif isinstance(node, ast.Call):
        func = node.func
        called = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
        if called.endswith("Input"):
            yield from (k.arg for k in node.keywords if k.arg is not None)
        args = node.args
        if called in ("getattr", "setattr", "hasattr") and len(args) >= 2:
            if _is_draft_input(args[0]) and isinstance(args[1], ast.Constant):
                if isinstance(args[1].value, str):
                    yield args[1].value


@dataclass
class _Claims:
    """The first spec entry that claimed each generated name, for messages."""

    classes: dict[str, tuple[str, RelayPlan]] = field(default_factory=dict)
    buffers: dict[str, str] = field(default_factory=dict)


def check_drop_in_names(
    sources: Mapping[str, str],
    algorithms: Sequence[tuple[RelayPlan, Sequence[str]]],
    naming: DropInNaming,
) -> list[SpecError]:
    """Located errors for the spec names of ``algorithms`` (each plan with the relay fields
    the drop-in holds for it) that land on a name the drop-in ``sources`` already use, or
    on each other's; empty when there are none."""
    names = drop_in_names(sources, naming.field_module)
    errors: list[SpecError] = []
    claims = _Claims()
    produced = [naming.class_of(plan.algorithm) for plan, _ in algorithms]
    for plan, _ in algorithms:
        errors.extend(_class_errors(plan, naming, names, produced, claims))
    owners = {naming.buffer_of(n): n for n in naming.sglang_fields}
    relayed = {name for _, fields in algorithms for name in fields}
    reserved = _Reserved(
        map_members=names.fixed_map_members
        | (names.map_members - {naming.buffer_of(n) for n in relayed}),
        draft_input_attributes=names.fixed_draft_input_attributes
        | (names.draft_input_attributes - relayed),
        payload_members=names.payload_members,
    )
    seen: set[SourceLoc] = set()
    for plan, fields in algorithms:
        for name in fields:
            loc = plan.field_locs[name]
            if loc in seen:  # a field imported from one library by several specs
                continue
            seen.add(loc)
            errors.extend(_field_errors(name, loc, naming, reserved, owners, claims))
    return errors


@dataclass(frozen=True)
class _Reserved:
    """What a relay field's generated names must not land on. In the per-field module a
    relayed field's own buffer and draft-input attribute are expected; what a parse cannot
    tell there is a fixed name equal to one a relayed field produces, so the fixed code the
    target writes into that module uses no name ending like a buffer (`_buf`)."""

    map_members: frozenset[str]
    draft_input_attributes: frozenset[str]
    payload_members: frozenset[str]


def _class_errors(
    plan: RelayPlan,
    naming: DropInNaming,
    names: DropInNames,
    produced: list[str],
    claims: _Claims,
) -> Iterator[SpecError]:
    cls = naming.class_of(plan.algorithm)
    key = cls.casefold()
    hint = f"rename the algorithm (`algorithm: {plan.algorithm}`)"
    first = claims.classes.setdefault(key, (plan.algorithm, plan))
    if first[1] is not plan:
        yield SpecError(
            plan.algorithm_loc,
            f"algorithm `{plan.algorithm}` generates the SGLang class `{cls}`, as algorithm "
            f"`{first[0]}` of {first[1].spec_path} does"
            + ("" if cls == naming.class_of(first[0]) else " (class names differ only in case)"),
            f"{hint}: the drop-in would define one class for both",
        )
        return
    generated = sum(1 for c in produced if c.casefold() == key)
    own = [d for d in names.defined(cls) if not (d.kind == "class" and d.name in produced)]
    classes = [d for d in names.defined(cls) if d.kind == "class" and d.name in produced]
    if own or len(classes) > generated:
        other = own[0] if own else classes[0]
        yield SpecError(
            plan.algorithm_loc,
            f"algorithm `{plan.algorithm}` generates the SGLang class `{cls}`, a name the "
            f"drop-in already uses ({other.kind} `{other.name}` in {other.module}; names "
            "are compared ignoring case)",
            hint,
        )


def _field_errors(
    name: str,
    loc: SourceLoc,
    naming: DropInNaming,
    names: _Reserved,
    owners: dict[str, str],
    claims: _Claims,
) -> Iterator[SpecError]:
    hint = f"rename the relay field `{name}`"
    buffer = naming.buffer_of(name)
    owner = owners.get(buffer) or claims.buffers.setdefault(buffer, name)
    if owner != name:
        yield SpecError(
            loc,
            f"relay field `{name}` would be held in the FutureMap attribute `{buffer}`, "
            f"SGLang's buffer of `{owner}`",
            f"{hint}: one buffer would hold both fields",
        )
    elif buffer in names.map_members and name not in naming.sglang_fields:
        yield SpecError(
            loc,
            f"relay field `{name}` would be held in the FutureMap attribute `{buffer}`, "
            "which the drop-in's FutureMap already uses",
            hint,
        )
    if name in names.payload_members:
        yield SpecError(
            loc,
            f"relay field `{name}` would be an attribute of RelayPayload, which already "
            f"has a member `{name}`",
            hint,
        )
    if name in names.draft_input_attributes and name not in naming.sglang_fields:
        yield SpecError(
            loc,
            f"relay field `{name}` would be set on SGLang's draft input, where `{name}` is "
            "an attribute the relay itself reads or sets",
            hint,
        )
