# Hand-written: part of relayc's vLLM target, not generated. `relayc compile --target vllm`
# copies this file unchanged beside the vllm_relay.py it generates, as
# relayc_vllm_runtime.py; the generated module checks RUNTIME_VERSION when imported.
"""The vLLM target's runtime: the five relay updates of vLLM 0.33.0's Model Runner V2.

`prepare_pos_seq_lens`, `combine_sampled_and_draft_tokens`, `get_num_sampled_and_rejected`,
`post_update` and `post_update_num_computed_tokens` keep the names, signatures and results of
`vllm/v1/worker/gpu/input_batch.py`'s (each is tested against vLLM's own kernel on the
same inputs), written as plain torch without a host sync, so a CUDA graph can hold them
and vLLM's asynchronous scheduling keeps working. They depend on no spec: what differs per
algorithm is the state they update, the generated `<Algorithm>RelayState` classes.

What they add to vLLM's: the shapes and dtypes of every argument are checked on each call
(an error names the argument and what the state expects), and, when `VALUE_CHECKS` is on
(`RELAYC_VLLM_CHECKS=1`; one host sync per call), the values: a last sampled token or a
draft row read into `input_ids` for a slot that has none yet (a placeholder leaking into a
new or resumed request's input), acceptance counts that would count unaccepted drafts as
computed tokens (inflating `seq_lens`), a request scheduled more drafts than the state holds.
The leak check needs the slot's history, which only a generated state keeps: given vLLM's own
tensors the functions compute the same results and skip it.
"""

from __future__ import annotations

import os
import weakref
from typing import Any, NoReturn, Protocol

import torch

RUNTIME_VERSION = 1
VLLM_VERSION = "0.33.0"


def check_version(generated_for: int, module: str) -> None:
    """Refuse to run generated code against a runtime of another version."""
    if generated_for != RUNTIME_VERSION:
        raise ImportError(
            f"{module} was generated for relayc_vllm_runtime version {generated_for}, but the "
            f"runtime beside it is version {RUNTIME_VERSION} ({__file__}): copy both files from "
            "one `relayc compile --target vllm` run"
        )


def env_flag(name: str) -> bool:
    """`1`/`true`/`yes` is on, `0`/`false`/`no` or unset is off; anything else is an error."""
    value = os.environ.get(name, "0").lower()
    if value in ("1", "true", "yes", "0", "false", "no"):
        return value in ("1", "true", "yes")
    raise ValueError(f'{name}="{value}" is not a boolean: use 1 or 0')


# Value checks read device values on the host: off by default (vLLM's loop never syncs here).
VALUE_CHECKS = env_flag("RELAYC_VLLM_CHECKS")


class RelayError(ValueError):
    """A call into the relay that does not fit the state: a shape, dtype or value."""


class SlotHistory(Protocol):
    """What a generated state keeps per slot for the leak check."""

    has_sampled: torch.Tensor  # [max_num_reqs] int8: 1 once a token was sampled since add_request
    has_drafts: torch.Tensor  # [max_num_reqs] int8: 1 once drafts were stored since add_request


# A generated state's relay tensors -> the state: the functions take vLLM's tensors, not the
# state, so this is how they find a slot's history. Weak, so a dropped state is forgotten.
_OWNERS: dict[int, tuple[weakref.ref[torch.Tensor], weakref.ref[Any]]] = {}


def register(state: SlotHistory, *tensors: torch.Tensor) -> None:
    """Let the functions find ``state``'s slot history from its tensors."""
    for key in [key for key, (tensor, _) in _OWNERS.items() if tensor() is None]:
        del _OWNERS[key]  # a dropped state's entries, whose ids Python may hand out again
    for tensor in tensors:
        _OWNERS[id(tensor)] = (weakref.ref(tensor), weakref.ref(state))


def owner_of(tensor: torch.Tensor) -> SlotHistory | None:
    """The generated state holding ``tensor``, or None (vLLM's own RequestState)."""
    refs = _OWNERS.get(id(tensor))
    if refs is None or refs[0]() is not tensor:
        return None
    state: SlotHistory | None = refs[1]()
    return state


def expect(
    name: str,
    tensor: torch.Tensor,
    dtype: torch.dtype,
    *,
    at_least: int | None = None,
    ndim: int = 1,
    fn: str,
) -> None:
    """Dtype and rank checks, and ``at_least`` rows where given."""
    where = f"{fn}(): `{name}`"
    if tensor.dtype != dtype:
        raise RelayError(f"{where} is {tensor.dtype}, expected {dtype} (vLLM's dtype for it)")
    if tensor.dim() != ndim:
        raise RelayError(f"{where} has shape {list(tensor.shape)}, expected {ndim} dims")
    if at_least is not None and tensor.shape[0] < at_least:
        raise RelayError(f"{where} has {tensor.shape[0]} rows, expected at least {at_least}")


def _masked_store(
    dst: torch.Tensor, index: tuple[torch.Tensor, ...], values: torch.Tensor, mask: torch.Tensor
) -> None:
    """``dst[index] = values`` where ``mask``, without a host sync.

    Boolean indexing would sync to count the rows; instead every row adds ``values - old``
    (masked rows add 0) at its index, masked rows' indices clamped into range. Stores of
    integers only, so the difference is exact.
    """
    safe = tuple(
        torch.where(mask, i, torch.zeros_like(i)).clamp(0, size - 1)
        for i, size in zip(index, dst.shape, strict=False)
    )
    delta = torch.where(
        mask, values.to(dst.dtype) - dst[safe], torch.zeros_like(values, dtype=dst.dtype)
    )
    dst.index_put_(safe, delta, accumulate=True)


def _row_of(cumulative: torch.Tensor, count: int, num_reqs: int) -> torch.Tensor:
    """For each of ``count`` flat positions, the row whose [start, end) of ``cumulative``
    holds it (``num_reqs`` for positions past the last row)."""
    positions = torch.arange(count, device=cumulative.device, dtype=cumulative.dtype)
    return torch.searchsorted(cumulative[1 : num_reqs + 1].contiguous(), positions, right=True)


def _fail(message: str) -> NoReturn:
    raise RelayError(message)


def prepare_pos_seq_lens(
    idx_mapping: torch.Tensor,
    query_start_loc: torch.Tensor,
    num_computed_tokens: torch.Tensor,
    pos: torch.Tensor,
    seq_lens: torch.Tensor,
) -> None:
    """Positions of this step's tokens and each request's sequence length; the rows of
    ``seq_lens`` past the batch become 0 (a full CUDA graph reads them)."""
    fn = "prepare_pos_seq_lens"
    num_reqs = idx_mapping.shape[0]
    expect("query_start_loc", query_start_loc, torch.int32, at_least=num_reqs + 1, fn=fn)
    expect("num_computed_tokens", num_computed_tokens, torch.int32, fn=fn)
    expect("pos", pos, torch.int64, fn=fn)
    expect("seq_lens", seq_lens, torch.int32, at_least=num_reqs, fn=fn)
    computed = num_computed_tokens[idx_mapping]  # [num_reqs] int32
    starts = query_start_loc[:num_reqs]
    query_lens = query_start_loc[1 : num_reqs + 1] - starts
    seq_lens[:num_reqs] = computed + query_lens
    seq_lens[num_reqs:] = 0
    row = _row_of(query_start_loc, pos.shape[0], num_reqs)  # [max_num_tokens]
    in_batch = row < num_reqs
    row = row.clamp(max=max(num_reqs - 1, 0))
    token = torch.arange(pos.shape[0], device=pos.device)
    if num_reqs:
        new_pos = computed[row].to(torch.int64) + token - starts[row]
        pos.copy_(torch.where(in_batch, new_pos, pos))


def combine_sampled_and_draft_tokens(
    input_ids: torch.Tensor,
    idx_mapping: torch.Tensor,
    last_sampled_tokens: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    prefill_len: torch.Tensor,
    draft_tokens: torch.Tensor,
    cu_num_logits: torch.Tensor,
    num_logits: int,
    num_new_sampled_tokens: int = 1,
) -> torch.Tensor:
    """Write each decoding request's last sampled token and its drafts into ``input_ids``;
    return where the logits are (``[num_logits] int64``). Prefill tokens are left alone."""
    fn = "combine_sampled_and_draft_tokens"
    if num_new_sampled_tokens not in (0, 1):
        raise RelayError(
            f"{fn}(): `num_new_sampled_tokens` is {num_new_sampled_tokens}, not 0 or 1"
        )
    num_reqs = idx_mapping.shape[0]
    expect("input_ids", input_ids, torch.int32, fn=fn)
    expect("last_sampled_tokens", last_sampled_tokens, torch.int64, ndim=2, fn=fn)
    expect("query_start_loc", query_start_loc, torch.int32, at_least=num_reqs + 1, fn=fn)
    expect("seq_lens", seq_lens, torch.int32, at_least=num_reqs, fn=fn)
    expect("prefill_len", prefill_len, torch.int32, fn=fn)
    expect("draft_tokens", draft_tokens, torch.int64, ndim=2, fn=fn)
    expect("cu_num_logits", cu_num_logits, torch.int32, at_least=num_reqs + 1, fn=fn)
    device = input_ids.device
    slots = idx_mapping.to(torch.int64)
    logits_per_req = cu_num_logits[1 : num_reqs + 1] - cu_num_logits[:num_reqs]
    query_end = query_start_loc[1 : num_reqs + 1].to(torch.int64)
    logits_start = query_end - logits_per_req
    logits_indices = torch.empty(num_logits, dtype=torch.int64, device=device)
    if num_reqs:
        row = _row_of(cu_num_logits, num_logits, num_reqs).clamp(max=num_reqs - 1)
        local = torch.arange(num_logits, device=device) - cu_num_logits[row]
        logits_indices.copy_(logits_start[row] + local)

    seq_len = seq_lens[:num_reqs]
    decoding = seq_len > prefill_len[slots]
    num_drafts = logits_per_req - num_new_sampled_tokens
    takes_sampled = decoding & (seq_len - logits_per_req >= prefill_len[slots])
    if num_new_sampled_tokens == 0:
        takes_sampled = torch.zeros_like(takes_sampled)
    width = draft_tokens.shape[1]
    step = torch.arange(width, device=device)
    takes_draft = decoding[:, None] & (step[None, :] < num_drafts[:, None])  # [num_reqs, width]
    if VALUE_CHECKS:
        _check_inputs(
            fn,
            last_sampled_tokens,
            draft_tokens,
            slots,
            takes_sampled,
            decoding & (num_drafts > 0),
            num_drafts,
        )
    last = last_sampled_tokens[slots, 0]
    _masked_store(input_ids, (logits_start,), last, takes_sampled)
    draft_pos = query_end[:, None] - num_drafts[:, None] + step[None, :]
    _masked_store(input_ids, (draft_pos,), draft_tokens[slots], takes_draft)
    return logits_indices


def _check_inputs(
    fn: str,
    last_sampled_tokens: torch.Tensor,
    draft_tokens: torch.Tensor,
    slots: torch.Tensor,
    takes_sampled: torch.Tensor,
    takes_drafts: torch.Tensor,
    num_drafts: torch.Tensor,
) -> None:
    """The value checks of `combine_sampled_and_draft_tokens` (one host sync)."""
    width = draft_tokens.shape[1]
    too_many = torch.nonzero(num_drafts > width).flatten().tolist()
    if too_many:
        row = too_many[0]
        _fail(
            f"{fn}(): batch row {row} schedules {int(num_drafts[row])} draft tokens but the "
            f"state holds {width} per request: the drafter's width changed between steps"
        )
    state = owner_of(last_sampled_tokens)
    if state is None:
        return
    for rows, history, what in (
        (takes_sampled, state.has_sampled, "its last sampled token"),
        (takes_drafts, state.has_drafts, "its draft tokens"),
    ):
        leaking = torch.nonzero(rows & (history[slots] == 0)).flatten().tolist()
        if leaking:
            row = leaking[0]
            _fail(
                f"{fn}(): batch row {row} (slot {int(slots[row])}) reads {what} into input_ids, "
                "but none was stored since the request was added: the placeholder the slot "
                "holds would be computed as a real token; schedule drafts only for a request "
                "whose drafter ran, and decode only after its prefill sampled"
            )


def get_num_sampled_and_rejected(
    num_sampled: torch.Tensor,
    seq_lens: torch.Tensor,
    cu_num_logits: torch.Tensor,
    idx_mapping: torch.Tensor,
    prefill_len: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A chunked prefill samples and rejects nothing; otherwise each logit not sampled was
    rejected. Updates ``num_sampled`` in place, as vLLM does."""
    fn = "get_num_sampled_and_rejected"
    num_reqs = idx_mapping.shape[0]
    expect("num_sampled", num_sampled, torch.int32, at_least=num_reqs, fn=fn)
    expect("cu_num_logits", cu_num_logits, torch.int32, at_least=num_reqs + 1, fn=fn)
    chunked_prefill = seq_lens[:num_reqs] < prefill_len[idx_mapping]
    sampled = torch.where(chunked_prefill, 0, num_sampled[:num_reqs])
    logits_per_req = cu_num_logits[1 : num_reqs + 1] - cu_num_logits[:num_reqs]
    num_rejected = torch.empty_like(num_sampled)
    num_rejected[:num_reqs] = torch.where(chunked_prefill, 0, logits_per_req - sampled)
    num_sampled[:num_reqs] = sampled
    return num_sampled, num_rejected


def post_update(
    idx_mapping: torch.Tensor,
    num_computed_tokens: torch.Tensor,
    last_sampled_tokens: torch.Tensor,
    output_bin_counts: torch.Tensor | None,
    sampled_tokens: torch.Tensor,
    num_sampled: torch.Tensor,
    num_rejected: torch.Tensor,
    query_start_loc: torch.Tensor | None,
    all_token_ids: torch.Tensor,
    total_len: torch.Tensor,
    draft_tokens: torch.Tensor | None = None,
    draft_tokens_out: torch.Tensor | None = None,
) -> None:
    """After sampling: store the drafts, the sampled tokens (history, last token, length,
    output counts) and count the accepted tokens as computed. Rows whose slot in
    ``idx_mapping`` is negative are skipped."""
    fn = "post_update"
    num_reqs = idx_mapping.shape[0]
    expect("num_computed_tokens", num_computed_tokens, torch.int32, fn=fn)
    expect("last_sampled_tokens", last_sampled_tokens, torch.int64, ndim=2, fn=fn)
    expect("sampled_tokens", sampled_tokens, sampled_tokens.dtype, at_least=num_reqs, ndim=2, fn=fn)
    expect("num_sampled", num_sampled, torch.int32, at_least=num_reqs, fn=fn)
    expect("num_rejected", num_rejected, torch.int32, at_least=num_reqs, fn=fn)
    expect("all_token_ids", all_token_ids, torch.int32, ndim=2, fn=fn)
    expect("total_len", total_len, torch.int32, fn=fn)
    if query_start_loc is not None:
        expect("query_start_loc", query_start_loc, torch.int32, at_least=num_reqs + 1, fn=fn)
    if (draft_tokens is None) != (draft_tokens_out is None):
        raise RelayError(f"{fn}(): give `draft_tokens` and `draft_tokens_out` together")
    if draft_tokens is not None and draft_tokens_out is not None:
        expect("draft_tokens", draft_tokens, torch.int64, ndim=2, at_least=num_reqs, fn=fn)
        expect("draft_tokens_out", draft_tokens_out, torch.int64, ndim=2, fn=fn)
        if draft_tokens.shape[1] != draft_tokens_out.shape[1]:
            raise RelayError(
                f"{fn}(): this step drafted {draft_tokens.shape[1]} tokens per request but "
                f"the state holds {draft_tokens_out.shape[1]}: the drafter's width changed "
                "between steps"
            )
    device = idx_mapping.device
    valid = idx_mapping >= 0
    slots = idx_mapping.to(torch.int64).clamp(min=0)
    state = owner_of(last_sampled_tokens)
    if draft_tokens is not None and draft_tokens_out is not None:
        draft_step = torch.arange(draft_tokens.shape[1], device=device)
        _masked_store(
            draft_tokens_out,
            (slots[:, None], draft_step[None, :]),
            draft_tokens[:num_reqs],
            valid[:, None],
        )
        if state is not None:
            _masked_store(state.has_drafts, (slots,), torch.ones_like(slots), valid)

    sampled = num_sampled[:num_reqs].to(torch.int64)
    old_total = total_len[slots].to(torch.int64)
    has_sample = valid & (sampled > 0)
    width = sampled_tokens.shape[1]
    last_col = (sampled - 1).clamp(0, width - 1)  # rows sampling nothing store nothing
    last = sampled_tokens[torch.arange(num_reqs, device=device), last_col]
    _masked_store(last_sampled_tokens, (slots, torch.zeros_like(slots)), last, has_sample)
    _masked_store(total_len, (slots,), old_total + sampled, has_sample)
    if state is not None:
        _masked_store(state.has_sampled, (slots,), torch.ones_like(slots), has_sample)

    step = torch.arange(width, device=device)
    new_token = valid[:, None] & (step[None, :] < sampled[:, None])  # [num_reqs, width]
    tokens = sampled_tokens[:num_reqs]
    history_pos = old_total[:, None] + step[None, :]
    _masked_store(all_token_ids, (slots[:, None], history_pos), tokens, new_token)
    if output_bin_counts is not None:
        counted = torch.where(new_token, 1, 0).to(output_bin_counts.dtype)
        output_bin_counts.index_put_(
            (slots[:, None].expand_as(tokens), tokens.clamp(min=0).to(torch.int64)),
            counted,
            accumulate=True,
        )

    if query_start_loc is None:
        query_lens = torch.zeros_like(sampled)
    else:
        query_lens = (query_start_loc[1 : num_reqs + 1] - query_start_loc[:num_reqs]).to(
            torch.int64
        )
    rejected = num_rejected[:num_reqs].to(torch.int64)
    old_computed = num_computed_tokens[slots].to(torch.int64)
    if VALUE_CHECKS:
        _check_counts(
            fn,
            slots,
            valid,
            sampled,
            rejected,
            query_lens,
            width,
            old_computed + query_lens - rejected,
            old_total + sampled,
        )
    _masked_store(num_computed_tokens, (slots,), old_computed + query_lens - rejected, valid)


def _check_counts(
    fn: str,
    slots: torch.Tensor,
    valid: torch.Tensor,
    sampled: torch.Tensor,
    rejected: torch.Tensor,
    query_lens: torch.Tensor,
    width: int,
    computed: torch.Tensor,
    total: torch.Tensor,
) -> None:
    """The value checks of `post_update` (one host sync): counts in range, and no more
    tokens computed than the request holds (the last sampled one is not computed yet)."""
    checks = (
        ((sampled < 0) | (sampled > width), "samples {s} tokens, outside 0..{w}"),
        ((rejected < 0) | (rejected > query_lens), "rejects {r} of {q} scheduled tokens"),
        (
            computed > total - (sampled > 0).to(total.dtype),
            "would count {c} computed tokens of {t}: unaccepted drafts counted as computed "
            "(num_rejected too small) would inflate the next step's seq_lens",
        ),
    )
    for bad, message in checks:
        rows = torch.nonzero(valid & bad).flatten().tolist()
        if rows:
            row = rows[0]
            text = message.format(
                s=int(sampled[row]),
                w=width,
                r=int(rejected[row]),
                q=int(query_lens[row]),
                c=int(computed[row]),
                t=int(total[row]),
            )
            _fail(f"{fn}(): batch row {row} (slot {int(slots[row])}) {text}")


def post_update_num_computed_tokens(
    idx_mapping: torch.Tensor,
    num_computed_tokens: torch.Tensor,
    query_start_loc: torch.Tensor,
) -> None:
    """Count every scheduled token as computed (a step that samples nothing: pooling)."""
    fn = "post_update_num_computed_tokens"
    num_reqs = idx_mapping.shape[0]
    expect("num_computed_tokens", num_computed_tokens, torch.int32, fn=fn)
    expect("query_start_loc", query_start_loc, torch.int32, at_least=num_reqs + 1, fn=fn)
    slots = idx_mapping.to(torch.int64)
    query_lens = query_start_loc[1 : num_reqs + 1] - query_start_loc[:num_reqs]
    _masked_store(
        num_computed_tokens, (slots,), num_computed_tokens[slots] + query_lens, slots >= 0
    )
