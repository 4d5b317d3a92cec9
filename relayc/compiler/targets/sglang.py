"""The SGLang target: a drop-in with SGLang 0.5.23's relay surface, from several specs.

`relayc compile --target sglang SPEC... -o DIR` writes two files:

- `DIR/overlap_utils.py`, generated: SGLang's names (`RelayPayload`, `FutureMap`,
  `resolve_forward_inputs`, `install()`, its platform and debug flags and public
  constants) and one FutureMap subclass per algorithm whose `__init__`, `stash` and
  spec-extras resolve name that algorithm's buffers, one plain write or read per field,
  in SGLang's idiom (`self.output_tokens_buf[indices] = payload.bonus_tokens`).
- `DIR/relayc_relay_runtime.py`, hand-written: `sglang_runtime.py` beside this file,
  copied unchanged (what every algorithm shares: the factory, SGLang's length and
  input-token hooks, allocation and its checks, the host ring, `install`). The generated
  module checks its `RUNTIME_VERSION`.

Identical per-algorithm code is emitted once: a class whose members equal an earlier
class's derives from it and writes only what differs (EAGLE3 is EAGLE's relay).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

from relayc.compiler.codegen import GENERATED_MARK, pylit, string_literal
from relayc.compiler.output import Output, comment_text, format_source
from relayc.compiler.targets import sglang_runtime
from relayc.compiler.targets.sglang_checks import (
    SGLANG_HOST_RING,
    SGLANG_LAZY,
    SGLANG_PAYLOAD,
    SGLANG_TARGET,
    SGLANG_VERSION,
    SGLangAlgorithm,
    check_algorithms,
)
from relayc.compiler.targets.sglang_names import DropInNaming, check_drop_in_names
from relayc.plan import RelayField, plan_spec_file
from relayc.plan.support import unsupported
from relayc.specs.errors import SpecError, SpecErrors

MODULE_NAME = "overlap_utils.py"
RUNTIME_MODULE = "relayc_relay_runtime"
# SGLang's ring constants (overlap_utils.CONFIDENCE_RELAY_RING_*), when no spec sets them.
SGLANG_RING = (2, 3)
_q = string_literal


def compile_sglang(
    spec_paths: Sequence[str | Path], out_dir: str | Path, *, ops: Sequence[str] = ()
) -> list[Output]:
    """The SGLang drop-in of ``spec_paths`` (``ops``: more user-op modules): its generated
    `overlap_utils.py` and the runtime beside it; raises SpecErrors (all of them)."""
    algorithms = []
    errors: list[SpecError] = []
    for path in spec_paths:
        try:
            plan = plan_spec_file(path, ops=list(ops))
            errors += unsupported(plan, SGLANG_TARGET)
            algorithms.append(SGLangAlgorithm(plan))
        except SpecErrors as exc:
            errors.extend(exc.errors)
    if not errors:
        errors = check_algorithms(algorithms)
    if errors:
        raise SpecErrors(errors)
    module = generate_sglang_module(algorithms, Path(out_dir).as_posix())
    module = format_source(module, MODULE_NAME)
    sources = {MODULE_NAME: module, f"{RUNTIME_MODULE}.py": runtime_source()}
    # Spec names that land on names the emitted drop-in already uses (sglang_names.py).
    naming = DropInNaming(_class_name, _buf, (*SGLANG_PAYLOAD, "new_seq_lens"), MODULE_NAME)
    relayed = [(a.plan, [f.name for f in a.fields]) for a in algorithms]
    if errors := check_drop_in_names(sources, relayed, naming):
        raise SpecErrors(errors)
    return [Output(Path(out_dir) / name, text) for name, text in sources.items()]


def runtime_source() -> str:
    """The hand-written runtime, byte for byte (it is ruff-formatted where it lives)."""
    return Path(sglang_runtime.__file__).read_text(encoding="utf-8")


def header(algorithms: Sequence[SGLangAlgorithm], out_dir: str) -> str:
    paths = comment_text(" ".join(a.plan.spec_path for a in algorithms))
    lines = [
        f"# {GENERATED_MARK} by relayc (target sglang, SGLang {SGLANG_VERSION}) from:",
        *(
            f"#     {comment_text(a.plan.spec_path)} (spec hash {a.plan.spec_hash})"
            for a in algorithms
        ),
        "# Do not edit: change the specs, then run",
        f"#     relayc compile --target sglang {paths} -o {comment_text(out_dir)}",
    ]
    return "\n".join(lines) + "\n"


# SGLang's public names overlap_utils holds (with the drop-in's errors), for `__all__`.
SGLANG_NAMES = (  # two runs, each in isort's order (classes, then functions)
    "FutureMap",
    "FutureRelayBuffers",
    "RelayPayload",
    "install",
    "resolve_forward_inputs",
    "RelayDebugError",
    "RelayError",
    "ResolvedConfidence",
    "offer_future_relay_buffers",
)
# SGLang's names that the runtime defines: overlap_utils holds them as SGLang's does.
RUNTIME_EXPORTS = (
    "FutureRelayBuffers",
    "RelayDebugError",
    "RelayError",
    "ResolvedConfidence",
    "offer_future_relay_buffers",
    "resolve_forward_inputs",
)


def generate_sglang_module(algorithms: Sequence[SGLangAlgorithm], out_dir: str) -> str:
    """`overlap_utils.py`: SGLang's names, the payload and a class per algorithm."""
    lines: list[str] = [header(algorithms, out_dir)]
    w = lines.append
    names = ", ".join(f"`{a.name}`" for a in algorithms)
    w(f'"""Relay state for SGLang {SGLANG_VERSION}, generated by relayc for {names}.\n')
    w("A drop-in for `sglang/srt/managers/overlap_utils.py`'s relay (relayc's docs/sglang.md);")
    w(f'what the classes share is the hand-written {RUNTIME_MODULE}.py beside it."""\n')
    w("from __future__ import annotations\n")
    w("import sys")
    w("from dataclasses import dataclass")
    w("from typing import Any, ClassVar\n")
    w("import torch\n")
    w("# The runtime: relative inside a package (relayc.sglang_generated, sglang/srt/managers/),")
    w("# absolute when the files were copied onto sys.path as top-level modules.")
    w("if __package__:")
    w(f"    from . import {RUNTIME_MODULE} as runtime")
    w("else:")
    w(f"    import {RUNTIME_MODULE} as runtime\n")
    for name in RUNTIME_EXPORTS:
        w(f"{name} = runtime.{name}")
    w("")
    w("# SGLang's names this module defines or takes from the runtime.")
    w(f"__all__ = {list(SGLANG_NAMES[:5])!r}".replace("'", '"'))
    w(f"__all__ += {list(SGLANG_NAMES[5:])!r}\n".replace("'", '"'))
    w(f"runtime.check_version({sglang_runtime.RUNTIME_VERSION}, __name__)\n")
    w("# SGLang's platform and debug flags, read by the relay when it runs: patching them here")
    w("# (or in SGLang's overlap_utils once install() ran) is honoured, as SGLang honours it.")
    w("_is_cuda = torch.cuda.is_available() and torch.version.cuda is not None")
    w("_is_hip = torch.version.hip is not None")
    w('_is_npu = hasattr(torch, "npu") and torch.npu.is_available()')
    w(
        '_DEBUG_ASSERT = runtime.env_flag("SGLANG_IS_IN_CI")  # poisoned buffers, consume-once checks'
    )
    ring = _module_ring(algorithms)
    w(f"# {ring[2]}")
    w(f"CONFIDENCE_RELAY_RING_LAG = {ring[0]}")
    w(f"CONFIDENCE_RELAY_RING_DEPTH = {ring[1]}\n\n")
    _payload(w, algorithms)
    w("\n")
    shared = _shared_poisons(algorithms)
    members = [_members(algo, ring, shared, algorithms) for algo in algorithms]
    base = _hoisted(members)
    _future_map(w, algorithms, shared, base)
    emitted = {"FutureMap": base}
    stashes: dict[str, tuple[list[str], str]] = {}
    for algo, body in zip(algorithms, members, strict=True):
        w("\n")
        _algorithm_class(w, algo, body, emitted, stashes)
    return "\n".join(lines).rstrip() + "\n"


def _module_ring(algorithms: Sequence[SGLangAlgorithm]) -> tuple[int, int, str]:
    """SGLang's CONFIDENCE_RELAY_RING_LAG / _DEPTH: those of the first spec relaying the
    field publish(..., confidence=) feeds, else SGLang's own."""
    for algo in algorithms:
        for f, ring in algo.host_rings:
            where = f"{comment_text(f.origin)} {f.name}: {comment_text(ring.text)}"
            return ring.lag, ring.depth, f"SGLang's ring constants, from {where}"
    return (*SGLANG_RING, "SGLang's ring constants (no spec here relays to a host ring)")


def _buf(name: str) -> str:
    """SGLang's FutureMap attribute holding relay field `name`."""
    return "output_tokens_buf" if name == "bonus_tokens" else f"{name}_buf"


def _lazy(f: RelayField) -> bool:
    """Made by the first stash carrying it: `alloc: lazy`, or rows whose dims only the
    payload knows (SGLang's constructor learns no dims either)."""
    return f.lazy or bool(f.shape)


def _origin(f: RelayField) -> str:
    """`file:line` of the field's definition, for a docstring (the spec's folder is in the
    class's header comment): no quote or backslash can end the docstring."""
    name = f.origin.replace("\\", "/").rsplit("/", 1)[-1]
    return comment_text(name).replace('"', "'").replace("\\", "/")


def _origin_text(path: str, line: int) -> str:
    """`file:line` of a spec entry, for a comment (the folder is in the class's header)."""
    name = path.replace("\\", "/").rsplit("/", 1)[-1]
    return comment_text(f"{name}:{line}")


def _dims(f: RelayField) -> str:
    return ", ".join(str(d) for d in f.shape)


def _dtype(f: RelayField) -> str:
    return "None" if f.dtype == "model" else f"torch.{f.dtype}"


def _consume_once(f: RelayField) -> bool:
    # Rows that read as poison until written must be rewritten between reads; lazy fields
    # are exempt because SGLang re-reads them (staging refreshes only the bonus token).
    return not _lazy(f) and (f.init == "empty" or f.init == f.poison)


def _payload_fields(algorithms: Sequence[SGLangAlgorithm]) -> list[RelayField]:
    fields: dict[str, RelayField] = {}
    for algo in algorithms:
        for f in algo.stashed:
            fields.setdefault(f.name, f)
    return list(fields.values())


def _payload(w: Callable[[str], None], algorithms: Sequence[SGLangAlgorithm]) -> None:
    stashed = _payload_fields(algorithms)
    extra = [f.name for f in stashed if f.name not in SGLANG_PAYLOAD]
    docs = {
        f.name: f"[{', '.join(['bs', *map(str, f.shape)])}] {f.dtype}: {comment_text(f.doc)}"
        for f in stashed
    }
    flat = [a for a in algorithms if a.flat_rows is not None]  # SGLang's NgramVerifyInput
    by_ngram = {f.name for a in flat for f in a.stashed}
    by_draft = {f.name for a in algorithms if a.speculative and a not in flat for f in a.stashed}
    w("@dataclass")
    w("class RelayPayload:")
    w(
        '    """One iteration\'s relay values for a batch (SGLang\'s fields); None: not written."""\n'
    )
    for i, name in enumerate((*SGLANG_PAYLOAD, *extra)):
        w(f"    # {docs.get(name, 'not relayed by these specs')}")
        w(f"    {name}: torch.Tensor | None{'' if i == 0 else ' = None'}")
    w("")
    w("    @classmethod")
    w("    def from_ngram(cls, draft_input: Any) -> RelayPayload:")
    w('        """An NgramVerifyInput\'s payload (its rows are flat: reshaped to rows)."""')
    ngram = next((a for a in flat if "NGRAM" in a.members), None)
    if ngram is None or ngram.flat_rows is None:
        w('        raise NotImplementedError("this module was compiled without an `ngram` spec")')
    else:
        w("        return cls(")
        w("            bonus_tokens=None,")
        for f in ngram.stashed:
            value = f"draft_input.{f.name}"
            if f.shape:
                value += f".reshape(-1, draft_input.{ngram.flat_rows[str(f.shape[0])]})"
            w(f"            {f.name}={value},")
        w("        )")
    w("")
    w("    @classmethod")
    w("    def from_draft_input(cls, draft_input: Any) -> RelayPayload:")
    w('        """An EAGLE-family draft input\'s payload (absent attributes: None)."""')
    w("        return cls(")
    for name in (*SGLANG_PAYLOAD, *extra):
        if not (name in by_ngram and name not in by_draft):
            w(f"            {name}=getattr(draft_input, {_q(name)}, None),")
    w("        )")


def _future_map(
    w: Callable[[str], None],
    algorithms: Sequence[SGLangAlgorithm],
    shared: dict[str, str],
    base: dict[str, str],
) -> None:
    buffers = [_buf(n) for n in (*SGLANG_PAYLOAD, *(f.name for f in _payload_fields(algorithms)))]
    declared = ("new_seq_lens_buf", "output_tokens_buf", "dsa_topk_indices_buf")  # RelayMap's
    unset = [b for b in dict.fromkeys(buffers) if b not in declared]
    w("class FutureMap(runtime.RelayMap):")
    w('    """SGLang\'s FutureMap: `FutureMap(device, spec_algo, req_to_token_pool, ...)` returns')
    w("    the class below generated for the algorithm `spec_algo` maps to (`algorithm=` picks")
    w('    one by relayc name). `publish`, the length and token resolves: the runtime\'s."""\n')
    w("    ALGORITHMS: ClassVar[dict[str, type]] = {}")
    w("    FLAGS = sys.modules[__name__]  # install() points it at SGLang's overlap_utils")
    for hook, value in shared.items():
        w(f"    {hook} = {value}  # the specs' debug poison")
    w("    # SGLang's buffers; those an algorithm does not relay stay None on its maps.")
    w(f"    {' = '.join(unset)} = None")
    for text in base.values():  # what most algorithms share, once
        w(text)
    w("\n")
    w("def install() -> None:")
    w('    """Point SGLang at this drop-in, in each SGLang process before its scheduler starts')
    w("    (docs/sglang.md: a sitecustomize): SGLang's relay names, in its overlap_utils and in")
    w('    every SGLang module that imported them, become these."""')
    w('    names = ["FutureMap", "RelayPayload", "resolve_forward_inputs", "FutureRelayBuffers"]')
    w('    names.append("offer_future_relay_buffers")')
    w("    runtime.install_relay({name: globals()[name] for name in names}, FutureMap)")


def _class_name(algorithm: str) -> str:
    return "".join(part.capitalize() for part in algorithm.split("_")) + "FutureMap"


def _members(
    algo: SGLangAlgorithm,
    ring: tuple[int, int, str],
    shared: dict[str, str],
    algorithms: Sequence[SGLangAlgorithm],
) -> dict[str, str]:
    """The class body of one algorithm: its attributes and methods' text, by name."""
    members = {
        "attrs": _attributes(algo, shared, algorithms),
        "_make_buffers": _init(algo, ring) or _NO_BUFFERS,
        "_stash": _stash(algo, _refused(algo)),
        "_resolve": _resolve(algo),
    }
    return {k: v for k, v in members.items() if v}


_NO_BUFFERS = "\n    def _make_buffers(self) -> None:\n        return  # none made eagerly"


def _hoisted(members: Sequence[dict[str, str]]) -> dict[str, str]:
    """The `_make_buffers` most algorithms share (the bonus tokens and lengths), written
    once on the base FutureMap."""
    texts = Counter(m["_make_buffers"] for m in members)
    text, count = texts.most_common(1)[0] if texts else ("", 0)
    return {"_make_buffers": text} if count >= 2 else {}


def _refused(algo: SGLangAlgorithm) -> list[str]:
    # A plugin's spec decides what is relayed for it: nothing SGLang reads back is refused.
    stashed = [f.name for f in algo.stashed]
    return [n for n in algo.reads_back if n not in stashed]


def _sglang_members(algo: SGLangAlgorithm, algorithms: Sequence[SGLangAlgorithm]) -> list[str]:
    """The SpeculativeAlgorithm members `algo`'s class relays for: its `members`, and its
    `fallback` members that no spec of the module lists (under no flag)."""
    listed = {m for a in algorithms if a.plan.sglang_when is None for m in a.members}
    return [*algo.members, *(m for m in algo.plan.sglang_fallback if m not in listed)]


def _algorithm_class(
    w: Callable[[str], None],
    algo: SGLangAlgorithm,
    members: dict[str, str],
    emitted: dict[str, dict[str, str]],
    stashes: dict[str, tuple[list[str], str]],
) -> None:
    """One algorithm's class; members equal to its parent's (an earlier class, or the base
    FutureMap: `emitted["FutureMap"]`) are inherited, and a stash that only refuses more
    than the parent's (`stashes`: each class's refusals and writes) calls the parent's."""
    relayed = [f.name for f in algo.fields]
    refused = _refused(algo)
    dropped = [n for n in SGLANG_PAYLOAD if n not in (*relayed, *refused)]
    # Derive from the earlier class sharing the most methods, two at least, so that a
    # class reads as a variant of one it resembles (EAGLE3 of EAGLE, UNO of DFLASH).
    parent = "FutureMap"
    inherited = {k: v for k, v in members.items() if emitted[parent].get(k) == v}
    for name, other in emitted.items():
        same = {k: v for k, v in members.items() if other.get(k) == v}
        methods = len(same.keys() - {"attrs"})
        if other.keys() == members.keys() and methods >= 2 and len(same) > len(inherited):
            parent, inherited = name, same
    cls = _class_name(algo.name)
    emitted[cls] = members
    stashes[cls] = (refused, _stash(algo, []))
    if "_stash" in members and "_stash" not in inherited and parent in stashes:
        parent_refused, parent_writes = stashes[parent]
        if parent_writes == stashes[cls][1] and set(parent_refused) <= set(refused):
            more = [n for n in refused if n not in parent_refused]
            members = {**members, "_stash": _stash_as_parent(more)}
    spec = f"{comment_text(algo.plan.spec_path)} (spec hash {algo.plan.spec_hash})"
    w(f"# {spec}: {comment_text(algo.plan.description)}")
    w(f"class {cls}({parent}):")
    doc = f"Relays {', '.join(f'{f.name} ({_origin(f)})' for f in algo.fields)}."
    for f, _ in algo.host_rings:
        doc += f" Publishes {f.name} ({_origin(f)}) to a host ring (`{SGLANG_HOST_RING}=`)."
    if refused:
        doc += f" Refuses {', '.join(refused)}: SGLang reads it back, the spec does not relay it."
    if dropped:
        why = "the plugin's spec relays none" if algo.plugin else "SGLang never reads them back"
        doc += f" Drops {', '.join(dropped)}: {why}."
    if inherited.keys() - {"attrs"}:
        doc += f" {', '.join(sorted(inherited.keys() - {'attrs'}))}: as {parent}'s."
    w(f'    """{_wrap(doc, 4)}"""\n')
    w(f"    ALGORITHM = {_q(algo.name)}")
    w(f"    SPEC = {_q(algo.plan.spec_path)}")
    for key, text in members.items():
        if key not in inherited:
            w(text)


def _stash_as_parent(refused: list[str]) -> str:
    """A stash writing what the parent's writes, refusing more (UNO's is DFLASH's)."""
    lines = ["    def _stash(self, i: torch.Tensor, payload: RelayPayload) -> None:"]
    lines += [f"        self._refuse({_q(name)}, payload.{name})" for name in refused]
    return "\n" + "\n".join([*lines, "        super()._stash(i, payload)"])


def _wrap(text: str, indent: int, width: int = 92) -> str:
    lines, line = [], ""
    for word in text.split(" "):
        if line and len(line) + 1 + len(word) > width - indent:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    return f"\n{' ' * indent}".join([*lines, line])


def _attributes(
    algo: SGLangAlgorithm, shared: dict[str, str], algorithms: Sequence[SGLangAlgorithm]
) -> str:
    names = [_q(m) for m in _sglang_members(algo, algorithms)]
    members = f"({names[0]},)" if len(names) == 1 else f"({', '.join(names)})"
    loc = algo.plan.sglang_plugin_loc or algo.plan.loc
    where = _origin_text(loc.path, loc.line)
    why = "spec_registry.register_algorithm" if algo.plugin is not None else "members"
    lines = [f"    SGLANG = {members}  # {where} sglang: {why}"]
    if algo.plan.sglang_when is not None:
        lines.append(f"    SGLANG_WHEN = {_q(algo.plan.sglang_when)}  # get_spec()'s flag")
    if algo.plan.staging is not None:
        mode = "LAST" if algo.plan.staging.capture_hidden == "last" else "NULL"
        where = comment_text(str(algo.plan.staging.loc))
        lines.append(f"    STAGING = {_q(mode)}  # {where} staging: make_staged_spec_input")
    for hook, value in _poisons(algo).items():
        if shared.get(hook) != value:
            lines.append(f"    {hook} = {value}  # the spec's debug poison")
    return "\n".join(lines)


def _poisons(algo: SGLangAlgorithm) -> dict[str, str]:
    """The debug poison of the fields SGLang's length and token hooks check."""
    hooks = {"bonus_tokens": "TOKENS_POISON", "new_seq_lens": "LENGTHS_POISON"}
    return {
        hooks[f.name]: pylit(f.poison)
        for f in algo.fields
        if f.name in hooks and f.poison is not None and _consume_once(f)
    }


def _shared_poisons(algorithms: Sequence[SGLangAlgorithm]) -> dict[str, str]:
    """Hook poisons every algorithm relaying the hook's field agrees on: set once, on the
    base class."""
    values: dict[str, set[str]] = {}
    for algo in algorithms:
        for hook, value in _poisons(algo).items():
            values.setdefault(hook, set()).add(value)
    return {hook: v.pop() for hook, v in sorted(values.items()) if len(v) == 1}


def _init(algo: SGLangAlgorithm, ring: tuple[int, int, str]) -> str:
    body = []
    for f in algo.fields:
        if not _lazy(f):
            init, poison = pylit(f.init), "None" if f.poison is None else pylit(f.poison)
            alloc = f"self._buffer({_dtype(f)}, {init}, {poison})"
            body.append(f"self.{_buf(f.name)} = {alloc}")
    adopted = [f for f in algo.fields if f.owner == "graph"]
    if adopted:
        body.append("if (relay := self._adopt()) is not None:  # owned by a captured graph")
        for f in adopted:
            poison = "None" if f.poison is None else pylit(f.poison)
            owned = {"bonus_tokens": "output_tokens"}.get(f.name, f.name)
            body.append(f"    self.{_buf(f.name)} = self._adopted(relay.{owned}, {poison})")
    for f, host in algo.host_rings:
        lag, depth = (
            ("CONFIDENCE_RELAY_RING_LAG", "CONFIDENCE_RELAY_RING_DEPTH")
            if (host.lag, host.depth) == ring[:2]
            else (str(host.lag), str(host.depth))
        )
        args = f"self, torch.{f.dtype}, {lag}, {depth}, {host.generation_check}"
        body.append(f"# {comment_text(f.origin)} {f.name}: {comment_text(host.text)}")
        body.append(f"self.confidence_relay = runtime.HostRing({args})")
    if not body:
        return ""
    head = ["    def _make_buffers(self) -> None:"]
    return "\n" + "\n".join(head + [f"        {line}" for line in body])


def _in_payload_order(algo: SGLangAlgorithm) -> list[RelayField]:
    """The fields a stash writes, in SGLang's payload order (then the spec's own), so that
    algorithms relaying the same fields write and read them in one order and share code."""
    order = {name: i for i, name in enumerate(SGLANG_PAYLOAD)}
    return sorted(algo.stashed, key=lambda f: order.get(f.name, len(order)))


def _stash(algo: SGLangAlgorithm, refused: list[str]) -> str:
    lines = ["    def _stash(self, i: torch.Tensor, payload: RelayPayload) -> None:"]
    for name in refused:
        lines.append(f"        self._refuse({_q(name)}, payload.{name})")
    for f in _in_payload_order(algo):
        value, buf = f"payload.{f.name}", f"self.{_buf(f.name)}"
        write = f"self._write({buf}, i, {value}, {_q(f.name)})"
        if _lazy(f):  # made by the first stash carrying it
            args = [buf, "i", value, _q(f.name), _dtype(f)]
            if sum(_lazy(g) and g.shape == f.shape for g in algo.stashed) > 1:
                args.append(_q(_dims(f)))  # rows that must agree with another field's
            if f.init != "empty":
                args.append(f"init={pylit(f.init)}")
            write = f"{buf} = self._store({', '.join(args)})"
        lines.append(f"        {write}")
    return "\n" + "\n".join(lines)


def _resolve(algo: SGLangAlgorithm) -> str:
    if not algo.speculative:
        return ""  # non-speculative: nothing relayed but the input tokens
    flat = algo.flat_rows is not None
    lines = ["    def _resolve(self, draft_input: Any, i: torch.Tensor) -> None:"]
    names = {f.name for f in algo.stashed}
    for f in _in_payload_order(algo):
        target, buf = f"draft_input.{f.name}", f"self.{_buf(f.name)}"
        if f.name in SGLANG_LAZY and not flat:  # read only for a draft input flagged so
            lines.append(f"        {target} = self._seeds(draft_input, i, True)")
        elif flat and f.shape:  # SGLang's draft input holds these rows flat
            lines.append(f"        {target} = self._gated({buf}, i, {_q(f.name)}).flatten()")
        elif _lazy(f):  # a lazy field no stash carried stays as it is
            lines += [
                f"        if {buf} is not None:",
                f"            {target} = {buf}.index_select(0, i)",
            ]
        else:
            lines.append(f"        {target} = {buf}.index_select(0, i)")
    if "dsa_topk_indices" not in names and not flat:  # refused if a draft input has them
        lines.append("        draft_input.dsa_topk_indices = self._seeds(draft_input, i, False)")
    # Debug mode: rows read must be written again before the next read.
    for f in _in_payload_order(algo):
        if f.name == "bonus_tokens" and _consume_once(f):
            lines.append("        self._consume_tokens(draft_input.bonus_tokens, i)")
        elif _consume_once(f):
            poison = "None" if f.poison is None else pylit(f.poison)
            args = f"{_q(f.name)}, self.{_buf(f.name)}, draft_input.{f.name}, i, {poison}"
            lines.append(f"        self._consume_once({args})")
    return "\n" + "\n".join(lines)
