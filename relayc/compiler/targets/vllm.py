"""The vLLM target: the per-request relay of vLLM 0.33.0's Model Runner V2, from several specs.

`relayc compile --target vllm SPEC... -o DIR` writes three files:

- `DIR/vllm_relay.py`, generated: one `<Algorithm>RelayState` class per spec, the
  speculative part of vLLM's `RequestState` (vllm/v1/worker/gpu/states.py) for the vLLM
  method the spec's `vllm:` section names: `last_sampled_tokens`, `num_computed_tokens`
  and its host mirror, `total_len`, `draft_tokens` and, for DSpark, the adaptive-verification
  confidence relay; each buffer allocated by name, with the spec line it comes from. It
  re-exports input_batch.py's five relay updates under vLLM's names.
- `DIR/relayc_vllm_runtime.py`, hand-written: `vllm_runtime.py` beside this file, copied
  unchanged (the five updates and their checks, which depend on no spec).
- `DIR/relayc_vllm_plugin.py`, hand-written: `vllm_plugin.py` beside this file, copied
  unchanged: the `vllm.general_plugins` entry point that installs the two into vLLM (the
  only one of the three that touches vLLM, and only when vLLM calls it).

vLLM's relay differs from SGLang's: its drafter runs at the end of a step and relays the
drafted tokens (`draft_tokens`), where SGLang's relays the draft head's top-k and hidden
state. A spec names which of its relay fields vLLM's tensors hold (`vllm: hooks:`); the
fields vLLM does not carry across steps are listed in each class's docstring.

Identical classes are written once, as the SGLang target does: a class whose fields and
hooks equal an earlier method's derives from that class and says so (EAGLE3's, MTP's and
DFlash's are EAGLE's relay).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from relayc.compiler.codegen import GENERATED_MARK
from relayc.compiler.output import Output, comment_text, format_source
from relayc.compiler.targets import vllm_plugin, vllm_runtime
from relayc.nodes.registry import builtin_op_names
from relayc.plan import RelayField, RelayPlan, plan_spec_file
from relayc.plan.support import TargetSupport, unsupported
from relayc.specs.errors import SpecError, SpecErrors

MODULE_NAME = "vllm_relay.py"
RUNTIME_MODULE = "relayc_vllm_runtime"
PLUGIN_MODULE = "relayc_vllm_plugin"
VLLM_VERSION = vllm_runtime.VLLM_VERSION

# UNO's self-drafting ops: vLLM 0.33.0 has no speculator running them.
UNO_OPS = frozenset({"uno_prefill", "uno_draft"})
# What the vLLM target implements. The relay state is vLLM's whatever the spec's lifetime,
# publish, export and staging settings say (they shape SGLang's FutureMap); a host step
# (n-gram matching on the host) is what MRv2 does not run. The ops are those of the
# algorithms MRv2 runs: UNO's self-drafting has no speculator in vLLM 0.33.0.
VLLM_TARGET = TargetSupport(
    target="vllm",
    constructs=frozenset(
        {
            "alloc: lazy",
            "publish: early",
            "host_mirror: true",
            "host_mirror lag",
            "host_mirror ring",
            "host_mirror generation_check",
            "owner: graph",
            "staging",
            "export",
        }
    ),
    ops=builtin_op_names() - UNO_OPS,
    notes={"staging": "vLLM has no staged inputs: the setting is SGLang's and is ignored"},
    alternative="compile with --target sglang",
)

# vLLM's state tensors a spec field can hold, and the field each holds by default.
DEFAULT_HOOKS = {
    "last_sampled_tokens": "bonus_tokens",
    "num_computed_tokens": "new_seq_lens",
    "draft_logits": "draft_probs",
    "confidence": "confidence",
}
# vLLM's speculative methods (`speculative_config.method`) in the order it added them;
# None, no speculation, last.
VLLM_METHODS: tuple[str | None, ...] = ("eagle", "eagle3", "mtp", "dflash", "dspark", None)
# The vLLM methods with an adaptive-verification confidence relay.
CONFIDENCE_METHODS = ("dspark",)
_FUNCTIONS = (
    "combine_sampled_and_draft_tokens",
    "get_num_sampled_and_rejected",
    "post_update",
    "post_update_num_computed_tokens",
    "prepare_pos_seq_lens",
)


@dataclass(frozen=True)
class VLLMAlgorithm:
    """One spec as the vLLM target serves it: its plan and the field each vLLM tensor holds."""

    plan: RelayPlan
    method: str | None
    last_sampled: RelayField
    num_computed: RelayField | None
    draft_logits: RelayField | None
    confidence: RelayField | None

    @property
    def class_name(self) -> str:
        return "".join(part.capitalize() for part in self.plan.algorithm.split("_")) + "RelayState"

    @property
    def elsewhere(self) -> list[str]:
        """Relay fields vLLM's state does not hold."""
        held = (self.last_sampled, self.num_computed, self.draft_logits, self.confidence)
        return [f.name for f in self.plan.fields if f not in held]


def vllm_algorithm(plan: RelayPlan) -> VLLMAlgorithm:
    """The vLLM view of ``plan``; raises SpecErrors naming the spec line that does not fit."""
    loc = plan.vllm_loc or plan.loc
    if plan.vllm_loc is None:
        raise SpecErrors(
            [
                SpecError(
                    plan.loc,
                    f"`{plan.algorithm}` has no `vllm:` section: the vllm target needs the "
                    "vLLM method it runs as",
                    "add `vllm: {method: eagle}` (or eagle3, mtp, dflash, dspark; "
                    "`vllm: {}` for plain decoding)",
                )
            ]
        )
    names = {f.name for f in plan.fields}
    errors: list[SpecError] = []
    hooked: dict[str, RelayField | None] = {}
    for hook, default in DEFAULT_HOOKS.items():
        named = plan.vllm_hooks.get(hook)
        if named is not None and named not in names:
            errors.append(
                SpecError(
                    loc,
                    f"`vllm: hooks: {hook}` names `{named}`, not a relay field of "
                    f"`{plan.algorithm}`",
                    f"name one of {sorted(names)}",
                )
            )
        name = named if named is not None else default
        hooked[hook] = plan.field(name) if name in names else None
    last, computed, draft_logits, confidence = (hooked[h] for h in DEFAULT_HOOKS)
    if last is None and not errors:
        errors.append(
            SpecError(
                loc,
                f"`{plan.algorithm}` relays no field for vLLM's `last_sampled_tokens`",
                "relay `bonus_tokens`, or name the field with `vllm: {hooks: "
                "{last_sampled_tokens: FIELD}}`",
            )
        )
    for hook, f, dtype, shape in (
        ("last_sampled_tokens", last, "int64", ()),
        ("num_computed_tokens", computed, None, ()),
        ("draft_logits", draft_logits, None, ("vocab",)),
        ("confidence", confidence, "float32", None),
    ):
        if f is None:
            continue
        if dtype is not None and f.dtype != dtype:
            errors.append(_misfit(plan, f, hook, f"is {f.dtype}; vLLM's is {dtype}"))
        if shape is not None and f.shape != shape:
            vllms = f"rows {list(shape)}" if shape else "scalars"
            errors.append(_misfit(plan, f, hook, f"has rows {list(f.shape)}; vLLM's are {vllms}"))
        if hook == "num_computed_tokens" and f.dtype not in ("int32", "int64"):
            errors.append(_misfit(plan, f, hook, f"is {f.dtype}; vLLM counts tokens in int32"))
    if draft_logits is not None and plan.vllm_method is None:
        draft_logits = None  # plain decoding has no drafts to sample against
    if confidence is not None and plan.vllm_method not in CONFIDENCE_METHODS:
        confidence = None  # only DSpark's adaptive verification reads confidences
    if errors:
        raise SpecErrors(errors)
    assert last is not None  # an error above otherwise
    return VLLMAlgorithm(plan, plan.vllm_method, last, computed, draft_logits, confidence)


def _misfit(plan: RelayPlan, f: RelayField, hook: str, why: str) -> SpecError:
    return SpecError(
        plan.field_locs[f.name],
        f"field `{f.name}` of `{plan.algorithm}` holds vLLM's `{hook}` but {why}",
        f"give `{f.name}` vLLM's type, or hold `{hook}` in another field "
        f"(`vllm: {{hooks: {{{hook}: FIELD}}}}`)",
    )


def compile_vllm(
    spec_paths: Sequence[str | Path], out_dir: str | Path, *, ops: Sequence[str] = ()
) -> list[Output]:
    """The vLLM relay of ``spec_paths``: its generated `vllm_relay.py`, and the runtime and
    the plugin beside it; raises SpecErrors (all of them)."""
    algorithms: list[VLLMAlgorithm] = []
    errors: list[SpecError] = []
    for path in spec_paths:
        try:
            plan = plan_spec_file(path, ops=list(ops))
            found = unsupported(plan, VLLM_TARGET)
            errors += found
            if not found:
                algorithms.append(vllm_algorithm(plan))
        except SpecErrors as exc:
            errors.extend(exc.errors)
    errors += _duplicates(algorithms)
    if errors:
        raise SpecErrors(errors)
    module = format_source(generate_vllm_module(algorithms, Path(out_dir).as_posix()), MODULE_NAME)
    runtime = Path(vllm_runtime.__file__).read_text(encoding="utf-8")
    plugin = Path(vllm_plugin.__file__).read_text(encoding="utf-8")
    return [
        Output(Path(out_dir) / MODULE_NAME, module),
        Output(Path(out_dir) / f"{RUNTIME_MODULE}.py", runtime),
        Output(Path(out_dir) / f"{PLUGIN_MODULE}.py", plugin),
    ]


def _duplicates(algorithms: Sequence[VLLMAlgorithm]) -> list[SpecError]:
    """Two specs of one vLLM method (vLLM picks its speculator by method name)."""
    errors = []
    seen: dict[str, VLLMAlgorithm] = {}
    for algo in algorithms:
        key = algo.method or "none"
        if key in seen:
            errors.append(
                SpecError(
                    algo.plan.vllm_loc or algo.plan.loc,
                    f"`{algo.plan.algorithm}` runs as vLLM method `{key}`, as "
                    f"`{seen[key].plan.algorithm}` ({seen[key].plan.spec_path}) does",
                    "give each spec its own `vllm: method:`, or compile them separately",
                )
            )
        seen[key] = algo
    return errors


def generate_vllm_module(algorithms: Sequence[VLLMAlgorithm], out_dir: str) -> str:
    lines: list[str] = []
    w = lines.append
    paths = comment_text(" ".join(a.plan.spec_path for a in algorithms))
    w(f"# {GENERATED_MARK} by relayc (target vllm, vLLM {VLLM_VERSION}) from:")
    for a in algorithms:
        w(f"#     {comment_text(a.plan.spec_path)} (spec hash {a.plan.spec_hash})")
    w("# Do not edit: change the specs, then run")
    w(f"#     relayc compile --target vllm {paths} -o {comment_text(out_dir)}")
    names = ", ".join(f"`{a.plan.algorithm}`" for a in algorithms)
    w(f'"""Per-request relay state for vLLM {VLLM_VERSION}\'s Model Runner V2, for {names}.\n')
    w("Each class is the speculative part of vLLM's `RequestState` (vllm/v1/worker/gpu/states.py)")
    w("for one vLLM method; the five functions are input_batch.py's relay updates, from the")
    w(f'hand-written {RUNTIME_MODULE}.py beside this file (relayc\'s docs/vllm.md)."""\n')
    w("from __future__ import annotations\n")
    w("from typing import Any\n")
    w("import numpy as np")
    w("import torch\n")
    w("# The runtime: relative inside a package, absolute when copied onto sys.path.")
    w("if __package__:")
    w(f"    from . import {RUNTIME_MODULE} as runtime")
    w("else:")
    w(f"    import {RUNTIME_MODULE} as runtime\n")
    w(f"runtime.check_version({vllm_runtime.RUNTIME_VERSION}, __name__)\n")
    w("# vLLM's names (vllm/v1/worker/gpu/input_batch.py), with its signatures.")
    for name in _FUNCTIONS:
        w(f"{name} = runtime.{name}")
    w("RelayError = runtime.RelayError\n")
    classes = [a.class_name for a in algorithms]
    exported = sorted([*_FUNCTIONS, "RelayError", "STATES", *classes], key=_isort)
    w(f"__all__ = {exported!r}".replace("'", '"'))
    w("\n")
    emitted: dict[str, dict[str, str]] = {}
    for algo in sorted(algorithms, key=_method_order):
        _state_class(w, algo, emitted)
        w("\n")
    w("# vLLM's `speculative_config.method` (None: no speculation) -> its relay state.")
    w("STATES: dict[str | None, type[Any]] = {")
    for algo in algorithms:
        key = "None" if algo.method is None else f'"{algo.method}"'
        w(f"    {key}: {algo.class_name},")
    w("}")
    return "\n".join(lines).rstrip() + "\n"


def _method_order(algo: VLLMAlgorithm) -> int:
    """Classes in the order vLLM added its methods, so a later method's class can derive
    from an earlier one it equals (EAGLE3's, MTP's and DFlash's from EAGLE's)."""
    known = algo.method in VLLM_METHODS
    return VLLM_METHODS.index(algo.method) if known else len(VLLM_METHODS)


def _isort(name: str) -> tuple[int, str]:
    """Ruff's order of `__all__`: constants, classes, then the rest."""
    return (0 if name.isupper() else 1 if name[0].isupper() else 2, name)


def _where(f: RelayField) -> str:
    """`common.yaml:45` of a field's definition (the folder is in the header)."""
    return comment_text(f.origin.replace("\\", "/").rsplit("/", 1)[-1])


def _doc(text: str) -> str:
    """A spec's doc text safe inside a generated docstring or comment."""
    return comment_text(text).replace('"', "'").replace("\\", "/")


def _state_class(
    w: Callable[[str], None], algo: VLLMAlgorithm, emitted: dict[str, dict[str, str]]
) -> None:
    """One algorithm's class. When its members (fields, hooks and so every method's text)
    equal an earlier class's, it derives from that class and says so, as the SGLang
    target's FutureMaps do: each class stays named, its own buffers readable in one place."""
    plan = algo.plan
    members = _members(algo)
    parent = next((name for name, other in emitted.items() if other == members), None)
    emitted[algo.class_name] = members
    spec = _doc(plan.spec_path.replace("\\", "/").rsplit("/", 1)[-1])
    method = f"`{algo.method}`" if algo.method else "without speculation"
    w(f"class {algo.class_name}{f'({parent})' if parent else ''}:")
    w(f'    """vLLM {method}: the relay of relayc\'s `{plan.algorithm}` ({spec}).\n')
    w(f"    {_doc(plan.description)}")
    if algo.elsewhere:
        listed = ", ".join(f"`{n}`" for n in algo.elsewhere)
        w("")
        w(f"    Relay fields vLLM does not carry across steps: {listed} (its drafter runs")
        w("    at the end of a step and relays the drafted tokens instead).")
    if parent:
        w("")
        w(f"    {', '.join(members)}: as {parent}'s.")
    w('    """\n')
    w(f"    method: str | None = {_doc(repr(algo.method))}")
    if parent is None:
        for text in members.values():
            w("")
            w(text)


def _members(algo: VLLMAlgorithm) -> dict[str, str]:
    """The methods of one algorithm's class, their text by name."""
    members = {"__init__": _init(algo), "add_request": _add_request(algo)}
    if algo.method is not None:
        members["store_draft_tokens"] = _store_draft_tokens()
    if algo.confidence is not None:
        members["record_confidences"] = _record_confidences()
        members["read_stale_confidences"] = _read_stale_confidences()
    return members


def _init(algo: VLLMAlgorithm) -> str:
    plan = algo.plan
    speculative = algo.method is not None
    lines: list[str] = []
    w = lines.append
    w("    def __init__(")
    w("        self,")
    w("        max_num_reqs: int,")
    w("        num_speculative_steps: int,")
    w("        device: torch.device | str,")
    if algo.draft_logits is not None:
        w("        vocab_size: int = 0,")
        w("        draft_logits_dtype: torch.dtype = torch.float32,")
    w("    ) -> None:")
    # The messages name the class and method from self, so a derived class's read right.
    if speculative:
        w("        if num_speculative_steps < 1:")
        w("            raise runtime.RelayError(")
        w(
            '                f"{type(self).__name__}: num_speculative_steps is '
            '{num_speculative_steps}; "'
        )
        w('                f"vLLM\'s `{self.method}` drafts at least 1 token per step"')
        w("            )")
    else:
        w("        if num_speculative_steps != 0:")
        w("            raise runtime.RelayError(")
        w(
            '                f"{type(self).__name__}: num_speculative_steps is '
            '{num_speculative_steps}; "'
        )
        w('                "plain decoding drafts none (give 0)"')
        w("            )")
    w("        self.max_num_reqs = max_num_reqs")
    w("        self.num_speculative_steps = num_speculative_steps")
    last = algo.last_sampled
    w(f"        # {_where(last)} {last.name}: {_doc(last.doc)}")
    w("        # [max_num_reqs, 1] int64")
    w("        self.last_sampled_tokens = torch.zeros(")
    w("            max_num_reqs, 1, dtype=torch.int64, device=device")
    w("        )")
    computed = algo.num_computed
    if computed is not None:
        w(f"        # {_where(computed)} {computed.name}: {_doc(computed.doc)}")
        w("        # [max_num_reqs] int32 (vLLM counts computed tokens, the KV length, in int32)")
    else:
        w(f"        # vLLM's own: `{plan.algorithm}` relays no lengths. [max_num_reqs] int32")
    w(
        "        self.num_computed_tokens = torch.zeros(max_num_reqs, dtype=torch.int32, device=device)"
    )
    w("        # Its host mirror: an upper bound the scheduler reads without waiting.")
    w("        self.num_computed_tokens_np = np.zeros(max_num_reqs, dtype=np.int32)")
    w("        # vLLM's: tokens in all_token_ids (prompt and output). [max_num_reqs] int32")
    w("        self.total_len = torch.zeros(max_num_reqs, dtype=torch.int32, device=device)")
    if speculative:
        w(
            "        # The drafter's tokens, the next step's input. [max_num_reqs, num_speculative_steps]"
        )
        w("        # int64; 0 is vLLM's placeholder until the drafter runs for the slot.")
    else:
        w("        # No drafts: an empty row, as vLLM's with 0 speculative steps.")
    w("        self.draft_tokens = torch.zeros(")
    w("            max_num_reqs, num_speculative_steps, dtype=torch.int64, device=device")
    w("        )")
    logits = algo.draft_logits
    if logits is not None:
        w(f"        # {_where(logits)} {logits.name}: {_doc(logits.doc)}")
        w("        # vLLM's speculator.draft_logits, made when drafts are sampled")
        w("        # (`draft_sample_method: probabilistic`; give vocab_size): each draft step's")
        w("        # pre-temperature logits, read by the next step's rejection sampling.")
        w("        # [max_num_reqs, num_speculative_steps, vocab_size], the model's head dtype")
        w("        self.draft_logits = (")
        w("            torch.zeros(")
        w("                max_num_reqs,")
        w("                num_speculative_steps,")
        w("                vocab_size,")
        w("                dtype=draft_logits_dtype,")
        w("                device=device,")
        w("            )")
        w("            if vocab_size > 0")
        w("            else None")
        w("        )")
    conf = algo.confidence
    if conf is not None:
        ring = conf.host_mirror.text if conf.host_mirror is not None else "none"
        w(f"        # {_where(conf)} {conf.name}: {_doc(conf.doc)}")
        w("        # vLLM's adaptive-verification relay (AdaptiveVerification._confidence_probs):")
        w(
            "        # [max_num_reqs, num_speculative_steps] float32, 1.0 for a new request. Its host"
        )
        w(f"        # copies are vLLM's two (the spec's host ring, {_doc(ring)}, is SGLang's).")
        w("        self.confidence_probs = torch.ones(")
        w("            max_num_reqs, num_speculative_steps, dtype=torch.float32, device=device")
        w("        )")
        w("        self.stale_confidences = [")
        w("            torch.ones(max_num_reqs, num_speculative_steps, dtype=torch.float32)")
        w("            for _ in range(2)")
        w("        ]")
        w("        self.stale_idx = 0  # the host copy budgets read")
        w("        self.pending_resets: list[int] = []  # slots added since the last record")
    w("        # Per slot, since add_request: was a token sampled, were drafts stored (1), for the")
    w("        # placeholder-leak check of combine_sampled_and_draft_tokens. int8: the updates")
    w("        # store into it without a host sync, which bool arithmetic does not allow.")
    w("        self.has_sampled = torch.zeros(max_num_reqs, dtype=torch.int8, device=device)")
    w("        self.has_drafts = torch.zeros(max_num_reqs, dtype=torch.int8, device=device)")
    w("        runtime.register(self, self.last_sampled_tokens, self.draft_tokens)")
    return "\n".join(lines)


def _add_request(algo: VLLMAlgorithm) -> str:
    lines: list[str] = []
    w = lines.append
    w(
        "    def add_request(self, req_idx: int, prefill_len: int, num_computed_tokens: int) -> None:"
    )
    w('        """A new or resumed request in slot `req_idx` (RequestState.add_request)."""')
    w("        self.total_len[req_idx] = prefill_len")
    w("        self.num_computed_tokens[req_idx] = num_computed_tokens")
    w("        self.num_computed_tokens_np[req_idx] = num_computed_tokens")
    if algo.method is not None:
        w("        self.draft_tokens[req_idx] = 0")
    if algo.confidence is not None:
        w("        self.confidence_probs[req_idx] = 1.0")
        w("        self.stale_confidences[self.stale_idx][req_idx] = 1.0")
        w("        self.pending_resets.append(req_idx)")
    w("        self.has_sampled[req_idx] = 0")
    w("        self.has_drafts[req_idx] = 0")
    return "\n".join(lines)


def _store_draft_tokens() -> str:
    return """\
    def store_draft_tokens(self, idx_mapping: torch.Tensor, draft_tokens: torch.Tensor) -> None:
        \"\"\"The drafter's tokens for the batch rows (model_runner's
        `req_states.draft_tokens[idx_mapping] = draft_tokens`).\"\"\"
        if draft_tokens.shape != (idx_mapping.shape[0], self.num_speculative_steps):
            raise runtime.RelayError(
                f"store_draft_tokens(): `draft_tokens` has shape {list(draft_tokens.shape)}, "
                f"expected [{idx_mapping.shape[0]}, {self.num_speculative_steps}] "
                "(one row per request, num_speculative_steps wide)"
            )
        self.draft_tokens[idx_mapping] = draft_tokens
        self.has_drafts[idx_mapping] = 1"""


def _record_confidences() -> str:
    return """\
    def record_confidences(
        self, confidence_probs: torch.Tensor, idx_mapping: torch.Tensor, num_reqs: int
    ) -> None:
        \"\"\"This step's confidences for the batch rows; copied to the host, where a later
        step's draft budget reads them (AdaptiveVerification.record_confidences). The
        copy finishes before this returns: one step late, as vLLM's event wait.\"\"\"
        ready_idx = self.stale_idx ^ 1
        if self.pending_resets:
            self.stale_confidences[ready_idx][self.pending_resets] = 1.0
            self.pending_resets.clear()
        self.stale_idx, write_idx = ready_idx, self.stale_idx
        self.confidence_probs[idx_mapping] = confidence_probs[:num_reqs]
        self.stale_confidences[write_idx].copy_(self.confidence_probs)"""


def _read_stale_confidences() -> str:
    return """\
    def read_stale_confidences(self, slots: np.ndarray) -> np.ndarray:
        \"\"\"The host copy of the slots' confidences a draft budget reads.\"\"\"
        return self.stale_confidences[self.stale_idx].numpy()[slots]"""
