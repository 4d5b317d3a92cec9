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

SGLANG_VERSION = "0.5.23"  # the SGLang whose overlap_utils the target replaces

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
# Per SpeculativeAlgorithm member, the payload fields SGLang 0.5.23 reads back into the
# next iteration: a spec relaying for the member (`sglang: {members: [...]}`) that does not
# relay one of these would silently lose it, so its stash refuses the field. Other fields a
# spec does not relay are dropped, as SGLang drops them (n-gram relays only its accept
# rows; STANDALONE gates hidden states off).
_EAGLE_READS = ("bonus_tokens", "topk_p", "topk_index", "hidden_states", "draft_probs")
SGLANG_READS_BACK: dict[str, tuple[str, ...]] = {
    "NONE": ("bonus_tokens",),
    # SGLang's FutureMap relays EAGLE3 and FROZEN_KV_MTP exactly as EAGLE (`is_eagle()`);
    # what differs lives in the worker: EAGLE3's topk_index holds draft-vocabulary ids,
    # hidden_states the head's own [hidden] output, and the three-layer features never
    # cross an iteration.
    "EAGLE": (*_EAGLE_READS, "dsa_topk_indices"),
    "EAGLE3": (*_EAGLE_READS, "dsa_topk_indices"),
    "FROZEN_KV_MTP": (*_EAGLE_READS, "dsa_topk_indices"),
    "STANDALONE": ("bonus_tokens", "topk_p", "topk_index", "draft_probs", "dsa_topk_indices"),
    "NGRAM": ("accept_tokens", "accept_lens"),
    # need_topk() is False for the block drafters, and spec_need_hidden_states() too for
    # DFLASH and DSPARK; any algorithm relays draft_probs a payload carries.
    "DFLASH": ("bonus_tokens", "draft_probs", "dsa_topk_indices"),
    "DSPARK": ("bonus_tokens", "draft_probs", "dsa_topk_indices"),
    "UNO": ("bonus_tokens", "hidden_states", "draft_probs", "dsa_topk_indices"),
}
# SGLang config flags (`sglang: {when: ...}`) under which it reads fewer fields back:
# multi-layer EAGLE relays the whole top-k and no hidden states (spec_need_hidden_states()).
SGLANG_FLAG_GATES = {"enable_multi_layer_eagle": ("hidden_states",)}
# Members whose SGLang draft input holds multi-element rows flattened ([bs * row]):
# NgramVerifyInput; its row width is the attribute named here per dim.
FLAT_ROW_MEMBERS = {"NGRAM": {"num_draft_tokens": "draft_token_num"}}
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
SGLANG_BUILTINS = (*SGLANG_READS_BACK, "NEXTN")


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
    def members(self) -> tuple[str, ...]:
        """The SpeculativeAlgorithm members it relays for, its fallbacks aside."""
        return (self.plugin,) if self.plugin is not None else self.plan.sglang_members

    @property
    def speculative(self) -> bool:
        return "NONE" not in self.members

    @property
    def flat_rows(self) -> dict[str, str] | None:
        """How its SGLang draft input holds multi-element rows flat (None: as rows)."""
        return next((FLAT_ROW_MEMBERS[m] for m in self.members if m in FLAT_ROW_MEMBERS), None)

    @property
    def reads_back(self) -> tuple[str, ...]:
        """The payload fields SGLang reads back for its members (a plugin's: none, its
        spec decides)."""
        gated = SGLANG_FLAG_GATES.get(self.plan.sglang_when or "", ())
        members = (*self.members, *self.plan.sglang_fallback)
        reads = [n for m in members for n in SGLANG_READS_BACK.get(m, ()) if n not in gated]
        return tuple(dict.fromkeys(reads))

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
    claimed: dict[tuple[str, str | None], SGLangAlgorithm] = {}
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
            if algo.plan.sglang_members or algo.plan.sglang_fallback:
                errors.append(
                    SpecError(
                        where,
                        f"plugin `{plugin}` also lists SGLang members, which are SGLang's own "
                        "algorithms",
                        "drop `members` / `fallback`: a plugin relays for its registered name",
                    )
                )
        elif not algo.members:
            errors.append(
                SpecError(
                    _where(algo),
                    f"the SGLang target has no SGLang algorithm for `{algo.name}`",
                    "name the SpeculativeAlgorithm members it relays for, e.g. `sglang: "
                    f"{{members: [EAGLE]}}` (one of {', '.join(SGLANG_READS_BACK)}), or relay "
                    "a plugin registered with SGLang: `sglang: {plugin: NAME}`",
                )
            )
        errors += _member_errors(algo, claimed)
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
        if staging is not None and (algo.flat_rows is not None or not algo.speculative):
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
            flat = algo.flat_rows
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


def _member_errors(
    algo: SGLangAlgorithm, claimed: dict[tuple[str, str | None], SGLangAlgorithm]
) -> list[SpecError]:
    """Members that are not SGLang's, or that another spec relays under the same flag."""
    errors = []
    where = algo.plan.sglang_plugin_loc or algo.plan.loc
    for member in (*algo.plan.sglang_members, *algo.plan.sglang_fallback):
        if member not in SGLANG_READS_BACK:
            errors.append(
                SpecError(
                    where,
                    f"`{member}` is not a member of SGLang {SGLANG_VERSION}'s SpeculativeAlgorithm",
                    f"name one of {', '.join(SGLANG_READS_BACK)} (a plugin: `plugin: NAME`)",
                )
            )
    for member in algo.plan.sglang_members:
        other = claimed.setdefault((member, algo.plan.sglang_when), algo)
        if other is not algo:
            errors.append(
                SpecError(
                    where,
                    f"SGLang's `{member}` is also relayed by {other.plan.spec_path}"
                    + (f" under `{algo.plan.sglang_when}`" if algo.plan.sglang_when else ""),
                    "list it in one spec's `members` (another may name it in `fallback`)",
                )
            )
    if algo.plan.sglang_when is not None and algo.plan.sglang_when not in SGLANG_FLAG_GATES:
        errors.append(
            SpecError(
                where,
                f"`when: {algo.plan.sglang_when}` is not a flag the SGLang target knows",
                f"use one of {', '.join(SGLANG_FLAG_GATES)}",
            )
        )
    return errors


def _shape(f: RelayField) -> str:
    return ", ".join(str(d) for d in f.shape)
