"""What the SGLang target can express, checked per spec (the SGLang target's compile errors).

SGLang's names are fixed here: which payload fields SGLang 0.5.23 reads back per
algorithm, which fields its call sites publish, mirror, adopt or gate. A spec using a
construct for a field SGLang has no hook for is a located error naming the field.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from relayc.plan import HostMirror, RelayField, RelayPlan
from relayc.plan.support import CONSTRUCTS, TargetSupport
from relayc.specs.errors import SourceLoc, SpecError

# SGLang's RelayPayload fields, in its order.
SGLANG_PAYLOAD = (
    "bonus_tokens",
    "topk_p",
    "topk_index",
    "hidden_states",
    "draft_probs",
    "dsa_topk_indices",
    "accept_tokens",
    "accept_lens",
)
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
SGLANG_HOST_MIRRORED = "new_seq_lens"
SGLANG_HOST_RING = "confidence"
# Optional fields whose buffer SGLang creates at the first stash carrying them, flagging a
# draft input by whether it exists (its flag attribute, e.g. make_staged_spec_input's).
SGLANG_LAZY = {"dsa_topk_indices": "future_dsa_topk_indices_available"}
# The fields SGLang's FutureRelayBuffers can hold for a captured graph (`owner: graph`).
SGLANG_ADOPTABLE = {"new_seq_lens": "new_seq_lens", "bonus_tokens": "output_tokens"}
# What the SGLang target implements: every construct, each for the fields SGLang has a
# hook for (check_algorithms says which); no ops, since SGLang's workers run the steps.
SGLANG_TARGET = TargetSupport(
    target="sglang",
    constructs=frozenset(CONSTRUCTS),
    ops=None,
    notes={
        "host_mirror: true": "the pinned new_seq_lens mirror resolve_seq_lens_cpu reads",
        "host_mirror lag": "the ring `publish(..., confidence=)` fills, resolve_confidence_cpu",
        "owner: graph": "the buffers FutureRelayBuffers offers (lengths, bonus tokens)",
        "staging": "make_staged_spec_input's EagleDraftInput",
    },
)
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
    """One algorithm's relay plan as the SGLang target sees it."""

    plan: RelayPlan

    @property
    def name(self) -> str:
        return self.plan.algorithm

    @property
    def plugin(self) -> str | None:
        """The SGLang plugin name (upper case, as SGLang registers it), if it is one."""
        plugin = self.plan.sglang_plugin
        return None if plugin is None else plugin.upper()

    @property
    def fields(self) -> tuple[RelayField, ...]:
        """The fields the FutureMap's buffers relay (a host ring owns its own buffer)."""
        return tuple(f for f in self.plan.fields if not _host_ring(f))

    @property
    def stashed(self) -> tuple[RelayField, ...]:
        return tuple(f for f in self.fields if not f.early)

    @property
    def host_rings(self) -> tuple[tuple[RelayField, HostMirror], ...]:
        return tuple(
            (f, f.host_mirror)
            for f in self.plan.fields
            if f.host_mirror is not None and _host_ring(f)
        )


def _host_ring(f: RelayField) -> bool:
    """Whether `f` is relayed to the host late, from a ring (`host_mirror: {lag: 1+}`)."""
    return f.host_mirror is not None and f.host_mirror.lag > 0


def _where(algorithm: SGLangAlgorithm, field: str | None = None) -> SourceLoc:
    if field is not None:
        return algorithm.plan.field_locs[field]
    return algorithm.plan.loc


def _ring_field(algo: SGLangAlgorithm) -> str:
    """The field SGLang's `publish(..., confidence=)` hook reaches (`sglang: {hooks:}`)."""
    return algo.plan.sglang_hooks.get(SGLANG_HOST_RING, SGLANG_HOST_RING)


def check_algorithms(algorithms: Sequence[SGLangAlgorithm]) -> list[SpecError]:
    """What the SGLang surface cannot express, located at the spec entry responsible."""
    errors: list[SpecError] = []
    seen: dict[str, SGLangAlgorithm] = {}
    dtypes: dict[str, tuple[str, SGLangAlgorithm]] = {}
    plugins: dict[str, SGLangAlgorithm] = {}
    for algo in algorithms:
        plugin = algo.plugin
        if plugin is not None and algo.plan.sglang_plugin_loc is not None:
            where = algo.plan.sglang_plugin_loc
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
                        f"plugin `{plugin}` is also relayed by {plugins[plugin].plan.spec_path}",
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
                    f"algorithm `{algo.name}` is also compiled from {seen[algo.name].plan.spec_path}",
                    "pass one spec per algorithm",
                )
            )
        seen[algo.name] = algo
        hooked = algo.plan.sglang_hooks.get(SGLANG_HOST_RING)
        if hooked is not None and not any(
            f.name == hooked and _host_ring(f) for f in algo.plan.fields
        ):
            errors.append(
                SpecError(
                    algo.plan.sglang_plugin_loc or algo.plan.loc,
                    f"`hooks: {{{SGLANG_HOST_RING}: {hooked}}}` names no field of this spec "
                    "relayed to the host late",
                    f"name a field with `host_mirror: {{lag: ...}}` (`{hooked}` is "
                    f"{'not relayed' if hooked not in algo.plan.field_locs else 'not one'})",
                )
            )
        staging = algo.plan.staging
        if staging is not None and (algo.name in FLAT_ROW_ALGORITHMS or algo.name == "none"):
            errors.append(
                SpecError(
                    staging.loc,
                    "SGLang stages a request as an EagleDraftInput holding its future indices; "
                    f"`{algo.name}`'s draft input is not one",
                    "drop `staging:` from this spec",
                )
            )
        for f in algo.plan.fields:
            ring = _ring_field(algo)
            if f.publish == "early" and f.name not in (SGLANG_HOST_MIRRORED, ring):
                errors.append(
                    SpecError(
                        _where(algo, f.name),
                        f"SGLang's FutureMap.publish carries only {SGLANG_HOST_MIRRORED} and "
                        f"the host-ring field (`{SGLANG_HOST_RING}=`), not `{f.name}`",
                        "publish it with the stash (`publish: stash`), or map it to the ring: "
                        f"`sglang: {{hooks: {{{SGLANG_HOST_RING}: {f.name}}}}}`",
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
                if f.name != ring:
                    errors.append(
                        SpecError(
                            _where(algo, f.name),
                            f"SGLang relays to the host late (`lag: {host.lag}`) only the field "
                            f"its `{SGLANG_HOST_RING}=` hook maps to (publish(..., "
                            f"confidence=), resolve_confidence_cpu), `{ring}`, not `{f.name}`",
                            f"map it: `sglang: {{hooks: {{{SGLANG_HOST_RING}: {f.name}}}}}`, or "
                            "use `host_mirror: true`",
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
                        f"{other[1].plan.spec_path}; one SGLang module holds one buffer layout per field",
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


def _shape(f: RelayField) -> str:
    return ", ".join(str(d) for d in f.shape)
