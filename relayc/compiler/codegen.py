"""Generate the relay module of one algorithm from its analysed graphs.

The output reads like careful hand-written code: a provenance header, one
block per field tied to its spec line, shapes and dtypes in comments. It is
byte-for-byte deterministic: everything iterates in spec order, and nothing
machine-specific (absolute paths, timestamps) is written.
"""

from __future__ import annotations

from relayc.compiler.stepgen import call_lines, generate_steps
from relayc.compiler.triton_relay import RelayBuffer, emit_triton_relay
from relayc.graph.builder import IterationGraphs
from relayc.graph.passes import FieldLayout, RelayLayout

GENERATED_MARK = "@" + "generated"  # split so this file is not itself marked generated


def _row(field: FieldLayout) -> str:
    return ", ".join(["bs", *(str(d) for d in field.shape)])


def _pylit(value: object) -> str:
    if isinstance(value, float) and value != value:
        return 'float("nan")'
    return repr(value)


def _dtype_expr(field: FieldLayout) -> str:
    return "self.model_dtype" if field.dtype == "model" else f"torch.{field.dtype}"


def header(spec_path: str, spec_hash: str, out_dir: str) -> str:
    return (
        f"# {GENERATED_MARK} by relayc from {spec_path} (spec hash {spec_hash}).\n"
        f"# Do not edit: change the spec, then run\n"
        f"#     relayc compile {spec_path} -o {out_dir}\n"
    )


def generate_relay_module(graphs: IterationGraphs, out_dir: str = "relayc/generated") -> str:
    spec = graphs.spec
    layout: RelayLayout = graphs.analysis["layout"]
    fields = layout.fields
    lines: list[str] = [header(spec.path, spec.content_hash, out_dir)]
    w = lines.append
    w(f'"""Relay state of `{spec.algorithm}`: {spec.description or spec.algorithm}\n')
    w("Import this module from the engine; it never touches CUDA at import time.")
    w('"""\n')
    w("from __future__ import annotations\n")
    w("from collections.abc import Callable, Mapping, Sequence")
    w("from dataclasses import dataclass")
    w("from typing import Any\n")
    w("import torch\n")
    w("from relayc.runtime.fused import fused_copy")
    w("from relayc.runtime.relay import FieldInfo, FutureMapBase\n")
    w("try:  # optional: only the fused path (CUDA / backend='triton') uses it")
    w("    import triton")
    w("    import triton.language as tl")
    w("except ImportError:")
    w("    _HAVE_TRITON = False")
    w("else:")
    w("    _HAVE_TRITON = True\n")
    w(f"ALGORITHM = {spec.algorithm!r}")
    w(f"SPEC_HASH = {spec.content_hash!r}")
    w("FIELDS: tuple[FieldInfo, ...] = (")
    for f in fields:
        extra = ""
        if f.alloc != "eager":
            extra += f", alloc={f.alloc!r}"
        if f.init != "empty":
            extra += f", init={_pylit(f.init)}"
        if f.poison is not None:
            extra += f", poison={_pylit(f.poison)}"
        w(f"    FieldInfo({f.name!r}, {f.dtype!r}, {tuple(f.shape)!r}{extra}),  # {f.origin}")
    w(")")
    w("DIM_DEFAULTS: dict[str, int | None] = {")
    for name, dim in spec.dims.items():
        note = f"  # from {dim.supplied_by}" if dim.supplied_by else ""
        w(f"    {name!r}: {dim.default!r},{note}")
    w("}\n\n")

    w("@dataclass")
    w("class RelayPayload:")
    w('    """One iteration\'s relay values for a batch; a field left None is not written."""\n')
    for f in fields:
        w(f"    {f.name}: torch.Tensor | None = None  # [{_row(f)}] {f.dtype}: {f.doc}")
    w("\n")

    w(emit_triton_relay(spec.algorithm, [RelayBuffer(f.name, f.dtype) for f in fields]))
    w("")
    _future_map(w, spec.algorithm, fields, layout)
    w("\n")
    w(generate_steps(graphs))
    return "\n".join(lines).rstrip() + "\n"


def _buffers(fields: tuple[FieldLayout, ...]) -> str:
    return (
        "(" + ", ".join(f"self.{f.name}" for f in fields) + ("," if len(fields) == 1 else "") + ")"
    )


def _names(fields: tuple[FieldLayout, ...]) -> str:
    return "(" + ", ".join(f.name for f in fields) + ("," if len(fields) == 1 else "") + ")"


def _future_map(w, algorithm: str, fields: tuple[FieldLayout, ...], layout: RelayLayout) -> None:
    w("class FutureMap(FutureMapBase):")
    w(f'    """Relay buffers of `{algorithm}`, indexed by request-pool slot (slot 0 pads).\n')
    w("    stash(indices, payload) writes the non-None fields of a payload into rows")
    w("    `indices`; publish() writes the early-published fields and records the publish")
    w("    event; resolve(indices) gathers every field for those rows. On the torch path")
    w("    each field is one index_copy_ / index_select; on the fused path (CUDA, or")
    w("    backend='triton') a stash and a resolve are one Triton launch each.")
    w('    """\n')
    w("    ALGORITHM = ALGORITHM")
    w("    FIELD_INFOS = FIELDS")
    w("    DIM_DEFAULTS = DIM_DEFAULTS\n")
    w("    def __init__(self, req_pool_size: int, device: torch.device | str, **kwargs) -> None:")
    w("        super().__init__(req_pool_size, device, **kwargs)")
    for f in fields:
        if f.alloc == "lazy":
            w(f"        self.{f.name}: torch.Tensor | None = None  # lazy: first stash allocates")
        else:
            w(f"        self.{f.name}: torch.Tensor | None = self.allocate({f.name!r})")
        w(f"        self._row_{f.name} = self.rows[{f.name!r}]  # [{', '.join(map(str, f.shape))}]")
    for f in layout.mirrored:
        w(f"        # pinned host mirror of `{f.name}`, filled after the publish event")
        w(f"        self._{f.name}_host = (")
        w(f'            torch.empty_like(self.{f.name}, device="cpu").pin_memory()')
        w('            if self.device.type == "cuda"')
        w("            else None")
        w("        )")
    w('        if self.backend == "triton":  # one kernel launch per stash and per resolve')
    w("            self.stash = self._stash_fused")
    w("            self.resolve = self._resolve_fused")
    w("")

    # The torch path checks nothing up front: index_copy_ itself rejects a wrong dtype or
    # shape, and the except branch turns that into a clear error (zero cost when all is well).
    w("    def stash(self, indices: torch.Tensor, payload: RelayPayload) -> None:")
    w('        """Write every non-None payload field into rows `indices`."""')
    w("        try:")
    for f in fields:
        w(f"            {f.name} = payload.{f.name}  # [{_row(f)}] {f.dtype}")
        w(f"            if {f.name} is not None:")
        if f.alloc == "lazy":
            w(f"                if self.{f.name} is None:")
            w(f"                    self.{f.name} = self.allocate({f.name!r})")
        w(f"                self.{f.name}.index_copy_(0, indices, {f.name})")
    w("        except (IndexError, RuntimeError) as exc:")
    w("            raise self.call_error(indices, payload) from exc")
    w("        if self.debug:")
    w("            self.mark_written(indices, payload)")
    w("")
    w("    def _stash_fused(self, indices: torch.Tensor, payload: RelayPayload) -> None:")
    w('        """stash() as one fused Triton launch."""')
    w("        self.check_payload(indices, payload)")
    for f in fields:
        if f.alloc == "lazy":
            w(f"        if payload.{f.name} is not None and self.{f.name} is None:")
            w(f"            self.{f.name} = self.allocate({f.name!r})")
    payload_rows = (
        "("
        + ", ".join(f"payload.{f.name}" for f in fields)
        + ("," if len(fields) == 1 else "")
        + ")"
    )
    call_lines(w, "        ", "triton_stash", ["indices", _buffers(fields), payload_rows])
    w("        if self.debug:")
    w("            self.mark_written(indices, payload)")
    w("")

    early = layout.early
    if early:
        params = ", ".join(f"{f.name}: torch.Tensor" for f in early)
        args = ", ".join(f"{f.name}={f.name}" for f in early)
        w(f"    def publish(self, indices: torch.Tensor, {params}) -> None:")
        w('        """Write the early-published fields, then record the publish event."""')
        w(f"        self.stash(indices, RelayPayload({args}))")
        w("        self.record_publish()")
        w("")

    w("    def resolve(self, indices: torch.Tensor) -> RelayPayload:")
    w('        """Gather every relay field for rows `indices` (None: lazy, never stashed)."""')
    w("        if self.debug:")
    w("            self.check_resolve(indices)")
    w("        try:")
    w("            return RelayPayload(")
    for f in fields:
        if f.alloc == "lazy":
            w(f"                {f.name}=None")
            w(f"                if self.{f.name} is None")
            w(f"                else torch.index_select(self.{f.name}, 0, indices),")
        else:
            w(f"                {f.name}=torch.index_select(self.{f.name}, 0, indices),")
    w("            )")
    w("        except (IndexError, RuntimeError) as exc:")
    w("            raise self.call_error(indices) from exc")
    w("")
    w("    def _resolve_fused(self, indices: torch.Tensor) -> RelayPayload:")
    w('        """resolve() as one fused Triton launch."""')
    w("        if self.debug:")
    w("            self.check_resolve(indices)")
    w("        n = indices.shape[0]")
    for f in fields:
        w(f"        {f.name} = (")
        w(
            f"            torch.empty((n, *self._row_{f.name}), dtype=self.{f.name}.dtype, "
            "device=self.device)"
        )
        if f.alloc == "lazy":
            w(f"            if self.{f.name} is not None")
            w("            else None")
        w("        )")
    call_lines(w, "        ", "triton_resolve", ["indices", _buffers(fields), _names(fields)])
    call_lines(w, "        ", "return RelayPayload", [f"{f.name}={f.name}" for f in fields])
    for f in layout.mirrored:
        w("")
        w(f"    def resolve_{f.name}_cpu(self, indices_cpu: torch.Tensor) -> torch.Tensor:")
        w(f'        """Host copy of `{f.name}` rows, after the publish event (pinned on CUDA)."""')
        w(f"        return self.host_copy(self.{f.name}, self._{f.name}_host, indices_cpu)")
    if any(f.name == "new_seq_lens" and f.host_mirror for f in fields):
        w("")
        w("    # SGLang's name for the host copy of the new sequence lengths.")
        w("    resolve_seq_lens_cpu = resolve_new_seq_lens_cpu")
