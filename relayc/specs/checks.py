"""Cross-reference checks of a spec: what pydantic's per-entity validation cannot see.

Dims named by shapes, imports, names defined twice, values a step reads that no
one provides, stash targets, host/device placement and capture buckets.
Dataflow across iterations (a relay field read but never stashed, a field
stashed but never read, dtype/shape agreement between ops and fields) is the
graph passes' job (:mod:`relayc.graph.passes`), which run on a spec these
checks accepted.
"""

from __future__ import annotations

from relayc.specs.document import Parts, Spec
from relayc.specs.errors import SourceLoc, SpecError, did_you_mean, join_hints, quoted_list
from relayc.specs.reserved import check_reserved_names
from relayc.specs.rules import check_rules
from relayc.specs.schema import (
    REF_KINDS,
    Dim,
    Input,
    Ref,
    RelayField,
    Step,
    fill_fits_dtype,
)
from relayc.specs.yamlsrc import Path

_LIBRARY_KEYS = ("library", "version", "description", "dims", "inputs", "fields")


def check_library(lib: Parts, errors: list[SpecError]) -> None:
    """Checks of a library file on its own."""
    for key in sorted(lib.has - set(_LIBRARY_KEYS)):
        errors.append(
            SpecError(
                lib.index.key((key,)),
                f"a library cannot have `{key}`",
                f"a library holds only {quoted_list(_LIBRARY_KEYS[3:])}; move `{key}` to an "
                "algorithm spec",
            )
        )
    _check_definitions(lib, lib.dims, errors)
    check_reserved_names(lib, errors)


def check_algorithm(
    parts: Parts,
    libraries: dict[str, tuple[Parts, str]],
    errors: list[SpecError],
    content_hash: str,
) -> Spec | None:
    """Checks of an algorithm spec; returns the resolved Spec when the file is whole."""
    index = parts.index
    if parts.library is not None:
        if parts.algorithm is not None:
            errors.append(
                SpecError(
                    index.key(("library",)),
                    "a file is either an `algorithm` or a `library`, not both",
                    "remove one of the two keys",
                )
            )
        else:
            check_library(parts, errors)
        return None
    if parts.algorithm is None:
        if "algorithm" not in parts.has:
            errors.append(
                SpecError(
                    index.value(()),
                    "the spec does not say what it describes",
                    "add `algorithm: <name>`, or `library: <name>` for a file "
                    "of shared definitions",
                )
            )
        return None
    for key in ("prefill", "steps", "capture", "outputs"):
        if key not in parts.has:
            errors.append(
                SpecError(
                    index.value(()),
                    f"algorithm `{parts.algorithm}` is missing `{key}`",
                    _MISSING_HINTS[key],
                )
            )
    if "steps" in parts.has and not parts.steps and ("file", "partial") not in parts.broken:
        errors.append(
            SpecError(
                index.key(("steps",)),
                "`steps` is empty",
                "a decode iteration has at least one step",
            )
        )

    dims, inputs, fields, origin = _merge_imports(parts, libraries, errors)
    if "req_pool_indices" not in inputs and not any(s == "imports" for s, _ in parts.broken):
        errors.append(
            SpecError(
                index.value(()),
                f"algorithm `{parts.algorithm}` declares no engine input `req_pool_indices`",
                "the relay is indexed by request-pool slot: add `inputs: {req_pool_indices: "
                "{dtype: int64, shape: []}}` or import it from a library",
            )
        )
    _check_definitions(parts, dims, errors)
    if not any(s in ("dims", "imports") for s, _ in parts.broken):
        check_rules(parts.rules, dims, errors)  # against every dim, imported ones included
    check_reserved_names(parts, errors, inputs)
    _check_steps(parts, inputs, fields, libraries, errors)
    _check_capture(parts, errors)
    _check_outputs(parts, errors)

    if (
        errors
        or parts.broken
        or parts.prefill is None
        or parts.capture is None
        or parts.outputs is None
    ):
        return None
    return Spec(
        path=parts.path,
        algorithm=parts.algorithm,
        algorithm_loc=index.value(("algorithm",)),
        description=parts.description,
        content_hash=content_hash,
        dims=dims,
        inputs=inputs,
        fields=fields,
        prefill=parts.prefill,
        steps=tuple(step for _, step in parts.steps),
        capture=parts.capture,
        outputs=parts.outputs,
        origin=origin,
        entry_locs=_entry_locs(parts),
        ops=tuple(parts.ops),
        sglang=parts.sglang,
        vllm=parts.vllm,
        staging=parts.staging,
        rules=tuple(parts.rules),
    )


def _entry_locs(parts: Parts) -> dict[tuple[str, str, str], SourceLoc]:
    steps = [(("prefill",), parts.prefill), *parts.steps]
    locs: dict[tuple[str, str, str], SourceLoc] = {}
    for path, step in steps:
        if step is None:
            continue
        for param in step.reads:
            locs[(step.name, "reads", param)] = parts.index.value((*path, "reads", param))
        for i, out in enumerate(step.writes):
            locs[(step.name, "writes", out)] = parts.index.value((*path, "writes", i))
        for field_name in step.stash:
            locs[(step.name, "stash", field_name)] = parts.index.key((*path, "stash", field_name))
    if parts.outputs is not None:
        for phase in ("prefill", "decode"):
            for name in getattr(parts.outputs, phase):
                locs[("outputs", phase, name)] = parts.index.value(("outputs", phase, name))
    return locs


_MISSING_HINTS = {
    "prefill": "add the step that seeds the relay for a new request: `prefill: {name: ..., "
    "op: ..., writes: [...], stash: {...}}`",
    "steps": "add `steps:`, the ordered steps of one decode iteration",
    "capture": "add `capture: {batch_sizes: [1, 2, 4, 8], max_batch_size: 8}`",
    "outputs": "add what the engine reads back: `outputs: {prefill: {next_tokens: "
    "prefill.next_tokens}, decode: {next_tokens: <step>.<output>}}`",
}


def _merge_imports(
    parts: Parts, libraries: dict[str, tuple[Parts, str]], errors: list[SpecError]
) -> tuple[dict[str, Dim], dict[str, Input], dict[str, RelayField], dict[str, str]]:
    dims: dict[str, Dim] = {}
    inputs: dict[str, Input] = {}
    fields: dict[str, RelayField] = {}
    origin: dict[str, str] = {}
    for path, imp in parts.imports:
        if imp.file not in libraries:
            continue
        lib = libraries[imp.file][0]
        for section, merged in (("dims", dims), ("inputs", inputs)):
            for name, entity in getattr(lib, section).items():
                merged.setdefault(name, entity)
        for i, name in enumerate(imp.fields):
            if name not in lib.fields:
                if (("fields", name)) in lib.broken:
                    continue
                errors.append(
                    SpecError(
                        parts.index.value((*path, "fields", i)),
                        f"`{imp.file}` defines no field `{name}`",
                        join_hints(
                            did_you_mean(name, lib.fields), f"it defines {quoted_list(lib.fields)}"
                        ),
                    )
                )
                continue
            if name in fields:
                errors.append(
                    SpecError(
                        parts.index.value((*path, "fields", i)),
                        f"field `{name}` is imported twice",
                        "list it in one import only",
                    )
                )
                continue
            fields[name] = lib.fields[name]
            origin[name] = lib.path
    for section, merged in (("dims", dims), ("inputs", inputs), ("fields", fields)):
        noun = section[:-1]
        for name, entity in getattr(parts, section).items():
            if name in merged:
                errors.append(
                    SpecError(
                        entity.loc,
                        f"{noun} `{name}` is defined here and imported",
                        f"it comes from {merged[name].loc}; remove one definition",
                    )
                )
                continue
            merged[name] = entity
            if section == "fields":
                origin[name] = parts.path
    return dims, inputs, fields, origin  # type: ignore[return-value]


def _check_definitions(parts: Parts, dims: dict[str, Dim], errors: list[SpecError]) -> None:
    """Dims have a value source; shapes name dims; fill values fit their dtype."""
    index = parts.index
    for name, dim in parts.dims.items():
        if dim.default is None and dim.supplied_by is None:
            errors.append(
                SpecError(
                    dim.loc,
                    f"dim `{name}` has no value",
                    "give it a `default:` or say where the engine supplies it with `supplied_by:`",
                )
            )
    if any(s == "dims" for s, _ in parts.broken):
        return  # undefined-dim errors would only echo the broken dims section
    known_dims = set(dims)
    for section in ("inputs", "fields"):
        entities: dict[str, Input | RelayField] = getattr(parts, section)
        for name, entity in entities.items():
            for i, entry in enumerate(entity.shape):
                if isinstance(entry, str) and entry not in known_dims:
                    errors.append(
                        SpecError(
                            index.value((section, name, "shape", i)),
                            f"shape of {section[:-1]} `{name}` names undefined dim `{entry}`",
                            join_hints(
                                did_you_mean(entry, dims),
                                f"define it under `dims:`; defined: {quoted_list(dims)}"
                                if dims
                                else "define it under `dims:`",
                            ),
                        )
                    )
    for name, fld in parts.fields.items():
        if fld.owner == "graph" and fld.alloc == "lazy":
            errors.append(
                SpecError(
                    index.value(("fields", name, "alloc")),
                    f"field `{name}` is owned by a captured graph (`owner: graph`), whose buffer "
                    "exists before the relay; it cannot be allocated on first use",
                    "drop `alloc: lazy`",
                )
            )
        if fld.alloc == "lazy" and fld.init != "empty":
            # A lazy field has no buffer, so every row resolves to None, until the first
            # stash of any request: the fill would show only after someone else's stash.
            errors.append(
                SpecError(
                    index.value(("fields", name, "init")),
                    f"field `{name}` is `alloc: lazy`: it has no buffer until its first stash, "
                    "so its rows read None before then and the `init:` is never their value",
                    "drop `alloc: lazy` to allocate it filled with the `init:` value, or drop "
                    "the `init:` and seed the field in the prefill step",
                )
            )
        host = fld.host_mirror
        if host is not None and host.depth <= host.lag:
            errors.append(
                SpecError(
                    index.value(("fields", name, "host_mirror", "ring")),
                    f"the host ring of field `{name}` keeps {host.depth} copies, too few to read "
                    f"one {host.lag} publishes old",
                    f"give it `ring: {host.lag + 1}` or more, or lower `lag`",
                )
            )
        for key in ("init", "poison"):
            value = getattr(fld, key)
            if value is None or value in ("empty", "zeros"):
                continue
            if not fill_fits_dtype(value, fld.dtype):
                hint = _FILL_HINTS.get(fld.dtype, "use a value the dtype can hold")
                if isinstance(value, bool):
                    hint = "use a number; `true` and `false` are for bool fields"
                shown = str(value).lower() if isinstance(value, bool) else repr(value)
                errors.append(
                    SpecError(
                        index.value(("fields", name, key)),
                        f"`{key}` value {shown} of field `{name}` does not fit dtype `{fld.dtype}`",
                        hint,
                    )
                )


_FILL_HINTS = {
    "bool": "use `true` or `false`",
    "int32": "use a whole number within the int32 range",
    "int64": "use a whole number within the int64 range",
}


def _check_steps(
    parts: Parts,
    inputs: dict[str, Input],
    fields: dict[str, RelayField],
    libraries: dict[str, tuple[Parts, str]],
    errors: list[SpecError],
) -> None:
    index = parts.index
    broken_steps = {n for s, n in parts.broken if s == "steps"}
    importable = {n for lib, _ in libraries.values() for n in lib.fields}
    # With a broken definition or import, "not defined" errors would only echo it.
    any_broken_import = any(s == "imports" for s, _ in parts.broken)
    unsure_fields = any_broken_import or any(
        s == "fields" for p in (parts, *(lib for lib, _ in libraries.values())) for s, _ in p.broken
    )
    unsure_inputs = any_broken_import or any(s == "inputs" for s, _ in parts.broken)

    seen: dict[str, Step] = {}
    ordered: list[tuple[Path, Step]] = []
    if parts.prefill is not None:
        ordered.append((("prefill",), parts.prefill))
    ordered.extend(parts.steps)
    stashed_by: dict[str, Step] = {}
    for path, step in ordered:
        is_prefill = path == ("prefill",)
        if step.name in REF_KINDS:
            errors.append(
                SpecError(
                    index.value((*path, "name")),
                    f"`{step.name}` is reserved and cannot name a step",
                    "`relay.` and `input.` prefix relay fields and engine "
                    "inputs; pick another name",
                )
            )
        elif step.name in seen:
            errors.append(
                SpecError(
                    index.value((*path, "name")),
                    f"duplicate step name `{step.name}`",
                    f"first used at {seen[step.name].loc}; step names are unique",
                )
            )
        outputs = set()
        for i, out in enumerate(step.writes):
            if out in outputs:
                errors.append(
                    SpecError(
                        index.value((*path, "writes", i)),
                        f"step `{step.name}` writes `{out}` twice",
                        "list each output once",
                    )
                )
            outputs.add(out)

        for param, ref in step.reads.items():
            loc = index.value((*path, "reads", param))
            kind, name = ref.kind, ref.name
            if kind == "relay":
                if is_prefill:
                    errors.append(
                        SpecError(
                            loc,
                            f"the prefill step reads `{ref}`",
                            "nothing is relayed for a request before its "
                            "prefill; read engine inputs instead",
                        )
                    )
                elif name not in fields and not unsure_fields:
                    hint = did_you_mean(name, fields)
                    if name in importable:
                        hint = join_hints(
                            hint,
                            f"`{name}` is in an imported library: add it "
                            "to that import's `fields:`",
                        )
                    errors.append(
                        SpecError(
                            loc,
                            f"step `{step.name}` reads `{ref}`, which is not a relay field of "
                            f"this algorithm",
                            join_hints(hint, _defined("relay fields", fields)),
                        )
                    )
            elif kind == "input":
                if name not in inputs and not unsure_inputs:
                    errors.append(
                        SpecError(
                            loc,
                            f"step `{step.name}` reads `{ref}`, which is not an engine input",
                            join_hints(
                                did_you_mean(name, inputs),
                                _defined("inputs", inputs) or "declare it under `inputs:`",
                            ),
                        )
                    )
            else:
                _check_step_ref(step, ref, ref.source, name, loc, seen, broken_steps, errors)

        for field_name, out in step.stash.items():
            loc = index.key((*path, "stash", field_name))
            if field_name not in fields:
                if not unsure_fields:
                    errors.append(
                        SpecError(
                            loc,
                            f"step `{step.name}` stashes into `{field_name}`, which is not a "
                            "relay field of this algorithm",
                            join_hints(
                                did_you_mean(field_name, fields), _defined("relay fields", fields)
                            ),
                        )
                    )
            elif field_name in stashed_by and not is_prefill:
                errors.append(
                    SpecError(
                        loc,
                        f"relay field `{field_name}` is stashed twice",
                        f"also stashed by step `{stashed_by[field_name].name}`"
                        "; one step writes each field",
                    )
                )
            elif not is_prefill:
                stashed_by[field_name] = step
            if out not in outputs:
                errors.append(
                    SpecError(
                        index.value((*path, "stash", field_name)),
                        f"step `{step.name}` stashes `{out}`, which it does not write",
                        join_hints(
                            did_you_mean(out, outputs),
                            f"add it to `writes:`; it writes {quoted_list(step.writes)}"
                            if step.writes
                            else "add it to `writes:`",
                        ),
                    )
                )
        if step.name not in REF_KINDS:
            seen.setdefault(step.name, step)


def _check_step_ref(
    step: Step,
    ref: Ref,
    source: str,
    output: str,
    loc,
    seen: dict[str, Step],
    broken_steps: set[str],
    errors: list[SpecError],
) -> None:
    producer = seen.get(source)
    if producer is None:
        if source in broken_steps:
            return
        errors.append(
            SpecError(
                loc,
                f"step `{step.name}` reads `{ref}`, but no earlier step is named `{source}`",
                join_hints(
                    did_you_mean(source, [*seen, *REF_KINDS]),
                    "steps run in order and read what earlier steps wrote; engine inputs "
                    "are `input.<name>`, relay fields `relay.<field>`",
                ),
            )
        )
        return
    if output not in producer.writes:
        errors.append(
            SpecError(
                loc,
                f"step `{step.name}` reads `{ref}`, but step `{source}` does not write `{output}`",
                join_hints(
                    did_you_mean(output, producer.writes),
                    f"`{source}` writes {quoted_list(producer.writes)}"
                    if producer.writes
                    else None,
                ),
            )
        )
        return
    if step.placement == "host" and producer.placement == "device":
        errors.append(
            SpecError(
                loc,
                f"host step `{step.name}` reads `{ref}`, produced on the device by `{source}`",
                "host steps run before the captured graph and feed it; make "
                f"`{step.name}` a device step or read relay fields instead",
            )
        )


def _defined(what: str, names) -> str | None:
    names = list(names)
    return f"{what}: {quoted_list(names)}" if names else None


def _check_capture(parts: Parts, errors: list[SpecError]) -> None:
    capture = parts.capture
    if capture is None:
        return
    sizes = capture.batch_sizes
    index = parts.index
    if not sizes:
        errors.append(
            SpecError(
                index.value(("capture", "batch_sizes")),
                "`batch_sizes` is empty",
                "list at least one batch size",
            )
        )
        return
    for i in range(1, len(sizes)):
        if sizes[i] <= sizes[i - 1]:
            errors.append(
                SpecError(
                    index.value(("capture", "batch_sizes", i)),
                    f"batch sizes must be strictly ascending: {sizes[i]} follows {sizes[i - 1]}",
                    "sort them and drop repeats",
                )
            )
            break
    if max(sizes) > capture.max_batch_size:
        errors.append(
            SpecError(
                index.value(("capture", "max_batch_size")),
                f"`max_batch_size` {capture.max_batch_size} is below the "
                f"largest captured batch size {max(sizes)}",
                "raise `max_batch_size` or drop the larger buckets",
            )
        )


# The engine reads these `outputs:` names; `tokens` and `counts` come together.
_REQUIRED_OUTPUTS = ("next_tokens",)
_MULTI_TOKEN_OUTPUTS = ("tokens", "counts")


def _check_outputs(parts: Parts, errors: list[SpecError]) -> None:
    """`outputs:` names step outputs that exist, and holds what the engine reads."""
    outputs = parts.outputs
    if outputs is None:
        return
    index = parts.index
    # Steps that did not validate: references to them would only echo their errors.
    unsure = {n for s, n in parts.broken if s == "steps"}
    phases: dict[str, list[Step]] = {
        "prefill": [parts.prefill] if parts.prefill is not None else [],
        "decode": [step for _, step in parts.steps],
    }
    for phase, steps in phases.items():
        entries = getattr(outputs, phase)
        by_name = {step.name: step for step in steps}
        whole = ("steps", "*") not in parts.broken and (
            phase == "decode" or parts.prefill is not None
        )
        for name, ref in entries.items():
            loc = index.value(("outputs", phase, name))
            producer = by_name.get(ref.source)
            if ref.kind != "step":
                errors.append(
                    SpecError(
                        loc,
                        f"`outputs.{phase}.{name}` is `{ref}`, "
                        f"{'a relay field' if ref.kind == 'relay' else 'an engine input'}",
                        "outputs name what a step computed (`<step>.<output>`); for a relay "
                        "field, name the output of the step that stashes it",
                    )
                )
                continue
            if producer is None:
                if not whole or ref.source in unsure:
                    continue
                where = "the prefill step" if phase == "prefill" else "the decode `steps:`"
                hint = join_hints(
                    did_you_mean(ref.source, by_name),
                    f"`outputs.{phase}` reads the outputs of {where}: {quoted_list(by_name)}"
                    if by_name
                    else None,
                )
                errors.append(
                    SpecError(
                        loc,
                        f"`outputs.{phase}.{name}` is `{ref}`, but there is no "
                        f"{'prefill' if phase == 'prefill' else 'decode'} step "
                        f"named `{ref.source}`",
                        hint,
                    )
                )
                continue
            if ref.name not in producer.writes:
                errors.append(
                    SpecError(
                        loc,
                        f"`outputs.{phase}.{name}` is `{ref}`, but step `{ref.source}` does not "
                        f"write `{ref.name}`",
                        join_hints(
                            did_you_mean(ref.name, producer.writes),
                            f"`{ref.source}` writes {quoted_list(producer.writes)}"
                            if producer.writes
                            else "add it to the step's `writes:`",
                        ),
                    )
                )
        for required in _REQUIRED_OUTPUTS:
            if required not in entries:
                errors.append(
                    SpecError(
                        index.key(("outputs", phase)),
                        f"`outputs.{phase}` has no `{required}`",
                        f"the engine reads `{required}`, the "
                        f"{'first' if phase == 'prefill' else 'last'} new token of each "
                        f"request, after every {phase} step: add "
                        f"`{required}: <step>.<output>`",
                    )
                )
    present = [n for n in _MULTI_TOKEN_OUTPUTS if n in outputs.decode]
    if len(present) == 1:
        missing = next(n for n in _MULTI_TOKEN_OUTPUTS if n not in present)
        errors.append(
            SpecError(
                index.value(("outputs", "decode", present[0])),
                f"`outputs.decode` has `{present[0]}` but no `{missing}`",
                "a step that emits several tokens per request reports them as `tokens` "
                "[bs, K] with `counts` [bs]; give both, or neither for one token per step",
            )
        )
    for name in _MULTI_TOKEN_OUTPUTS:
        if name in outputs.prefill:
            errors.append(
                SpecError(
                    index.key(("outputs", "prefill", name)),
                    f"`outputs.prefill.{name}` is a decode output",
                    "a prefill emits one token per request (`next_tokens`); move it to "
                    "`outputs.decode`",
                )
            )
