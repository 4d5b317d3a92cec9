"""Loading spec files: YAML -> validated, resolved :class:`Spec`.

Loading never stops at the first problem: the file is validated as a whole by
pydantic, then each entity on its own so that cross-reference checks can run on
everything that is well formed, and all errors (of the file and of the
libraries it imports) are raised together as :class:`SpecErrors`.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import os
import stat
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path as FsPath
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from relayc.specs.checks import check_algorithm, check_library
from relayc.specs.document import Library, OpsModule, Parts, Spec
from relayc.specs.errors import SourceLoc, SpecError, SpecErrors
from relayc.specs.messages import translate
from relayc.specs.schema import (
    IDENTIFIER_RE,
    Capture,
    Dim,
    Import,
    Input,
    Outputs,
    RelayField,
    Rule,
    SGLangTarget,
    SpecFile,
    Staging,
    Step,
    VLLMTarget,
)
from relayc.specs.yamlsrc import LocIndex, decode_spec_bytes, load_yaml

BUNDLED_DIR = FsPath(__file__).resolve().parent

__all__ = [
    "BUNDLED_DIR",
    "Library",
    "Parts",
    "Spec",
    "bundled_spec_paths",
    "display_path",
    "load_document",
    "load_spec",
    "load_spec_text",
]


def display_path(path: str | os.PathLike[str]) -> str:
    """Paths in messages and generated headers: relative to the cwd when below it,
    and bundled specs as `relayc/specs/<name>` wherever relayc is installed."""
    resolved = FsPath(path).resolve()
    if resolved.parent == BUNDLED_DIR:
        return f"relayc/specs/{resolved.name}"
    try:
        return str(resolved.relative_to(FsPath.cwd()))
    except ValueError:
        return str(path)


def bundled_spec_paths() -> list[FsPath]:
    """The bundled algorithm specs (libraries excluded), sorted by name."""
    return sorted(p for p in BUNDLED_DIR.glob("*.yaml") if not _is_library_file(p))


def _is_library_file(path: FsPath) -> bool:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    return isinstance(data, dict) and "library" in data


def load_spec(path: str | os.PathLike[str], *, ops: Sequence[str] = ()) -> Spec:
    """Load and validate an algorithm spec file; raises :class:`SpecErrors`.

    ``ops`` names more modules of user ops (the CLI's ``--ops``), after the spec's own.
    """
    document = load_document(path, ops=ops)
    if isinstance(document, Library):
        raise SpecErrors(
            [
                SpecError(
                    SourceLoc(document.path, 1, 1),
                    f"`{document.path}` is a library, not an algorithm spec",
                    "pass the algorithm specs that import it",
                )
            ]
        )
    return document


# A spec is a few kilobytes (the bundled ones are under 10 kB); past this it is no spec.
MAX_SPEC_BYTES = 1 << 20


@functools.cache
def importable_modules() -> frozenset[str]:
    """Top-level modules an algorithm's generated ``<algorithm>.py`` must not be named
    like: the standard library's, the built-in ones and every installed distribution's
    (``torch``, ``numpy``, ``relayc`` ...). Files in the working directory are not
    counted: generated modules live there."""
    from importlib.metadata import packages_distributions

    return frozenset(
        {*sys.stdlib_module_names, *sys.builtin_module_names, *packages_distributions()}
    )


def read_spec_bytes(path: str | os.PathLike[str]) -> bytes:
    """The bytes of the spec file ``path``: a regular file of at most MAX_SPEC_BYTES.

    ``OSError`` (its ``strerror`` says why) for a device (``/dev/zero`` would be read until
    memory runs out), a FIFO (opened without waiting for a writer), a directory, or a file
    past the limit -- as for a file that cannot be opened.
    """
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file (a device, a FIFO or a directory)")
        handle = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with handle:
        data = handle.read(MAX_SPEC_BYTES + 1)
    if len(data) > MAX_SPEC_BYTES:
        raise OSError(errno.EFBIG, f"larger than {MAX_SPEC_BYTES} bytes; a spec is a few kilobytes")
    return data


def load_document(path: str | os.PathLike[str], *, ops: Sequence[str] = ()) -> Spec | Library:
    """Load and validate a spec file of either kind; raises :class:`SpecErrors`."""
    shown = display_path(path)
    try:
        data = read_spec_bytes(path)
    except OSError as exc:
        raise SpecErrors(
            [SpecError(SourceLoc(shown, 1, 1), f"cannot read spec: {_why(exc)}", "check the path")]
        ) from None
    text = decode_spec_bytes(data, shown)
    return load_spec_text(text, shown, base_dir=FsPath(path).resolve().parent, ops=ops)


def load_spec_text(
    text: str, path: str, *, base_dir: FsPath | None = None, ops: Sequence[str] = ()
) -> Spec | Library:
    """Load a spec file's text; ``path`` is used in messages, ``base_dir`` for imports and
    user-op modules, ``ops`` names user-op modules beyond the spec's `ops:`."""
    errors: list[SpecError] = []
    parts = parse_parts(text, path, errors)
    if parts is None:
        raise SpecErrors(errors)
    if parts.algorithm is not None and parts.algorithm in importable_modules():
        errors.append(
            SpecError(
                parts.index.value(("algorithm",)),
                f"algorithm `{parts.algorithm}` is named like an importable module: the "
                f"generated `{parts.algorithm}.py` would shadow `import {parts.algorithm}`",
                f"rename it, e.g. `algorithm: {parts.algorithm}_spec`",
            )
        )
    libraries = _load_imports(parts, base_dir or FsPath.cwd(), errors)
    spec = check_algorithm(parts, libraries, errors, _hash(text, libraries))
    if not errors and parts.library is not None and not parts.broken:
        return Library(
            path=parts.path,
            name=parts.library,
            description=parts.description,
            dims=parts.dims,
            inputs=parts.inputs,
            fields=parts.fields,
        )
    if errors or spec is None:
        raise SpecErrors(errors or [SpecError(parts.index.value(()), "invalid spec")])
    root = parts.index.value(())
    cli_ops = [OpsModule(name, root, from_cli=True) for name in ops]
    return replace(spec, ops=(*parts.ops, *cli_ops), ops_dir=str(base_dir or FsPath.cwd()))


def _hash(text: str, libraries: dict[str, tuple[Parts, str]]) -> str:
    digest = hashlib.sha256(text.encode("utf-8"))
    for name in sorted(libraries):
        digest.update(b"\0" + libraries[name][1].encode("utf-8"))
    return digest.hexdigest()[:16]


def parse_parts(text: str, path: str, errors: list[SpecError]) -> Parts | None:
    """YAML text -> the well-formed entities of the file; appends every error found."""
    data, index, yaml_errors = load_yaml(text, path)
    errors.extend(yaml_errors)
    if data is None and yaml_errors:
        return None
    if not isinstance(data, dict):
        errors.append(
            SpecError(
                index.value(()),
                "a spec file must be a mapping of sections",
                "start with `algorithm: <name>` or `library: <name>`",
            )
        )
        return None
    try:
        valid = SpecFile.model_validate(data)
    except ValidationError as exc:
        errors.extend(translate(exc, index, data))
        return _partial_parts(data, index, path, text)
    return _parts_from_valid(valid, data, index, path, text)


def _locate(model: BaseModel, loc: SourceLoc) -> None:
    model._loc = loc  # type: ignore[attr-defined]


def _parts_from_valid(valid: SpecFile, data: dict, index: LocIndex, path: str, text: str) -> Parts:
    _locate(valid, index.value(()))
    parts = Parts(
        path=path,
        index=index,
        algorithm=valid.algorithm,
        library=valid.library,
        description=valid.description,
        has=set(data),
    )
    for section in ("dims", "inputs", "fields"):
        entries: dict[str, Any] = getattr(valid, section)
        for name, entity in entries.items():
            _locate(entity, index.key((section, name)))
            getattr(parts, section)[name] = entity
    for i, imp in enumerate(valid.imports):
        _locate(imp, index.value(("imports", i)))
        parts.imports.append((("imports", i), imp))
    parts.ops = [OpsModule(name, index.value(("ops", i))) for i, name in enumerate(valid.ops)]
    lines = text.splitlines() if valid.rules else []
    for i, rule in enumerate(valid.rules):
        _locate(rule, _rule_text_loc(data["rules"][i], index, i, lines))
        parts.rules.append(rule)
    for i, step in enumerate(valid.steps):
        _locate(step, index.value(("steps", i)))
        parts.steps.append((("steps", i), step))
    if valid.prefill is not None:
        _locate(valid.prefill, index.key(("prefill",)))
        parts.prefill = valid.prefill
    if valid.capture is not None:
        _locate(valid.capture, index.key(("capture",)))
        parts.capture = valid.capture
    if valid.outputs is not None:
        _locate(valid.outputs, index.key(("outputs",)))
        parts.outputs = valid.outputs
    if valid.sglang is not None:
        where = ("sglang", "plugin") if valid.sglang.plugin is not None else ("sglang",)
        _locate(valid.sglang, index.value(where))  # errors point at the name
        parts.sglang = valid.sglang
    if valid.vllm is not None:
        _locate(valid.vllm, index.key(("vllm",)))
        parts.vllm = valid.vllm
    if valid.staging is not None:
        _locate(valid.staging, index.key(("staging",)))
        parts.staging = valid.staging
    return parts


def _validated(model: type[BaseModel], raw: Any, loc: SourceLoc) -> Any:
    try:
        entity = model.model_validate(raw)
    except ValidationError:
        return None
    _locate(entity, loc)
    return entity


def _rule_text_loc(raw: Any, index: LocIndex, i: int, lines: list[str]) -> SourceLoc:
    """Where rule ``i``'s text starts (after a quote), so an error in it points at its column;
    ``lines``: the file's, split once (a hostile file may hold many thousand rules)."""
    loc = index.value(("rules", i) if isinstance(raw, str) else ("rules", i, "rule"))
    line = lines[loc.line - 1] if 0 < loc.line <= len(lines) else ""
    quoted = line[loc.col - 1 : loc.col] in ("'", '"')
    return replace(loc, col=loc.col + 1) if quoted else loc


def _partial_parts(data: dict, index: LocIndex, path: str, text: str) -> Parts:
    """The entities of a file with errors that still validate on their own."""
    parts = Parts(path=path, index=index, has=set(data))
    for key in ("algorithm", "library", "description"):
        if isinstance(data.get(key), str):
            setattr(parts, key, data[key])
    models: dict[str, type[BaseModel]] = {"dims": Dim, "inputs": Input, "fields": RelayField}
    for section, model in models.items():
        raw = data.get(section, {})
        if not isinstance(raw, dict):
            parts.broken.add((section, "*"))
            continue
        for name, entry in raw.items():
            entity = _validated(model, entry, index.key((section, name)))
            if entity is None or not IDENTIFIER_RE.match(str(name)):
                parts.broken.add((section, str(name)))
            else:
                getattr(parts, section)[name] = entity
    for section, model in (("imports", Import), ("steps", Step)):
        raw = data.get(section, [])
        if not isinstance(raw, list):
            parts.broken.add((section, "*"))
            continue
        for i, entry in enumerate(raw):
            entity = _validated(model, entry, index.value((section, i)))
            if entity is not None:
                getattr(parts, section).append(((section, i), entity))
            elif isinstance(entry, dict) and isinstance(entry.get("name"), str):
                parts.broken.add((section, entry["name"]))
    raw_rules = data.get("rules", [])
    lines = text.splitlines() if raw_rules else []
    for i, entry in enumerate(raw_rules if isinstance(raw_rules, list) else []):
        raw = {"rule": entry} if isinstance(entry, str) else entry
        rule = _validated(Rule, raw, _rule_text_loc(entry, index, i, lines))
        if rule is not None:
            parts.rules.append(rule)
    if "prefill" in data:
        parts.prefill = _validated(Step, data["prefill"], index.key(("prefill",)))
        if parts.prefill is None:
            parts.broken.add(("prefill", "prefill"))
    if "capture" in data:
        parts.capture = _validated(Capture, data["capture"], index.key(("capture",)))
    if "outputs" in data:
        parts.outputs = _validated(Outputs, data["outputs"], index.key(("outputs",)))
        if parts.outputs is None:
            parts.broken.add(("outputs", "outputs"))
    if "sglang" in data:
        parts.sglang = _validated(SGLangTarget, data["sglang"], index.key(("sglang",)))
    if "vllm" in data:
        parts.vllm = _validated(VLLMTarget, data["vllm"], index.key(("vllm",)))
    if "staging" in data:
        parts.staging = _validated(Staging, data["staging"], index.key(("staging",)))
    parts.broken.add(("file", "partial"))
    return parts


def _why(exc: BaseException) -> str:
    return getattr(exc, "strerror", None) or str(exc)


def _load_imports(
    parts: Parts, base_dir: FsPath, errors: list[SpecError]
) -> dict[str, tuple[Parts, str]]:
    """Library files imported by ``parts``, keyed by their `file:` text."""
    libraries: dict[str, tuple[Parts, str]] = {}
    for path, imp in parts.imports:
        if imp.file in libraries:
            continue
        loc = parts.index.value((*path, "file"))
        target = (base_dir / imp.file).resolve()
        try:
            text = decode_spec_bytes(read_spec_bytes(target), display_path(target))
        except SpecErrors as exc:
            errors.extend(exc.errors)
            parts.broken.add(("imports", imp.file))
            continue
        except OSError as exc:
            errors.append(
                SpecError(
                    loc,
                    f"cannot import `{imp.file}`: {_why(exc)}",
                    "paths are relative to the importing file",
                )
            )
            parts.broken.add(("imports", imp.file))
            continue
        lib_errors: list[SpecError] = []
        lib = parse_parts(text, display_path(target), lib_errors)
        errors.extend(lib_errors)
        if lib is None:
            parts.broken.add(("imports", imp.file))
            continue
        if lib.library is None:
            errors.append(
                SpecError(
                    loc,
                    f"`{imp.file}` is not a library",
                    "only files starting with `library: <name>` can be imported",
                )
            )
            parts.broken.add(("imports", imp.file))
            continue
        check_library(lib, errors)
        libraries[imp.file] = (lib, text)
    return libraries
