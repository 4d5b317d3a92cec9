"""The engine target: the relay module of one algorithm, generated from its relay plan.

The output reads like careful hand-written code: a provenance header, one line per field
tied to its spec line and saying which steps write and read it, shapes and dtypes in
comments, and a list of the library fields the algorithm leaves out. Everything shared
lives in the hand-written, versioned runtime (:mod:`relayc.runtime.relay`, with its one
fused kernel): the module checks that runtime's version when it is imported. Output is
byte-for-byte deterministic: everything iterates in spec order, and nothing
machine-specific (absolute paths, timestamps) is written.
"""

from __future__ import annotations

import math
import textwrap

from relayc.compiler.output import comment_text
from relayc.compiler.stepgen import generate_steps
from relayc.plan.model import RelayPlan, ValueType
from relayc.plan.support import TargetSupport, unsupported
from relayc.runtime.fields import RelayField
from relayc.runtime.relay import RUNTIME_VERSION
from relayc.specs.errors import SpecErrors

GENERATED_MARK = "@" + "generated"  # split so this file is not itself marked generated

# What the engine target implements. Staging holds by construction: every engine decode
# iteration resolves its draft input from the relay slot alone. Not implemented: a
# captured graph owning a field's buffer, and host copies read publishes late (a ring).
ENGINE_TARGET = TargetSupport(
    target="engine",
    constructs=frozenset(
        {
            "alloc: lazy",
            "publish: early",
            "host_mirror: true",
            "staging",
            "placement: host",
            "export",
        }
    ),
    # The shared ops relayc.engine implements (tests/plan/test_plan.py holds this list to the
    # engine's registry); an algorithm's own ops (its module's, or a plugin's) come with
    # their implementations.
    ops=frozenset(
        {
            "accept_chain",
            "accept_chain_block",
            "accept_tree",
            "build_tree",
            "compact_accepted_kv",
            "mtp_select",
            "ngram_prefill",
            "sample",
            "target_decode",
            "target_prefill",
            "target_verify",
            "target_verify_aux",
        }
    ),
    notes={
        "staging": "every engine decode iteration fills its draft input from the relay "
        "slot alone, so a staged request needs nothing more",
    },
    alternative="compile it for SGLang (`relayc compile --target sglang`)",
)


def check_engine_target(plan: RelayPlan) -> None:
    """Raise located SpecErrors for whatever ``plan`` uses that the engine lacks."""
    errors = unsupported(plan, ENGINE_TARGET)
    if errors:
        raise SpecErrors(errors)


def pylit(value: object) -> str:
    """A Python literal of a spec value that evaluates to it (``inf`` and ``nan`` included)."""
    if isinstance(value, float) and not math.isfinite(value):
        if math.isnan(value):
            return 'float("nan")'
        return 'float("inf")' if value > 0 else '-float("inf")'
    if isinstance(value, str):
        return string_literal(value)
    if isinstance(value, tuple):
        items = [pylit(v) for v in value]
        return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"
    return repr(value)


def string_literal(text: str) -> str:
    """A double-quoted Python literal of ``text`` (the formatter's quote style): quotes and
    backslashes escaped, anything unprintable as its escape sequence."""
    escaped = {"\\": "\\\\", '"': '\\"'}
    body = "".join(escaped.get(ch, ch) if ch.isprintable() else repr(ch)[1:-1] for ch in text)
    return f'"{body}"'


def _where(loc_text: str) -> str:
    return comment_text(loc_text)


def header(spec_path: str, spec_hash: str, out_dir: str) -> str:
    return (
        f"# {GENERATED_MARK} by relayc from {comment_text(spec_path)} (spec hash {spec_hash}).\n"
        "# Do not edit: change the spec, then run\n"
        f"#     relayc compile {comment_text(spec_path)} -o {comment_text(out_dir)}\n"
        "# Layout: the spec's constants (FIELDS: what is relayed, who writes and reads each\n"
        "# field; DIM_DEFAULTS), RelayPayload (one iteration's relay values), FutureMap (the\n"
        "# per-request buffers: stash / publish / resolve, over the hand-written runtime\n"
        "# relayc.runtime.relay and its one fused kernel), then PrefillStep and DecodeStep\n"
        "# (the spec's steps, calling the engine's op implementations). Comments name the\n"
        "# spec line each block comes from and the `[rows, *row shape] dtype` of each value.\n"
    )


def _field_literal(f: RelayField) -> str:
    extra = ""
    if f.alloc != "eager":
        extra += f", alloc={pylit(f.alloc)}"
    if f.init != "empty":
        extra += f", init={pylit(f.init)}"
    if f.poison is not None:
        extra += f", poison={pylit(f.poison)}"
    if f.host_mirror is not None:
        extra += ", host_mirror=HostMirror()"  # the engine implements the lag-0 mirror only
    if f.publish != "stash":
        extra += f", publish={pylit(f.publish)}"
    if f.export:
        extra += ", export=True"
    shape = pylit(tuple(f.shape))
    return (
        f"RelayField({pylit(f.name)}, {pylit(f.dtype)}, {shape}{extra}, origin={pylit(f.origin)})"
    )


def _field_story(plan: RelayPlan, f: RelayField) -> list[str]:
    """Comment lines: where the field is defined, who writes it and who reads it."""
    use = plan.use(f.name)
    writers = []
    if use.seeded_by_prefill:
        stash = next(s for s in plan.prefill.stashes if s.field == f.name)
        writers.append(f"the prefill ({stash.loc.path}:{stash.loc.line})")
    if use.stashed_by:
        step = plan.step(use.stashed_by)
        stash = next(s for s in step.stashes if s.field == f.name)
        when = "publishes" if stash.early else "stashes"
        writers.append(f"`{step.name}` {when} {stash.output} ({stash.loc.path}:{stash.loc.line})")
    row = ValueType(f.dtype, f.shape).rows_text("pool")
    head = comment_text(f"{f.origin} {f.name} {row}")
    if not writers and not use.readers:
        return [head, "  written and read by the engine only (`export: true`)"]
    readers = ", ".join(f"`{r}`" for r in use.readers) or "the engine only (`export: true`)"
    return [
        head,
        *_wrapped(f"written by {', '.join(writers) or 'the engine only'}", "  "),
        *_wrapped(f"read by {readers}", "  "),
    ]


def _wrapped(text: str, indent: str, width: int = 88) -> list[str]:
    """Comment text wrapped to fit the line length once indented in the module."""
    return textwrap.wrap(
        comment_text(text),
        width,
        initial_indent=indent,
        subsequent_indent=indent + "  ",
        break_on_hyphens=False,
        break_long_words=False,
    )


def generate_relay_module(plan: RelayPlan, out_dir: str = "relayc/generated") -> str:
    """Source of the engine relay module of ``plan`` (before formatting); raises located
    SpecErrors when the plan uses what the engine target does not implement.

    Spec text (descriptions, docs, paths) appears only in comments (escaped by
    :func:`comment_text`) and string literals; spec names appear only as attribute names,
    keyword arguments and string literals, never as local variables of generated methods.
    """
    check_engine_target(plan)
    fields = plan.fields
    lines: list[str] = [header(plan.spec_path, plan.spec_hash, out_dir)]
    w = lines.append
    w(f'"""Relay state of the `{plan.algorithm}` algorithm, generated by relayc from its spec.\n')
    w("DESCRIPTION holds the spec's description. Import this module from the engine; it")
    w("never touches CUDA at import time and needs only torch and relayc.runtime (Triton")
    w("for the fused path).")
    w('"""\n')
    w("from __future__ import annotations\n")
    w("from collections.abc import Callable, Mapping")
    w("from dataclasses import dataclass")
    w("from typing import Any\n")
    w("import torch\n")
    mirrored = any(f.host_mirror for f in fields)
    w(f"from relayc.runtime.fields import {'HostMirror, ' if mirrored else ''}RelayField")
    w("from relayc.runtime.relay import FutureMapBase, require_runtime")
    w("from relayc.runtime.rules import DimRule\n")
    w(
        f"require_runtime({RUNTIME_VERSION}, __name__)  # the runtime this module was generated for\n"
    )
    w(f"ALGORITHM = {string_literal(plan.algorithm)}")
    w(f"DESCRIPTION = {string_literal(plan.description)}")
    w(f"SPEC_HASH = {string_literal(plan.spec_hash)}")
    if plan.staging is not None:
        where = f"{plan.staging.loc.path}:{plan.staging.loc.line}"
        staged = (
            f"{where} staging: {plan.staging.text}; the engine: {ENGINE_TARGET.notes['staging']}."
        )
        for line in _wrapped(staged, " ", 95):
            w(f"#{line}")
    w("# The relayed fields, in spec order (the order of every generated list): where each")
    w("# is defined, its buffer `[pool, *row] dtype`, the steps that write and read it.")
    w("FIELDS: tuple[RelayField, ...] = (")
    for f in fields:
        for line in _field_story(plan, f):
            w(f"    # {line}")
        w(f"    {_field_literal(f)},")
    w(")")
    if plan.absent:
        w("# Not relayed: fields the imported libraries define but this spec does not import")
        w("# (its `imports: fields:`), so they cross no iteration boundary here:")
        listed = ", ".join(f"{a.name} ({a.loc.path}:{a.loc.line})" for a in plan.absent)
        for line in _wrapped(listed, "   ", 94):
            w(f"#{line}")
    w("# Dim -> default size (None: the engine must bind it); comments say who supplies it.")
    w("DIM_DEFAULTS: dict[str, int | None] = {")
    for dim in plan.dims:
        if dim.supplied_by:
            w(f"    # supplied by: {comment_text(dim.supplied_by)}")
        w(f"    {pylit(dim.name)}: {dim.default!r},")
    w("}")
    w("# The spec's `rules:` between dims (text, why, where): the engine checks each when it")
    w("# binds the dims it names (relayc.runtime.rules.check_dim_rules).")
    w("DIM_RULES: tuple[DimRule, ...] = (")
    for rule in plan.rules:
        w(f"    DimRule({pylit(rule.text)}, {pylit(rule.message)}, {pylit(rule.origin)}),")
    w(")")
    w("# The spec's `capture:` buckets, for the engine's graph runner.")
    w(f"CAPTURE_BATCH_SIZES: tuple[int, ...] = {pylit(plan.capture.batch_sizes)}")
    w(f"MAX_CAPTURE_BATCH_SIZE = {pylit(plan.capture.max_batch_size)}\n\n")

    w("@dataclass")
    w("class RelayPayload:")
    w('    """One iteration\'s relay values for a batch; a field left None is not written."""\n')
    for f in fields:
        row = ValueType(f.dtype, f.shape).rows_text()
        w(f"    # {row}: {comment_text(f.doc)}")
        w(f"    {f.name}: torch.Tensor | None = None")
    w("\n")
    _future_map(w, plan)
    w("\n")
    w(generate_steps(plan))
    return "\n".join(lines).rstrip() + "\n"


def _future_map(w, plan: RelayPlan) -> None:
    fields = plan.fields
    w("class FutureMap(FutureMapBase):")
    w('    """Relay buffers of `ALGORITHM`, indexed by request-pool slot (slot 0 pads).\n')
    w("    stash(indices, payload) writes the non-None fields of a payload into rows")
    w("    `indices`; publish() writes the early-published fields and records the publish")
    w("    event; resolve(indices) gathers every field for those rows. Buffers live in")
    w("    `self.buffers[field]`. FutureMapBase.write / read copy with one fused kernel")
    w("    launch on CUDA (or backend='triton'), else one index_copy_ / index_select per")
    w("    field; bad calls raise RelayError.")
    w('    """\n')
    w("    ALGORITHM = ALGORITHM")
    w("    FIELDS = FIELDS")
    w("    DIM_DEFAULTS = DIM_DEFAULTS\n")
    w("    def stash(self, indices: torch.Tensor, payload: RelayPayload) -> None:")
    w('        """Write every non-None payload field into rows `indices`."""')
    w("        try:")
    w("            values = (")
    for f in fields:
        w(f"                payload.{f.name},  # {ValueType(f.dtype, f.shape).rows_text()}")
    w("            )")
    w("        except AttributeError:")
    w("            raise self.call_error(indices, payload, RelayPayload) from None")
    w("        self.write(indices, values)")
    w("")
    if plan.early:
        names = ", ".join(f"`{f.name}`" for f in plan.early)
        # Positional-only parameters and **values: a field may be called `self` or `indices`.
        w("    def publish(self, indices: torch.Tensor, /, **values: torch.Tensor) -> None:")
        w(
            f'        """Write the early-published fields ({names}), then record the publish event."""'
        )
        w("        try:")
        w("            payload = RelayPayload(**values)")
        w("        except TypeError:")
        w("            raise self.payload_error(values, RelayPayload) from None")
        w("        self.stash(indices, payload)")
        w("        self.record_publish()")
        w("")
    w("    def resolve(self, indices: torch.Tensor) -> RelayPayload:")
    w('        """Gather every relay field for rows `indices` (None: lazy, never stashed)."""')
    w("        rows = self.read(indices)  # in FIELDS order")
    w("        return RelayPayload(")
    for i, f in enumerate(fields):
        w(f"            {f.name}=rows[{i}],  # {ValueType(f.dtype, f.shape).rows_text()}")
    w("        )")
    for f in plan.mirrored:
        w("")
        w(f"    def resolve_{f.name}_cpu(self, indices_cpu: torch.Tensor) -> torch.Tensor:")
        w(f'        """Host copy of `{f.name}` rows, after the publish event (pinned on CUDA)."""')
        w(f"        return self.host_copy({pylit(f.name)}, indices_cpu)")
    names = {f.name for f in plan.mirrored}
    if "new_seq_lens" in names and "seq_lens" not in names:
        w("")
        w("    # SGLang's name for the host copy of the new sequence lengths.")
        w("    resolve_seq_lens_cpu = resolve_new_seq_lens_cpu")
