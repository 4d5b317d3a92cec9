"""Spec names the SGLang drop-in cannot hold, found by parsing the drop-in it emits.

Unlike the engine target's modules (whose buffers are dict entries), the drop-in keeps
SGLang's surface: a relay field is a `RelayPayload` attribute, an attribute set on SGLang's
draft input, and a FutureMap attribute derived from its name (`topk_p_buf`); an algorithm
is a class derived from its name (`EagleFutureMap`). A spec name that lands on a name the
drop-in already uses silently changes what the code does: a field `output_tokens` would be
held in `output_tokens_buf`, the bonus-token buffer that becomes the next input tokens.

What is reserved is read from the emitted modules' source (their AST), not listed by hand,
so that the check stays true whatever the target emits: every module-level name and class,
and every method, class attribute and `self.` attribute of the FutureMap classes, the
members of `RelayPayload` that are not its fields, and the attributes the relay reads or
sets on SGLang's draft inputs. Only what a parse cannot tell comes from the target as a
:class:`DropInNaming`: how it derives a class name from an algorithm and a buffer
attribute from a field, and which fields are SGLang's own (the buffers its fixed code
names belong to them).
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from relayc.specs.document import Spec
from relayc.specs.errors import SourceLoc, SpecError

# SGLang's names for what the drop-in defines: its FutureMap (the classes deriving from it
# hold the buffers), its payload, and where the relay finds a batch's draft input.
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


@dataclass(frozen=True)
class Definition:
    """A module-level name of one of the drop-in's modules."""

    name: str
    module: str
    kind: str  # `class`, `function`, `import` or `assignment`


@dataclass(frozen=True)
class DropInNames:
    """The names the emitted drop-in uses, by where a spec name could land on them."""

    definitions: tuple[Definition, ...]  # module-level names (classes included), per module
    map_members: frozenset[str]  # FutureMap classes: methods, class and `self.` attributes
    payload_members: frozenset[str]  # RelayPayload's methods and class attributes
    draft_input_attributes: frozenset[str]  # read or set on SGLang's draft inputs

    def defined(self, name: str) -> list[Definition]:
        """The module-level definitions spelled like ``name``, ignoring case."""
        key = name.casefold()
        return [d for d in self.definitions if d.name.casefold() == key]


def drop_in_names(sources: Mapping[str, str]) -> DropInNames:
    """The names the modules ``sources`` (file name -> Python source) use."""
    trees = {module: ast.parse(text) for module, text in sources.items()}
    definitions: dict[Definition, None] = {}
    classes: list[ast.ClassDef] = []
    for module, tree in trees.items():
        for node in _module_level(tree.body):
            for name, kind in _defines(node):
                definitions[Definition(name, module, kind)] = None
            if isinstance(node, ast.ClassDef):
                classes.append(node)
    maps = _future_map_classes(classes)
    payloads = [c for c in classes if c.name == PAYLOAD]
    draft_attributes = {
        name
        for tree in trees.values()
        for node in _outside(tree, payloads)
        for name in _draft_input_attribute(node)
    }
    return DropInNames(
        definitions=tuple(definitions),
        map_members=frozenset(name for c in maps for name in _members(c, self_attributes=True)),
        payload_members=frozenset(
            name for c in payloads for name in _members(c, self_attributes=False)
        ),
        draft_input_attributes=frozenset(draft_attributes),
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


def _future_map_classes(classes: Sequence[ast.ClassDef]) -> list[ast.ClassDef]:
    """FutureMap and every class deriving from it, in any of the modules."""
    names = {FUTURE_MAP}
    found: list[ast.ClassDef] = []
    grew = True
    while grew:
        grew = False
        for cls in classes:
            if cls in found:
                continue
            bases = {b.id for b in cls.bases if isinstance(b, ast.Name)}
            if cls.name == FUTURE_MAP or bases & names:
                found.append(cls)
                names.add(cls.name)
                grew = True
    return found


def _members(cls: ast.ClassDef, *, self_attributes: bool) -> Iterator[str]:
    """Methods and class attributes of ``cls``, and with ``self_attributes`` its annotated
    entries and every attribute its methods read or set on `self` / `cls`. Without it (a
    dataclass) only ClassVar annotations are members: the other annotations are its fields."""
    for node in cls.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            yield node.name
        elif isinstance(node, ast.Assign):
            yield from (t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if self_attributes or "ClassVar" in ast.unparse(node.annotation):
                yield node.target.id
    if self_attributes:
        for inner in ast.walk(cls):
            if (
                isinstance(inner, ast.Attribute)
                and isinstance(inner.value, ast.Name)
                and inner.value.id in ("self", "cls")
            ):
                yield inner.attr


def _outside(tree: ast.Module, skipped: Sequence[ast.ClassDef]) -> Iterator[ast.AST]:
    """Every node of ``tree`` except those inside the classes ``skipped``."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if node in skipped:
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def _draft_input_attribute(node: ast.AST) -> Iterator[str]:
    """Attributes read or set on a draft input (`draft_input.x`, `batch.spec_info.x`), and
    the keywords a draft input is built with (`EagleDraftInput(future_indices=...)`).
    RelayPayload's converters are skipped by the caller: they read the relay fields."""
    if isinstance(node, ast.Attribute):
        owner = node.value
        if (isinstance(owner, ast.Name) and owner.id in _DRAFT_INPUT_NAMES) or (
            isinstance(owner, ast.Attribute) and owner.attr in _DRAFT_INPUT_NAMES
        ):
            yield node.attr
    elif isinstance(node, ast.Call):
        func = node.func
        called = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
        if called.endswith("Input"):
            yield from (k.arg for k in node.keywords if k.arg is not None)


@dataclass
class _Claims:
    """The first spec entry that claimed each generated name, for messages."""

    classes: dict[str, tuple[str, Spec]] = field(default_factory=dict)
    buffers: dict[str, str] = field(default_factory=dict)


def check_drop_in_names(
    sources: Mapping[str, str],
    algorithms: Sequence[tuple[Spec, Sequence[str]]],
    naming: DropInNaming,
) -> list[SpecError]:
    """Located errors for the spec names of ``algorithms`` (each spec with the relay fields
    the drop-in holds for it) that land on a name the drop-in ``sources`` already use, or
    on each other's; empty when there are none."""
    names = drop_in_names(sources)
    errors: list[SpecError] = []
    claims = _Claims()
    produced = [naming.class_of(spec.algorithm) for spec, _ in algorithms]
    for spec, _ in algorithms:
        errors.extend(_class_errors(spec, naming, names, produced, claims))
    owners = {naming.buffer_of(n): n for n in naming.sglang_fields}
    seen: set[SourceLoc] = set()
    for spec, fields in algorithms:
        for name in fields:
            loc = spec.fields[name].loc
            if loc in seen:  # a field imported from one library by several specs
                continue
            seen.add(loc)
            errors.extend(_field_errors(name, loc, naming, names, owners, claims))
    return errors


def _class_errors(
    spec: Spec, naming: DropInNaming, names: DropInNames, produced: list[str], claims: _Claims
) -> Iterator[SpecError]:
    cls = naming.class_of(spec.algorithm)
    key = cls.casefold()
    hint = f"rename the algorithm (`algorithm: {spec.algorithm}`)"
    first = claims.classes.setdefault(key, (spec.algorithm, spec))
    if first[1] is not spec:
        yield SpecError(
            spec.algorithm_loc,
            f"algorithm `{spec.algorithm}` generates the SGLang class `{cls}`, as algorithm "
            f"`{first[0]}` of {first[1].path} does"
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
            spec.algorithm_loc,
            f"algorithm `{spec.algorithm}` generates the SGLang class `{cls}`, a name the "
            f"drop-in already uses ({other.kind} `{other.name}` in {other.module}; names "
            "are compared ignoring case)",
            hint,
        )


def _field_errors(
    name: str,
    loc: SourceLoc,
    naming: DropInNaming,
    names: DropInNames,
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
