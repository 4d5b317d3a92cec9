"""YAML with source locations.

PyYAML's composer gives nodes with marks; we construct plain Python data from
them ourselves so that every mapping key and value keeps its line and column
(indexed by its path from the document root), duplicate keys are reported
instead of silently overwritten, and no YAML construct can raise anything but a
located :class:`SpecError`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

from relayc.specs.errors import SourceLoc, SpecError, SpecErrors

Path = tuple[str | int, ...]
_MAX_DEPTH = 64
# Values the document may expand to once aliases are followed. The bundled specs have
# about a thousand; a "billion laughs" file of a few hundred bytes has billions, and
# building them would take minutes and gigabytes before any check ran.
MAX_EXPANDED_VALUES = 100_000


@dataclass
class LocIndex:
    """Where each path of a document stands: the value and, for mapping entries, the key."""

    path: str
    values: dict[Path, SourceLoc] = field(default_factory=dict)
    keys: dict[Path, SourceLoc] = field(default_factory=dict)

    def value(self, path: Path) -> SourceLoc:
        """The location of the value at ``path``, or of its nearest located ancestor."""
        for n in range(len(path), -1, -1):
            loc = self.values.get(path[:n])
            if loc is not None:
                return loc
        return SourceLoc(self.path, 1, 1)

    def key(self, path: Path) -> SourceLoc:
        """The location of the key of the entry at ``path`` (its value for list items)."""
        return self.keys.get(path) or self.value(path)


def _mark(path: str, mark: yaml.Mark | None) -> SourceLoc:
    if mark is None:
        return SourceLoc(path, 1, 1)
    return SourceLoc(path, mark.line + 1, mark.column + 1)


class _Builder:
    def __init__(self, path: str) -> None:
        self.index = LocIndex(path)
        self.errors: list[SpecError] = []
        self._constructor = yaml.SafeLoader("")

    def build(self, node: yaml.Node, path: Path, active: frozenset[int]) -> Any:
        loc = _mark(self.index.path, node.start_mark)
        self.index.values[path] = loc
        if id(node) in active or len(path) > _MAX_DEPTH:
            self.errors.append(
                SpecError(
                    loc,
                    "recursive or too deeply nested YAML",
                    "specs are plain trees; remove the alias",
                )
            )
            return None
        active = active | {id(node)}
        if isinstance(node, yaml.MappingNode):
            return self._mapping(node, path, active)
        if isinstance(node, yaml.SequenceNode):
            return [self.build(item, (*path, i), active) for i, item in enumerate(node.value)]
        return self._scalar(node, loc)

    def _mapping(self, node: yaml.MappingNode, path: Path, active: frozenset[int]) -> dict:
        result: dict[str, Any] = {}
        try:
            self._constructor.flatten_mapping(node)  # resolves `<<` merge keys
        except yaml.YAMLError as exc:
            self.errors.append(
                SpecError(
                    _mark(self.index.path, node.start_mark), f"invalid YAML merge: {_problem(exc)}"
                )
            )
        for key_node, value_node in node.value:
            key_loc = _mark(self.index.path, key_node.start_mark)
            if not isinstance(key_node, yaml.ScalarNode):
                self.errors.append(
                    SpecError(
                        key_loc,
                        "mapping keys must be plain names",
                        "a key cannot be a list or a mapping",
                    )
                )
                continue
            key = self._scalar(key_node, key_loc)
            if not isinstance(key, str):
                hint = "keys are names such as `dtype` or `topk_p`"
                if isinstance(key, bool) or key is None:
                    hint = (
                        "YAML reads unquoted `on`, `off`, `yes`, `no`, `true`, `null` as "
                        "booleans or null; quote the key if you meant a name"
                    )
                self.errors.append(
                    SpecError(key_loc, f"mapping key `{key_node.value}` is not a name", hint)
                )
                continue
            if key in result:
                first = self.index.keys[(*path, key)]
                self.errors.append(
                    SpecError(
                        key_loc,
                        f"duplicate key `{key}`",
                        f"first defined at line {first.line}; remove or rename one",
                    )
                )
                continue
            self.index.keys[(*path, key)] = key_loc
            result[key] = self.build(value_node, (*path, key), active)
        return result

    def _scalar(self, node: yaml.Node, loc: SourceLoc) -> Any:
        try:
            return self._constructor.construct_object(node, deep=True)
        except yaml.YAMLError as exc:
            self.errors.append(
                SpecError(
                    loc,
                    f"unsupported YAML value: {_problem(exc)}",
                    "use plain strings, numbers, lists and mappings",
                )
            )
            return None


def _expanded_sizes(root: yaml.Node) -> dict[int, int]:
    """Values under each node with aliases expanded (capped just above the limit).

    Computed once per distinct node, so it takes time linear in the file however far
    aliases would expand; a node inside itself (a recursive alias) counts once here
    and is reported by the builder.
    """
    sizes: dict[int, int] = {}
    active: set[int] = set()
    cap = MAX_EXPANDED_VALUES + 1

    def size(node: yaml.Node, depth: int) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in active or depth > _MAX_DEPTH:
            return 1
        active.add(key)
        total = 1
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                total += size(key_node, depth + 1) + size(value_node, depth + 1)
                if total >= cap:
                    break
        elif isinstance(node, yaml.SequenceNode):
            for item in node.value:
                total += size(item, depth + 1)
                if total >= cap:
                    break
        active.discard(key)
        sizes[key] = min(total, cap)
        return sizes[key]

    size(root, 0)
    return sizes


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _too_large(root: yaml.Node, path: str) -> SpecError | None:
    """A located error when aliases expand the document past MAX_EXPANDED_VALUES."""
    sizes = _expanded_sizes(root)
    if sizes.get(id(root), 0) <= MAX_EXPANDED_VALUES:
        return None
    # Point at the smallest value that is too large on its own: the anchor to fix.
    node = root
    while True:
        bigger = [c for c in _children(node) if sizes.get(id(c), 0) > MAX_EXPANDED_VALUES]
        if not bigger or bigger[0] is node:
            break
        node = bigger[0]
    return SpecError(
        _mark(path, node.start_mark),
        f"this value expands to more than {MAX_EXPANDED_VALUES} values through YAML aliases",
        "specs are small trees; write the values out or use fewer, smaller aliases",
    )


def _problem(exc: yaml.YAMLError) -> str:
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return str(problem)


def load_yaml(text: str, path: str) -> tuple[Any, LocIndex, list[SpecError]]:
    """Parse one YAML document; returns (data, locations, errors)."""
    builder = _Builder(path)
    try:
        nodes = list(yaml.compose_all(text, Loader=yaml.SafeLoader))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        message = f"YAML syntax error: {exc.problem or exc.context}"
        hint = exc.context if exc.context and exc.problem else None
        indentation = _indentation_hint(exc, text)
        if indentation is not None:
            mark, hint = indentation
        return None, builder.index, [SpecError(_mark(path, mark), message, hint)]
    except yaml.reader.ReaderError as exc:  # a byte YAML does not allow, e.g. NUL
        return None, builder.index, [_reader_error(exc, text, path)]
    except yaml.YAMLError as exc:
        return (
            None,
            builder.index,
            [SpecError(SourceLoc(path, 1, 1), f"YAML error: {_problem(exc)}")],
        )
    except RecursionError:
        return None, builder.index, [SpecError(SourceLoc(path, 1, 1), "YAML nested too deeply")]
    if not nodes:
        return (
            None,
            builder.index,
            [
                SpecError(
                    SourceLoc(path, 1, 1),
                    "the spec file is empty",
                    "start with `algorithm: <name>`",
                )
            ],
        )
    if len(nodes) > 1:
        loc = _mark(path, nodes[1].start_mark)
        builder.errors.append(
            SpecError(
                loc,
                "a spec file holds one YAML document",
                "remove the `---` and what follows, or split the file",
            )
        )
    too_large = _too_large(nodes[0], path)
    if too_large is not None:
        return None, builder.index, [*builder.errors, too_large]
    data = builder.build(nodes[0], (), frozenset())
    return data, builder.index, builder.errors


def _indentation_hint(exc: yaml.MarkedYAMLError, text: str) -> tuple[yaml.Mark, str] | None:
    """For the errors a mis-indented line gives, the mark of the line that is likely wrong
    and a hint naming it: PyYAML reports where it noticed, often the line after."""
    problem, at, context = exc.problem or "", exc.problem_mark, exc.context_mark
    if at is None:
        return None
    lines = text.splitlines()
    if problem.startswith("could not find expected ':'") and context is not None:
        # a key whose `:` never came: the scanner gave up on the next line
        return context, (
            f"line {context.line + 1} is likely wrong: add the `:` after its key, or check "
            f"its indentation and that of line {at.line + 1}"
        )
    if problem.startswith("mapping values are not allowed"):
        before = lines[at.line][: at.column] if at.line < len(lines) else ""
        if ": " in before or before.rstrip().endswith(":"):  # `key: a: b` on one line
            return at, 'a value holding `: ` must be quoted: `key: "a: b"`'
        above = _line_above(lines, at.line)
        where = f"than line {above + 1}" if above is not None else "than the line above"
        return at, (
            f"line {at.line + 1} is likely wrong: it is indented deeper {where}, so YAML "
            "reads it as part of that line's value; check its indentation"
        )
    if problem.startswith("expected <block end>") and context is not None:
        return at, (
            f"line {at.line + 1} is likely wrong: its indentation does not line up with the "
            f"entries of the block that starts at line {context.line + 1}; check its "
            "indentation"
        )
    return None


def _line_above(lines: list[str], line: int) -> int | None:
    """The index of the nearest line before ``line`` that holds more than a comment."""
    for index in range(min(line, len(lines)) - 1, -1, -1):
        stripped = lines[index].strip()
        if stripped and not stripped.startswith("#"):
            return index
    return None


def text_position(text: str, offset: int) -> tuple[int, int]:
    """1-based (line, column) of character ``offset`` in ``text``."""
    line = text.count("\n", 0, offset) + 1
    return line, offset - (text.rfind("\n", 0, offset) + 1) + 1


def _reader_error(exc: yaml.reader.ReaderError, text: str, path: str) -> SpecError:
    line, col = text_position(text, exc.position)
    char = exc.character
    code = ord(char) if isinstance(char, str) else int(char)
    shown = f"U+{code:04X}"
    return SpecError(
        SourceLoc(path, line, col),
        f"character {shown} is not allowed in YAML",
        "remove it; spec files are plain UTF-8 text",
    )


def decode_spec_bytes(data: bytes, path: str) -> str:
    """UTF-8 text of a spec file, or a SpecError located at the first undecodable byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        col = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        error = SpecError(
            SourceLoc(path, line, col),
            f"byte 0x{data[exc.start]:02x} is not UTF-8 ({exc.reason})",
            "save the file as UTF-8",
        )
        raise SpecErrors([error]) from None
