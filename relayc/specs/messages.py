"""Turning pydantic validation errors into located, actionable spec errors."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

from relayc.specs.errors import SpecError, did_you_mean, join_hints, quoted_list
from relayc.specs.schema import (
    Capture,
    Dim,
    HostMirror,
    Import,
    Input,
    Outputs,
    RelayField,
    Rule,
    SpecFile,
    Staging,
    Step,
)
from relayc.specs.yamlsrc import LocIndex, Path

_SECTION_ITEM: dict[str, type[BaseModel]] = {
    "dims": Dim,
    "inputs": Input,
    "fields": RelayField,
    "steps": Step,
    "imports": Import,
    "rules": Rule,
}
_SECTION_NOUN = {
    "dims": "dim",
    "inputs": "input",
    "fields": "field",
    "steps": "step",
    "imports": "import",
    "rules": "rule",
}


def model_at(path: Path) -> type[BaseModel] | None:
    """The spec model that describes the mapping at ``path``, if any."""
    if path == ():
        return SpecFile
    if len(path) == 2 and path[0] in _SECTION_ITEM:
        return _SECTION_ITEM[str(path[0])]
    if path == ("prefill",):
        return Step
    if path == ("capture",):
        return Capture
    if path == ("outputs",):
        return Outputs
    if path == ("staging",):
        return Staging
    if len(path) == 3 and path[0] == "fields" and path[2] == "host_mirror":
        return HostMirror
    return None


def describe(path: Path, data: Any) -> str:
    """A human name for the entity at ``path``: "field `topk_p`", "step `verify`"."""
    if path == ():
        return "the spec"
    head = path[0]
    if head == "prefill":
        base, rest = "the prefill step", path[1:]
    elif head == "capture":
        base, rest = "`capture`", path[1:]
    elif head in _SECTION_NOUN and len(path) >= 2:
        noun = _SECTION_NOUN[str(head)]
        ident = path[1]
        if isinstance(ident, int):
            name = _item_name(data, head, ident)
            base = f"{noun} `{name}`" if name else f"{noun} #{ident + 1}"
        else:
            base = f"{noun} `{ident}`"
        rest = path[2:]
    else:
        return f"`{_dotted(path)}`"
    if not rest:
        return base
    return f"`{_dotted(rest)}` of {base}"


def _item_name(data: Any, section: Any, index: int) -> str | None:
    try:
        name = data[section][index].get("name")
    except (TypeError, KeyError, IndexError, AttributeError):
        return None
    return name if isinstance(name, str) else None


def _dotted(path: Path) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def kind_of(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return f"the string `{value}`"
    return f"`{value}`"


_EXPECTED = {
    "dict_type": "a mapping (`key: value` lines)",
    "model_type": "a mapping (`key: value` lines)",
    "model_attributes_type": "a mapping (`key: value` lines)",
    "list_type": "a list (`[a, b]` or `- item` lines)",
    "string_type": "a string",
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "a whole number",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "`true` or `false`",
    "bool_parsing": "`true` or `false`",
}


def translate(
    exc: ValidationError, index: LocIndex, data: Any, prefix: Path = ()
) -> list[SpecError]:
    """All errors of ``exc`` as located spec errors; ``prefix`` roots relative locs."""
    return [_one(err, index, data, prefix) for err in exc.errors(include_url=False)]


def _one(err: Any, index: LocIndex, data: Any, prefix: Path) -> SpecError:
    kind = err["type"]
    loc: Path = (*prefix, *err["loc"])
    value = err.get("input")
    if loc and loc[-1] == "[key]":  # an invalid mapping key
        key_path = loc[:-1]
        return SpecError(index.key(key_path), *_custom(err))
    where = describe(loc, data)
    if kind == "extra_forbidden":
        parent, key = loc[:-1], str(loc[-1])
        model = model_at(parent)
        allowed = list(model.model_fields) if model else []
        return SpecError(
            index.key(loc),
            f"unknown key `{key}` in {describe(parent, data)}",
            join_hints(did_you_mean(key, allowed), f"allowed keys: {quoted_list(allowed)}"),
        )
    if kind == "missing":
        parent, key = loc[:-1], str(loc[-1])
        model = model_at(parent)
        described = model.model_fields.get(key) if model else None
        hint = f"add `{key}:`" + (
            f": {_lower_first(described.description).rstrip('.')}"
            if described and described.description
            else ""
        )
        return SpecError(index.key(parent), f"{describe(parent, data)} is missing `{key}`", hint)
    if kind == "literal_error":
        expected = err.get("ctx", {}).get("expected", "")
        options = [o.strip().strip("'") for o in expected.replace(" or ", ", ").split(",")]
        options = [o for o in options if o]
        if loc[-1] == "dtype":
            shown = f"`{value}`" if isinstance(value, str) else kind_of(value)
            message = f"unknown dtype {shown} in {describe(loc[:-1], data)}"
        elif loc[-1] == "version":
            message = f"unsupported spec version {kind_of(value)}"
        else:
            message = f"{where} must be one of {quoted_list(options)}, got {kind_of(value)}"
        hint = did_you_mean(str(value), options) if isinstance(value, str) else None
        if "must be one of" not in message:
            hint = join_hints(hint, f"allowed: {quoted_list(options)}")
        return SpecError(index.value(loc), message, hint)
    if kind.startswith("relayc_"):
        message, hint = _custom(err)
        return SpecError(index.value(loc), f"{where}: {message}", hint)
    if kind in _EXPECTED:
        return SpecError(
            index.value(loc), f"{where} must be {_EXPECTED[kind]}, got {kind_of(value)}"
        )
    if kind == "greater_than":
        bound = err.get("ctx", {}).get("gt")
        return SpecError(
            index.value(loc), f"{where} must be greater than {bound}, got {kind_of(value)}"
        )
    if kind == "greater_than_equal":
        bound = err.get("ctx", {}).get("ge")
        return SpecError(
            index.value(loc), f"{where} must be at least {bound}, got {kind_of(value)}"
        )
    if kind in ("less_than", "less_than_equal"):
        bound = err.get("ctx", {}).get("lt", err.get("ctx", {}).get("le"))
        return SpecError(index.value(loc), f"{where} must be at most {bound}, got {kind_of(value)}")
    if kind == "string_too_short":
        return SpecError(
            index.value(loc), f"{where} must not be empty", "say in a few words what it is for"
        )
    return SpecError(index.value(loc), f"{where}: {err['msg']}")


def _lower_first(text: str) -> str:
    return text[0].lower() + text[1:] if text[:1].isupper() and text[1:2].islower() else text


def _custom(err: Any) -> tuple[str, str | None]:
    """A relayc validator's message, split into (message, hint) at its parenthesis."""
    message = _lower_first(str(err["msg"]))
    head, paren, tail = message.partition(" (")
    if paren and tail.endswith(")"):
        return head, tail[:-1]
    return message, None
