"""The SGLang target: a drop-in with SGLang 0.5.23's relay surface, from several specs.

`relayc compile --target sglang SPEC... -o DIR` writes `DIR/overlap_utils.py`, a
drop-in for the relay half of `sglang/srt/managers/overlap_utils.py`: `RelayPayload`
(with `from_draft_input` / `from_ngram`), `FutureMap(device, spec_algo,
req_to_token_pool, needs_cpu_seq_lens=True, needs_confidence_relay=False)`,
`resolve_forward_inputs(batch, future_map)` and `install()`. `FutureMap(...)` returns
the class generated for the relayc algorithm that SGLang's `spec_algo` maps to. Beside
it go the modules it imports, prefixed `relayc_relay_` so that they cannot collide with
SGLang's own when copied next to its overlap_utils.py: `relayc_relay_base.py` (the
FutureMap behaviour), `relayc_relay_state.py` (the relay's records, the buffers a
captured graph owns, the confidence relay) and `relayc_relay_kernels.py` (the fused
Triton copy kernel over the specs' fields and its host side).

What is generated from the specs: the relay fields, each once (specs importing one
common.yaml field share it), one class per algorithm holding only what differs between
algorithms (its fields, which of them the stash writes and the overlap resolve gathers,
which SGLang would read back but the spec does not relay, which rows SGLang holds flat,
and what the spec's constructs declare: a host ring (`host_mirror: {lag, ...}`, DSPARK's
confidence), buffers a captured graph owns (`owner: graph`), staged inputs (`staging:`)),
`RelayPayload`, and the fused kernels over the union of the fields
(`emit_triton_relay`). What is SGLang's and so fixed here: the names (buffer attributes,
payload fields, draft-input attributes), which of a payload's fields SGLang reads back per
algorithm, and that n-gram draft inputs hold their rows flat. The behaviour (stash,
resolve, publish, the host mirror, events, debug checks) is written once in
`sglang_base.py`, driven by those class attributes, and `sglang_state.py`; each is
pasted verbatim into its own module, so the drop-in imports nothing from relayc.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from relayc.compiler.codegen import GENERATED_MARK, pylit, string_literal
from relayc.compiler.output import Output, comment_text, format_source
from relayc.compiler.targets import sglang_base, sglang_state
from relayc.compiler.targets.sglang_names import DropInNaming, check_drop_in_names
from relayc.compiler.triton_relay import RelayBuffer, emit_triton_relay
from relayc.graph.passes import FieldLayout, RelayLayout, analyse
from relayc.runtime import fused
from relayc.specs.errors import SourceLoc, SpecError, SpecErrors
from relayc.specs.loader import Spec, load_spec
from relayc.specs.schema import HostMirror

MODULE_NAME = "overlap_utils.py"
SGLANG_VERSION = "0.5.23"
# The drop-in's other modules. The fixed ones are their templates pasted whole; the
# kernels module depends on the specs (the union of their fields).
KERNELS_MODULE = "relayc_relay_kernels"
TEMPLATES: dict[str, ModuleType] = {
    "relayc_relay_base": sglang_base,
    "relayc_relay_state": sglang_state,
}

SGLANG_PAYLOAD = sglang_state.SGLANG_PAYLOAD  # SGLang's RelayPayload fields, in its order
# The relayc algorithms SGLang's algorithms map to, and, per algorithm, the payload
# fields SGLang 0.5.23 reads back into the next iteration: a spec that does not relay
# one of these would silently lose it, so its stash refuses the field. Other fields a
# spec does not relay are dropped, as SGLang drops them (n-gram relays only its accept
# rows; STANDALONE and multi-layer EAGLE gate hidden states off).
SGLANG_READS_BACK: dict[str, tuple[str, ...]] = {
    "none": ("bonus_tokens",),
    "eagle": (
        "bonus_tokens",
        "topk_p",
        "topk_index",
        "hidden_states",
        "draft_probs",
        "dsa_topk_indices",
    ),
    # SGLang's FutureMap relays EAGLE3 exactly as EAGLE (same buffers, `is_eagle()`); what
    # differs lives in the worker: topk_index holds draft-vocabulary ids, hidden_states the
    # head's own [hidden] output, and the three-layer features never cross an iteration.
    "eagle3": (
        "bonus_tokens",
        "topk_p",
        "topk_index",
        "hidden_states",
        "draft_probs",
        "dsa_topk_indices",
    ),
    "eagle_multilayer": ("bonus_tokens", "topk_p", "topk_index", "draft_probs", "dsa_topk_indices"),
    "standalone": ("bonus_tokens", "topk_p", "topk_index", "draft_probs", "dsa_topk_indices"),
    "ngram": ("accept_tokens", "accept_lens"),
    # need_topk() is False for the block drafters, and spec_need_hidden_states() too for
    # DFLASH and DSPARK; any algorithm relays draft_probs a payload carries.
    "dflash": ("bonus_tokens", "draft_probs", "dsa_topk_indices"),
    "dspark": ("bonus_tokens", "draft_probs", "dsa_topk_indices"),
    "uno": ("bonus_tokens", "hidden_states", "draft_probs", "dsa_topk_indices"),
}
# Algorithms whose SGLang draft input holds multi-element rows flattened ([bs * row]):
# NgramVerifyInput; its row width is the attribute named here per dim.
FLAT_ROW_ALGORITHMS = {"ngram": {"num_draft_tokens": "draft_token_num"}}
# SGLang's FutureMap publishes exactly these: new_seq_lens with a host copy the host read
# waits for, and DSPARK's confidence to a host ring read late (publish(..., confidence=),
# resolve_confidence_cpu).
SGLANG_PUBLISHED = ("new_seq_lens", "confidence")
SGLANG_HOST_MIRRORED = "new_seq_lens"
SGLANG_HOST_RING = "confidence"
# Optional fields whose buffer SGLang creates at the first stash carrying them, flagging a
# draft input by whether it exists (its flag attribute, e.g. make_staged_spec_input's).
SGLANG_LAZY = dict(sglang_state.SGLANG_GATED_READS)
# The fields SGLang's FutureRelayBuffers can hold for a captured graph (`owner: graph`).
SGLANG_ADOPTABLE = tuple(sglang_state.SGLANG_ADOPTED_BUFFERS)
# SpeculativeAlgorithm's members and the NEXTN alias: names a plugin cannot register.
SGLANG_BUILTINS = (
    "NONE",
    "EAGLE",
    "EAGLE3",
    "FROZEN_KV_MTP",
    "STANDALONE",
    "NGRAM",
    "DFLASH",
    "UNO",
    "DSPARK",
    "NEXTN",
)


@dataclass(frozen=True)
class SGLangAlgorithm:
    """One spec as the SGLang target sees it."""

    spec: Spec
    layout: RelayLayout

    @property
    def name(self) -> str:
        return self.spec.algorithm

    @property
    def plugin(self) -> str | None:
        """The SGLang plugin name (upper case, as SGLang registers it), if it is one."""
        return None if self.spec.sglang is None else self.spec.sglang.plugin.upper()

    @property
    def fields(self) -> tuple[FieldLayout, ...]:
        """The fields the FutureMap's buffers relay (a host ring owns its own buffer)."""
        return tuple(f for f in self.layout.fields if not _host_ring(f))

    @property
    def stashed(self) -> tuple[FieldLayout, ...]:
        return tuple(f for f in self.fields if f.publish != "early")

    @property
    def host_rings(self) -> tuple[tuple[FieldLayout, HostMirror], ...]:
        return tuple(
            (f, f.host_mirror)
            for f in self.layout.fields
            if f.host_mirror is not None and _host_ring(f)
        )


def _host_ring(f: FieldLayout) -> bool:
    """Whether `f` is relayed to the host late, from a ring (`host_mirror: {lag: 1+}`)."""
    return f.host_mirror is not None and f.host_mirror.lag > 0


def compile_sglang(
    spec_paths: Sequence[str | Path], out_dir: str | Path, *, ops: Sequence[str] = ()
) -> list[Output]:
    """Generate the SGLang drop-in of ``spec_paths`` (``ops``: more user-op modules): its
    files, `overlap_utils.py` first; raises SpecErrors (all of them)."""
    algorithms = []
    errors: list[SpecError] = []
    for path in spec_paths:
        try:
            spec = load_spec(path, ops=ops)
            algorithms.append(SGLangAlgorithm(spec, analyse(spec).analysis["layout"]))
        except SpecErrors as exc:
            errors.extend(exc.errors)
    if not errors:
        errors = check_algorithms(algorithms)
    if errors:
        raise SpecErrors(errors)
    shown_dir = Path(out_dir).as_posix()
    sources = {
        MODULE_NAME: generate_sglang_module(algorithms, shown_dir),
        f"{KERNELS_MODULE}.py": generate_kernels_module(algorithms, shown_dir),
        **{f"{name}.py": pasted_module(template) for name, template in TEMPLATES.items()},
    }
    # Spec names that land on names the emitted drop-in already uses (sglang_names.py).
    naming = DropInNaming(_class_name, sglang_state.buffer_name, (*SGLANG_PAYLOAD, "new_seq_lens"))
    relayed = [(a.spec, [f.name for f in a.fields]) for a in algorithms]
    if errors := check_drop_in_names(sources, relayed, naming):
        raise SpecErrors(errors)
    return [
        Output(Path(out_dir) / name, format_source(text, name)) for name, text in sources.items()
    ]


def _where(algorithm: SGLangAlgorithm, field: str | None = None) -> SourceLoc:
    if field is not None:
        return algorithm.spec.fields[field].loc
    return SourceLoc(algorithm.spec.path, 1, 1)


def check_algorithms(algorithms: Sequence[SGLangAlgorithm]) -> list[SpecError]:
    """What the SGLang surface cannot express, located at the spec entry responsible."""
    errors: list[SpecError] = []
    seen: dict[str, SGLangAlgorithm] = {}
    dtypes: dict[str, tuple[str, SGLangAlgorithm]] = {}
    plugins: dict[str, SGLangAlgorithm] = {}
    for algo in algorithms:
        plugin = algo.plugin
        if plugin is not None and algo.spec.sglang is not None:
            where = algo.spec.sglang.loc
            if plugin in SGLANG_BUILTINS:
                errors.append(
                    SpecError(
                        where,
                        f"`{plugin}` is one of SGLang's built-in algorithms, which plugins "
                        "cannot register",
                        "give the plugin its own name (the one passed to register_algorithm)",
                    )
                )
            elif plugin in plugins:
                errors.append(
                    SpecError(
                        where,
                        f"plugin `{plugin}` is also relayed by {plugins[plugin].spec.path}",
                        "one spec per registered plugin",
                    )
                )
            plugins[plugin] = algo
        elif algo.name not in SGLANG_READS_BACK:
            errors.append(
                SpecError(
                    _where(algo),
                    f"the SGLang target has no SGLang algorithm for `{algo.name}`",
                    f"name the algorithm one of {', '.join(SGLANG_READS_BACK)}, or relay a "
                    "plugin registered with SGLang: `sglang: {plugin: NAME}`",
                )
            )
        if algo.name in seen:
            errors.append(
                SpecError(
                    _where(algo),
                    f"algorithm `{algo.name}` is also compiled from {seen[algo.name].spec.path}",
                    "pass one spec per algorithm",
                )
            )
        seen[algo.name] = algo
        staging = algo.spec.staging
        if staging is not None and (algo.name in FLAT_ROW_ALGORITHMS or algo.name == "none"):
            errors.append(
                SpecError(
                    staging.loc,
                    "SGLang stages a request as an EagleDraftInput holding its future indices; "
                    f"`{algo.name}`'s draft input is not one",
                    "drop `staging:` from this spec",
                )
            )
        for f in algo.layout.fields:
            if f.publish == "early" and f.name not in SGLANG_PUBLISHED:
                errors.append(
                    SpecError(
                        _where(algo, f.name),
                        f"SGLang's FutureMap.publish carries only {', '.join(SGLANG_PUBLISHED)}, "
                        f"not `{f.name}`",
                        "publish it with the stash (`publish: stash`)",
                    )
                )
            host = f.host_mirror
            if host is not None and host.lag == 0 and f.name != SGLANG_HOST_MIRRORED:
                errors.append(
                    SpecError(
                        _where(algo, f.name),
                        f"SGLang keeps a host copy the host read waits for only of "
                        f"{SGLANG_HOST_MIRRORED}, not of `{f.name}`",
                        "drop `host_mirror` from it",
                    )
                )
            if host is not None and host.lag > 0:
                if f.name != SGLANG_HOST_RING:
                    errors.append(
                        SpecError(
                            _where(algo, f.name),
                            f"SGLang relays to the host late (`lag: {host.lag}`) only "
                            f"`{SGLANG_HOST_RING}` (publish(..., confidence=), "
                            f"resolve_confidence_cpu), not `{f.name}`",
                            f"name the field `{SGLANG_HOST_RING}`, or use `host_mirror: true`",
                        )
                    )
                elif f.dtype == "model":
                    errors.append(
                        SpecError(
                            _where(algo, f.name),
                            f"SGLang relays `{f.name}` to the host as float32, not the model dtype",
                            "declare it `dtype: float32`",
                        )
                    )
                elif f.publish != "early":
                    errors.append(
                        SpecError(
                            _where(algo, f.name),
                            f"SGLang copies `{f.name}` to the host when it is published with "
                            "the lengths, but the spec stashes it",
                            "mark it `publish: early`",
                        )
                    )
            if f.name in SGLANG_LAZY and f.alloc != "lazy":
                errors.append(
                    SpecError(
                        _where(algo, f.name),
                        f"SGLang creates the buffer of `{f.name}` at the first stash carrying it "
                        f"and sets a draft input's `{SGLANG_LAZY[f.name]}` by whether it exists; "
                        "an eager buffer would flag rows never written",
                        "declare it `alloc: lazy`",
                    )
                )
            adoptable = f.name in SGLANG_ADOPTABLE and f.dtype == "int64" and not f.shape
            if f.owner == "graph" and not adoptable:
                errors.append(
                    SpecError(
                        _where(algo, f.name),
                        "SGLang's FutureRelayBuffers holds only the int64 [pool] buffers of "
                        f"{' and '.join(SGLANG_ADOPTABLE)} for a captured graph, not `{f.name}` "
                        f"({f.dtype} [{_shape(f)}])",
                        "drop `owner: graph`: the relay allocates the buffer",
                    )
                )
            if f.dtype == "bool":
                errors.append(
                    SpecError(
                        _where(algo, f.name),
                        f"the SGLang target's debug poisoning needs a numeric dtype; `{f.name}` "
                        "is bool",
                        "relay it as int32",
                    )
                )
            other = dtypes.setdefault(f.name, (f.dtype, algo))
            if other[0] != f.dtype:
                errors.append(
                    SpecError(
                        _where(algo, f.name),
                        f"relay field `{f.name}` is {f.dtype} here but {other[0]} in "
                        f"{other[1].spec.path}; one SGLang module holds one buffer layout per field",
                        "declare it with the same dtype in every spec",
                    )
                )
            flat = FLAT_ROW_ALGORITHMS.get(algo.name)
            if flat is not None and f.publish != "early" and f.shape:
                if len(f.shape) != 1 or f.shape[0] not in flat:
                    errors.append(
                        SpecError(
                            _where(algo, f.name),
                            f"SGLang's `{algo.name}` draft input holds rows flat, sized by "
                            f"{', '.join(flat)}; `{f.name}` has row [{_shape(f)}]",
                            f"shape it [{next(iter(flat))}] or make it a scalar",
                        )
                    )
    return errors


def _shape(f: FieldLayout) -> str:
    return ", ".join(str(d) for d in f.shape)


def _class_name(algorithm: str) -> str:
    return "".join(part.capitalize() for part in algorithm.split("_")) + "FutureMap"


def _union(algorithms: Sequence[SGLangAlgorithm]) -> list[FieldLayout]:
    fields: dict[str, FieldLayout] = {}
    for algo in algorithms:
        for f in algo.fields:
            fields.setdefault(f.name, f)
    return list(fields.values())


_pylit = pylit
_q = string_literal


def _consume_once(f: FieldLayout) -> bool:
    # Rows that read as poison until written must be rewritten between reads; lazy
    # fields are exempt because SGLang re-reads them (staging refreshes only the bonus).
    return f.alloc == "eager" and (f.init == "empty" or f.init == f.poison)


def header(algorithms: Sequence[SGLangAlgorithm], out_dir: str) -> str:
    paths = comment_text(" ".join(a.spec.path for a in algorithms))
    lines = [
        f"# {GENERATED_MARK} by relayc (target sglang, SGLang {SGLANG_VERSION}) from:",
        *(
            f"#     {comment_text(a.spec.path)} (spec hash {a.spec.content_hash})"
            for a in algorithms
        ),
        "# Do not edit: change the specs, then run",
        f"#     relayc compile --target sglang {paths} -o {comment_text(out_dir)}",
    ]
    return "\n".join(lines) + "\n"


def generate_sglang_module(algorithms: Sequence[SGLangAlgorithm], out_dir: str) -> str:
    """`overlap_utils.py`: SGLang's names, the payload, the relay fields and a class per
    algorithm; the behaviour it imports from the fixed sibling modules."""
    union = _union(algorithms)
    lines: list[str] = [header(algorithms, out_dir)]
    w = lines.append
    names = ", ".join(f"`{a.name}`" for a in algorithms)
    w(f'"""Relay state for SGLang {SGLANG_VERSION}, generated by relayc for {names}.\n')
    w("A drop-in for the relay of `sglang/srt/managers/overlap_utils.py`: `RelayPayload`,")
    w("`FutureMap`, `resolve_forward_inputs` and the rest of SGLang's names, with its")
    w("signatures (see relayc's docs/sglang.md for pointing SGLang at it). The behaviour lives")
    w("in the `relayc_relay_*.py` modules beside this one, which go wherever it goes. Needs")
    w("only torch (and Triton on CUDA); importing it never touches CUDA.")
    w('"""\n')
    w("from __future__ import annotations\n")
    w("from dataclasses import dataclass")
    flat = any(a.name in FLAT_ROW_ALGORITHMS for a in algorithms)
    w(f"from typing import {'Any, ClassVar' if flat else 'Any'}\n")
    w("import torch\n")
    base = ["FutureMap", "offer_future_relay_buffers", "relay_algorithm"]
    base += ["resolve_forward_inputs", "install_relay"]
    state = ["FutureRelayBuffers", "HostRing", "RelayDebugError", "RelayError", "RelayField"]
    w(_sibling_imports({"relayc_relay_base": base, "relayc_relay_state": state}))
    classes = [_class_name(a.name) for a in algorithms]
    public = [*base[:-1], *state, "RelayPayload", "install", *classes]
    w("__all__ = [")
    for name in sorted(public):
        w(f"    {_q(name)},")
    w("]\n\n")
    _payload(w, algorithms, union)
    w("\n")
    field_names = _field_table(w, algorithms)
    for algo in algorithms:
        w("\n")
        _algorithm_class(w, algo, field_names)
    w("\n")
    w("def install() -> None:")
    w('    """Point SGLang at this drop-in: its FutureMap, RelayPayload, resolve_forward_inputs,')
    w("    FutureRelayBuffers and offer_future_relay_buffers replace SGLang's in")
    w("    `sglang.srt.managers.overlap_utils` and in every SGLang module that already imported")
    w("    them. Run it in each SGLang process before the scheduler starts (docs/sglang.md: a")
    w('    sitecustomize does that for spawned processes too)."""')
    w("    install_relay(RelayPayload)")
    return "\n".join(lines).rstrip() + "\n"


def _sibling_imports(imports: dict[str, list[str]]) -> str:
    """`from <sibling> import <names>` for each sibling module of the drop-in: relative in a
    package, absolute when its files were copied onto sys.path as top-level modules."""
    lines = [
        "# The drop-in's modules import each other relatively inside a package",
        "# (relayc.sglang_generated, or copied into sglang/srt/managers/), and absolutely",
        "# when copied onto sys.path as top-level modules.",
        "if __package__:",
    ]
    # isort's order: whole modules first, then `from` imports by module name
    ordered = sorted(imports.items(), key=lambda item: (bool(item[1]), item[0]))
    for prefix in (".", ""):
        if not prefix:
            lines.append("else:")
        for module, names in ordered:
            if not names:  # the module itself, under the name it has in the templates
                alias = module.removeprefix("relayc_")
                lines.append(
                    f"    from . import {module} as {alias}"
                    if prefix
                    else f"    import {module} as {alias}"
                )
            else:
                lines.append(f"    from {prefix}{module} import {', '.join(_isort(names))}")
    return "\n".join(lines) + "\n\n"


def _isort(names: Sequence[str]) -> list[str]:
    """`names` in isort's order within one import: constants, classes, then the rest."""
    return sorted(names, key=lambda n: (0 if n.isupper() else 1 if n[0].isupper() else 2, n))


def generate_kernels_module(algorithms: Sequence[SGLangAlgorithm], out_dir: str) -> str:
    """`relayc_relay_kernels.py`: the fused copy kernel over the union of the specs' fields
    and its host side (relayc.runtime.fused)."""
    lines: list[str] = [header(algorithms, out_dir)]
    w = lines.append
    w('"""The fused relay copy kernel of the SGLang drop-in (overlap_utils.py beside it).\n')
    w("One Triton launch per stash and one per resolve, over every relay field of the specs.")
    w("Optional: without Triton `_HAVE_TRITON` is False and the FutureMap indexes with torch.")
    w('"""\n')
    w("from __future__ import annotations\n")
    w("from collections.abc import Sequence")
    w("from typing import Any\n")
    w("import torch\n")
    w("try:")
    w("    import triton")
    w("    import triton.language as tl")
    w("except ImportError:  # the fused kernels are optional; torch indexing remains")
    w("    _HAVE_TRITON = False")
    w("else:")
    w("    _HAVE_TRITON = True\n")
    w(_pasted_fused_copy())
    w(emit_triton_relay([RelayBuffer(f.name, f.dtype) for f in _union(algorithms)]))
    return "\n".join(lines).rstrip() + "\n"


def _pasted_fused_copy() -> str:
    """relayc.runtime.fused (the fused kernels' host side) without its docstring and imports,
    so the generated module needs no relayc at run time."""
    text = Path(fused.__file__).read_text(encoding="utf-8")
    body_start = max(
        n.end_lineno for n in ast.parse(text).body if isinstance(n, ast.Import | ast.ImportFrom)
    )
    body = "\n".join(text.splitlines()[body_start:]).strip("\n")
    return "# The fused kernels' host side (copied from relayc/runtime/fused.py).\n" + body + "\n\n"


def pasted_module(template: ModuleType) -> str:
    """A fixed module of the drop-in: ``template`` below its PASTE_MARKER, with the imports
    above it; those of another template (or the `relay_kernels` stand-in) become imports of
    the sibling module it is pasted into."""
    text = Path(str(template.__file__)).read_text(encoding="utf-8")
    marker = "\n" + template.PASTE_MARKER + "\n"
    head, body = text.split(marker, 1)
    tree = ast.parse(head)
    siblings = {t.__name__: name for name, t in TEMPLATES.items()}
    head_lines = head.splitlines()
    plain: list[int] = []  # line numbers of the other imports, blank lines between kept
    imports: dict[str, list[str]] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module in siblings:
            imports[siblings[node.module]] = [a.name for a in node.names]
        elif isinstance(node, ast.Import | ast.ImportFrom):
            plain += range(node.lineno, (node.end_lineno or node.lineno) + 1)
        elif isinstance(node, ast.AnnAssign) and ast.unparse(node.target) == "relay_kernels":
            imports[KERNELS_MODULE] = []
    kept = [
        line
        for number, line in enumerate(head_lines[plain[0] - 1 : plain[-1]], start=plain[0])
        if number in plain or not line.strip()
    ]
    source = f"relayc/compiler/targets/{Path(str(template.__file__)).name}"
    docstring = ast.get_docstring(tree) or ""
    lines = [
        f"# {GENERATED_MARK} by relayc (target sglang, SGLang {SGLANG_VERSION}) from {source}.",
        "# Do not edit: it is part of the drop-in whose overlap_utils.py says how to regenerate",
        "# it, and goes wherever that goes.",
        "",
        f'"""{docstring.splitlines()[0]}\n',
        "Part of the SGLang drop-in whose public module is overlap_utils.py beside this one.",
        '"""',
        "",
        *kept,
        "",
        _sibling_imports(imports) if imports else "",
        body.strip("\n"),
    ]
    return "\n".join(lines).rstrip() + "\n"


def _payload(w, algorithms: Sequence[SGLangAlgorithm], union: list[FieldLayout]) -> None:
    stashed = [f for f in union if f.publish != "early"]
    extra = [f.name for f in stashed if f.name not in SGLANG_PAYLOAD]
    docs = {
        f.name: f"[{', '.join(['bs', *map(str, f.shape)])}] {f.dtype}: {comment_text(f.doc)}"
        for f in stashed
    }
    by_ngram = {f.name for a in algorithms if a.name == "ngram" for f in a.stashed}
    by_draft = {f.name for a in algorithms if a.name not in ("none", "ngram") for f in a.stashed}
    w("@dataclass")
    w("class RelayPayload:")
    w(
        '    """One iteration\'s relay values for a batch (SGLang\'s fields); None: not written."""\n'
    )
    for i, name in enumerate((*SGLANG_PAYLOAD, *extra)):
        default = "" if i == 0 else " = None"
        doc = docs.get(name, "not relayed by these specs")
        w(f"    # {doc}")
        w(f"    {name}: torch.Tensor | None{default}")
    w("")
    w("    @classmethod")
    w("    def from_ngram(cls, draft_input: Any) -> RelayPayload:")
    w(
        '        """The payload of an NgramVerifyInput (its row fields are flat: reshape to rows)."""'
    )
    if not by_ngram:
        w('        raise NotImplementedError("this module was compiled without an `ngram` spec")')
    else:
        flat = FLAT_ROW_ALGORITHMS["ngram"]
        w("        return cls(")
        w("            bonus_tokens=None,")
        ngram = next(a for a in algorithms if a.name == "ngram")
        for f in ngram.stashed:
            if f.shape:
                w(
                    f"            {f.name}=draft_input.{f.name}.reshape(-1, draft_input.{flat[f.shape[0]]}),"
                )
            else:
                w(f"            {f.name}=draft_input.{f.name},")
        w("        )")
    w("")
    w("    @classmethod")
    w("    def from_draft_input(cls, draft_input: Any) -> RelayPayload:")
    w('        """The payload of an EAGLE-family draft input (absent attributes: None)."""')
    w("        return cls(")
    for name in (*SGLANG_PAYLOAD, *extra):
        if name in by_ngram and name not in by_draft:
            continue
        w(f"            {name}=getattr(draft_input, {_q(name)}, None),")
    w("        )")


def _relay_field(f: FieldLayout) -> str:
    """The RelayField(...) constructor of one spec field (positional, in RelayField's order)."""
    dtype = "None" if f.dtype == "model" else f"torch.{f.dtype}"
    lazy = f.alloc == "lazy" or bool(f.shape)
    poison = "None" if f.poison is None else _pylit(f.poison)  # None: the dtype's default
    args = (_q(f.name), dtype, _q(_shape(f)), str(lazy), _pylit(f.init), poison)
    return f"RelayField({', '.join(args)}, {_consume_once(f)}, {_q(f.origin)})"


def _field_table(w, algorithms: Sequence[SGLangAlgorithm]) -> dict[str, str]:
    """Every distinct relay field of the specs once, as a module constant; returns the
    constant's name per constructor (specs sharing common.yaml share their fields)."""
    names: dict[str, str] = {}
    taken: set[str] = set()
    w("# The relay fields of the specs, each once: RelayField(name, dtype, row shape, lazy,")
    w("# init, debug poison (None: NaN or the integer minimum), consume-once, spec file:line).")
    for algo in algorithms:
        for f in algo.fields:
            ctor = _relay_field(f)
            if ctor in names:
                continue
            const = base = "_" + f.name.upper()
            suffix = 2
            while const in taken:
                const, suffix = f"{base}_{suffix}", suffix + 1
            taken.add(const)
            names[ctor] = const
            w(f"{const} = {ctor}")
    return names


def _tuple(items: Sequence[str]) -> str:
    """A tuple display without a trailing comma past one item, so the formatter joins it."""
    return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"


def _names(names: Sequence[str]) -> str:
    return _tuple([_q(n) for n in names])


def _algorithm_class(w, algo: SGLangAlgorithm, field_names: dict[str, str]) -> None:
    spec = algo.spec
    relayed = [f.name for f in algo.stashed]
    # A plugin's spec decides what is relayed for it: nothing SGLang reads back is refused.
    refused = [n for n in SGLANG_READS_BACK.get(algo.name, ()) if n not in relayed]
    # Non-speculative decoding relays nothing but the input tokens.
    extras = [] if algo.name == "none" else relayed
    w(f"class {_class_name(algo.name)}(FutureMap):")
    w(f'    """Relay of `{algo.name}` (DESCRIPTION: the spec\'s description)."""\n')
    w(f"    DESCRIPTION = {_q(spec.description)}")
    w(f"    ALGORITHM = {_q(algo.name)}")
    w(f"    SPEC = {_q(spec.path)}")
    w(f"    SPEC_HASH = {_q(spec.content_hash)}")
    if algo.plugin is not None:
        w(f"    SGLANG_PLUGIN = {_q(algo.plugin)}  # spec_registry.register_algorithm name")
    w(f"    FIELDS = {_tuple([field_names[_relay_field(f)] for f in algo.fields])}")
    w(f"    STASHED = {_names(relayed)}")
    if extras != relayed:
        w(f"    SPEC_EXTRAS = {_names(extras)}")
    else:
        w("    SPEC_EXTRAS = STASHED")
    if refused:
        w(f"    REFUSED = {_names(refused)}")
    dropped = [n for n in SGLANG_PAYLOAD if n not in (*relayed, *refused)]
    if dropped and algo.plugin is not None:
        w(f"    # Not relayed by this plugin's spec: {', '.join(dropped)}.")
    elif dropped:
        w(f"    # Not relayed, and never read back by SGLang for it: {', '.join(dropped)}.")
    flat = FLAT_ROW_ALGORITHMS.get(algo.name)
    if flat is not None:
        rows = {f.name: flat[f.shape[0]] for f in algo.stashed if f.shape}
        items = ", ".join(f"{_q(k)}: {_q(v)}" for k, v in rows.items())
        w(f"    FLAT_ROWS: ClassVar[dict[str, str]] = {{{items}}}")
    for f, ring in algo.host_rings:
        w(f"    # {comment_text(f.origin)} {f.name}: {comment_text(ring.text)}")
        args = [_q(f.name), f"torch.{f.dtype}", str(ring.lag), str(ring.depth)]
        args += [str(ring.generation_check), _q(f.origin)]
        w(f"    CONFIDENCE_RELAY = HostRing({', '.join(args)})")
    if spec.staging is not None:
        mode = "LAST" if spec.staging.capture_hidden == "last" else "NULL"
        w(f"    STAGING_CAPTURE_HIDDEN = {_q(mode)}  # `staging:`: make_staged_spec_input")
    adopted = [f.name for f in algo.fields if f.owner == "graph"]
    if adopted:
        w(
            "    # Owned by a captured graph (`owner: graph`): adopted from offered FutureRelayBuffers."
        )
        w(f"    ADOPTED = {_names(adopted)}")
    mirrored = any(f.name == SGLANG_HOST_MIRRORED for f in algo.layout.mirrored)
    if mirrored:
        w("    _host_mirrored = True")
