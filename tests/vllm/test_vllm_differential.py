"""The differential test: relayc's generated vLLM relay against vLLM 0.33.0's own kernels.

Runs in its own venv (scripts/test-vllm.sh: vLLM installed --no-deps with torch, numpy,
triton, packaging and regex), with `CUDA_VISIBLE_DEVICES=""` and `TRITON_INTERPRET=1` so
vLLM's Triton kernels run on CPU tensors (docs/vllm.md). Both sides get the same randomized
step sequences -- new and resumed requests, chunked prefills, partial acceptance,
finishing requests and reused slots, drafts fewer than the state holds, slots never drafted
for (their placeholder rows), masked rows, reordered batches -- and every tensor each
produces is compared exactly after every call.

vLLM's `RequestState` cannot be built on a CPU (its buffers ask for pinned memory and an
accelerator device), so vLLM's side keeps its state in plain tensors of RequestState's
layout, which its kernels update; the add_request writes it stages are done directly.
Only the generated module and vLLM are imported: relayc itself is not installed here.
"""

from __future__ import annotations

import importlib
import os
import random
from collections import Counter
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import pytest
import torch

from relayc.vllm_generated import vllm_relay as gen

# scripts/test-vllm.sh sets RELAYC_REQUIRE_VLLM=1: there a missing vLLM fails, not skips.
try:
    vllm_input_batch: ModuleType | None = importlib.import_module("vllm.v1.worker.gpu.input_batch")
except ImportError:
    if os.environ.get("RELAYC_REQUIRE_VLLM"):
        raise
    vllm_input_batch = None
pytestmark = pytest.mark.skipif(
    vllm_input_batch is None,
    reason="vLLM 0.33.0 is not importable here; the differential test runs in its own venv "
    "(scripts/test-vllm.sh, docs/vllm.md)",
)

MAX_NUM_REQS = 6
MAX_MODEL_LEN = 48
MAX_NUM_TOKENS = 40
VOCAB = 32
STEPS = 24


@dataclass
class Request:
    req_id: int
    slot: int
    tokens: list[int]  # prompt and the outputs so far (what a resume re-prefills)
    prefill_len: int
    num_computed: int
    drafted: bool = False
    outputs: list[int] = field(default_factory=list)


class VllmSide:
    """vLLM's state, in RequestState's layout, updated by vLLM's own kernels."""

    def __init__(self, steps: int) -> None:
        self.num_computed_tokens = torch.zeros(MAX_NUM_REQS, dtype=torch.int32)
        self.last_sampled_tokens = torch.zeros(MAX_NUM_REQS, 1, dtype=torch.int64)
        self.total_len = torch.zeros(MAX_NUM_REQS, dtype=torch.int32)
        self.draft_tokens = torch.zeros(MAX_NUM_REQS, steps, dtype=torch.int64)

    def add_request(self, slot: int, prefill_len: int, num_computed: int) -> None:
        self.total_len[slot] = prefill_len
        self.num_computed_tokens[slot] = num_computed
        if self.draft_tokens.shape[1] > 0:
            self.draft_tokens[slot].zero_()


STATE_TENSORS = ("num_computed_tokens", "last_sampled_tokens", "total_len", "draft_tokens")


def _same(what: str, ours: torch.Tensor, theirs: torch.Tensor) -> None:
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape, what
    diff = (ours != theirs).nonzero().tolist()
    assert not diff, f"{what}: {len(diff)} elements differ, first at {diff[0]}"


def _compare_state(step: int, state: Any, theirs: VllmSide) -> None:
    for name in STATE_TENSORS:
        _same(f"step {step} {name}", getattr(state, name), getattr(theirs, name))


def _run(method: str | None, seed: int, seen: Counter[str]) -> None:
    """One randomized sequence for ``method``, counting in ``seen`` what it exercised."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    steps = 0 if method is None else 3
    state = gen.STATES[method](MAX_NUM_REQS, steps, "cpu")
    theirs = VllmSide(steps)
    all_token_ids = {"ours": torch.zeros(MAX_NUM_REQS, MAX_MODEL_LEN, dtype=torch.int32)}
    all_token_ids["vllm"] = all_token_ids["ours"].clone()
    bins = {"ours": torch.zeros(MAX_NUM_REQS, VOCAB, dtype=torch.int32)}
    bins["vllm"] = bins["ours"].clone()
    prefill_len_buf = torch.zeros(MAX_NUM_REQS, dtype=torch.int32)
    free = list(range(MAX_NUM_REQS))
    used: set[int] = set()
    active: dict[int, Request] = {}
    finished: list[Request] = []
    next_id = 0

    def add(req: Request) -> None:
        state.add_request(req.slot, req.prefill_len, req.num_computed)
        theirs.add_request(req.slot, req.prefill_len, req.num_computed)
        for side in all_token_ids.values():
            side[req.slot, : len(req.tokens)] = torch.tensor(req.tokens, dtype=torch.int32)
        prefill_len_buf[req.slot] = req.prefill_len
        active[req.req_id] = req

    for step in range(STEPS):
        # Arrivals: new prompts, and preempted requests resuming with their outputs.
        while free and rng.random() < 0.5:
            slot = free.pop(rng.randrange(len(free)))
            seen["slot reused"] += slot in used
            used.add(slot)
            if finished and rng.random() < 0.3:
                old = finished.pop(rng.randrange(len(finished)))
                tokens = old.tokens + old.outputs
                if len(tokens) + steps + 2 >= MAX_MODEL_LEN:
                    free.append(slot)
                    continue
                cached = rng.randrange(0, len(tokens))  # a cached prefix
                add(Request(old.req_id, slot, tokens, len(tokens), cached))
                seen["resumed"] += 1
            else:
                prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 9))]
                add(Request(next_id, slot, prompt, len(prompt), 0))
                next_id += 1
        if not active:
            continue
        batch = list(active.values())
        rng.shuffle(batch)  # vLLM reorders the batch between steps
        batch = batch[: rng.randint(1, len(batch))]  # some requests sit a step out

        # The schedule: a prefill chunk, or a decode with drafts the drafter produced.
        query_lens, num_logits_per_req = [], []
        for req in batch:
            left = req.prefill_len - req.num_computed
            if left > 0 and req.drafted and rng.random() < 0.3:
                # The prompt's tail and drafts in one query: the sampled token stays out.
                drafts = rng.randint(1, steps)
                query_lens.append(left + drafts)
                num_logits_per_req.append(1 + drafts)
                seen["prompt tail with drafts"] += 1
            elif left > 0:
                query_lens.append(rng.randint(1, left))
                num_logits_per_req.append(1)
            else:
                drafts = rng.randint(0, steps) if req.drafted else 0
                query_lens.append(1 + drafts)
                num_logits_per_req.append(1 + drafts)
                seen["decode with drafts"] += drafts > 0
        num_reqs = len(batch)
        if sum(query_lens) > MAX_NUM_TOKENS:
            continue
        idx_mapping = torch.tensor([r.slot for r in batch], dtype=torch.int32)
        query_start_loc = torch.zeros(MAX_NUM_REQS + 1, dtype=torch.int32)
        query_start_loc[1 : num_reqs + 1] = torch.tensor(query_lens).cumsum(0)
        query_start_loc[num_reqs + 1 :] = query_start_loc[num_reqs]
        cu_num_logits = torch.zeros(num_reqs + 1, dtype=torch.int32)
        cu_num_logits[1:] = torch.tensor(num_logits_per_req).cumsum(0)
        num_logits = int(cu_num_logits[-1])

        pos = {k: torch.full((MAX_NUM_TOKENS,), -5, dtype=torch.int64) for k in ("ours", "vllm")}
        seq_lens = {k: torch.full((MAX_NUM_REQS,), -5, dtype=torch.int32) for k in ("ours", "vllm")}
        gen.prepare_pos_seq_lens(
            idx_mapping, query_start_loc, state.num_computed_tokens, pos["ours"], seq_lens["ours"]
        )
        vllm_input_batch.prepare_pos_seq_lens(
            idx_mapping, query_start_loc, theirs.num_computed_tokens, pos["vllm"], seq_lens["vllm"]
        )
        _same(f"step {step} positions", pos["ours"], pos["vllm"])
        _same(f"step {step} seq_lens", seq_lens["ours"], seq_lens["vllm"])

        # input_ids: the prefill tokens written, the rest poisoned.
        input_ids = torch.full((MAX_NUM_TOKENS,), -9, dtype=torch.int32)
        for row, req in enumerate(batch):
            start = int(query_start_loc[row])
            chunk = req.tokens[req.num_computed : req.num_computed + query_lens[row]]
            input_ids[start : start + len(chunk)] = torch.tensor(chunk, dtype=torch.int32)
        ids = {"ours": input_ids.clone(), "vllm": input_ids.clone()}
        logits_indices = gen.combine_sampled_and_draft_tokens(
            ids["ours"], idx_mapping, state.last_sampled_tokens, query_start_loc,
            seq_lens["ours"], prefill_len_buf, state.draft_tokens, cu_num_logits, num_logits,
        )  # fmt: skip
        vllm_logits_indices = vllm_input_batch.combine_sampled_and_draft_tokens(
            ids["vllm"], idx_mapping, theirs.last_sampled_tokens, query_start_loc,
            seq_lens["vllm"], prefill_len_buf, theirs.draft_tokens, cu_num_logits, num_logits,
        )  # fmt: skip
        _same(f"step {step} input_ids", ids["ours"], ids["vllm"])
        _same(f"step {step} logits_indices", logits_indices, vllm_logits_indices)
        assert (ids["ours"][: int(query_start_loc[num_reqs])] >= 0).all(), "a placeholder leaked"

        # Sampling: partial acceptance; -1 pads the rows past each request's sampled tokens.
        sampled_tokens = torch.full((num_reqs, steps + 1), -1, dtype=torch.int64)
        num_sampled = torch.zeros(num_reqs, dtype=torch.int32)
        for row in range(num_reqs):
            n = rng.randint(1, num_logits_per_req[row])
            seen["partial acceptance"] += 1 < n < num_logits_per_req[row]
            num_sampled[row] = n
            sampled_tokens[row, :n] = torch.randint(0, VOCAB, (n,))
        sampled = {"ours": num_sampled.clone(), "vllm": num_sampled.clone()}
        ours_counts = gen.get_num_sampled_and_rejected(
            sampled["ours"], seq_lens["ours"], cu_num_logits, idx_mapping, prefill_len_buf
        )
        vllm_counts = vllm_input_batch.get_num_sampled_and_rejected(
            sampled["vllm"], seq_lens["vllm"], cu_num_logits, idx_mapping, prefill_len_buf
        )
        _same(f"step {step} num_sampled", ours_counts[0], vllm_counts[0])
        _same(f"step {step} num_rejected", ours_counts[1], vllm_counts[1])
        num_sampled, num_rejected = ours_counts

        # The drafter's output for every row: through post_update (a non-last PP rank) or
        # stored by the model runner. A masked row (slot -1) may ride along: skipped by both.
        drafts = torch.randint(0, VOCAB, (num_reqs, steps), dtype=torch.int64)
        via_post_update = steps > 0 and rng.random() < 0.5
        post_idx, post_sampled, post_drafts = idx_mapping, sampled_tokens, drafts
        post_counts, post_qsl = (num_sampled, num_rejected), query_start_loc
        if rng.random() < 0.3:
            seen["masked row"] += 1
            post_idx = torch.cat([idx_mapping, torch.tensor([-1], dtype=torch.int32)])
            post_sampled = torch.cat([sampled_tokens, torch.randint(0, VOCAB, (1, steps + 1))])
            post_drafts = torch.cat([drafts, torch.randint(0, VOCAB, (1, steps))])
            post_counts = tuple(
                torch.cat([c, torch.tensor([1], dtype=torch.int32)]) for c in post_counts
            )
            post_qsl = torch.cat([query_start_loc[: num_reqs + 1], query_start_loc[num_reqs : num_reqs + 1] + 1])  # fmt: skip
        use_bins = rng.random() < 0.5
        for side, update, target in (("ours", gen.post_update, state), ("vllm", vllm_input_batch.post_update, theirs)):  # fmt: skip
            update(
                post_idx, target.num_computed_tokens, target.last_sampled_tokens,
                bins[side] if use_bins else None, post_sampled, post_counts[0], post_counts[1],
                post_qsl, all_token_ids[side], target.total_len,
                post_drafts if via_post_update else None,
                target.draft_tokens if via_post_update else None,
            )  # fmt: skip
        if steps > 0 and not via_post_update:
            state.store_draft_tokens(idx_mapping.long(), drafts)
            theirs.draft_tokens[idx_mapping.long()] = drafts
        _compare_state(step, state, theirs)
        _same(f"step {step} all_token_ids", all_token_ids["ours"], all_token_ids["vllm"])
        _same(f"step {step} output_bin_counts", bins["ours"], bins["vllm"])
        seen["steps compared"] += 1

        # The host's view: what was computed and sampled; requests finishing free slots.
        for row, req in enumerate(batch):
            req.num_computed += query_lens[row] - int(num_rejected[row])
            n = int(num_sampled[row])
            req.outputs += sampled_tokens[row, :n].tolist()
            req.drafted = steps > 0
            total = len(req.tokens) + len(req.outputs)
            if total + steps + 2 >= MAX_MODEL_LEN or (n and rng.random() < 0.15):
                del active[req.req_id]
                seen["finished"] += 1
                free.append(req.slot)
                finished.append(req)
            else:
                assert req.num_computed == int(state.num_computed_tokens[req.slot])


@pytest.mark.parametrize("method", [None, "eagle", "eagle3", "mtp", "dflash", "dspark"])
def test_generated_relay_matches_vllms_kernels(
    method: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gen.runtime, "VALUE_CHECKS", True)  # the checks pass on valid steps
    seen: Counter[str] = Counter()
    for seed in range(3):
        _run(method, seed, seen)
    exercised = ["steps compared", "resumed", "slot reused", "finished", "masked row"]
    if method is not None:
        exercised += ["decode with drafts", "partial acceptance", "prompt tail with drafts"]
    assert all(seen[what] > 0 for what in exercised), seen


def test_pooling_steps_count_every_token(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(7)
    for _ in range(5):
        num_reqs = rng.randint(1, MAX_NUM_REQS)
        slots = rng.sample(range(MAX_NUM_REQS), num_reqs)
        idx_mapping = torch.tensor(slots, dtype=torch.int32)
        query_start_loc = torch.zeros(num_reqs + 1, dtype=torch.int32)
        query_start_loc[1:] = torch.randint(1, 6, (num_reqs,)).cumsum(0)
        start = torch.randint(0, 20, (MAX_NUM_REQS,), dtype=torch.int32)
        ours, theirs = start.clone(), start.clone()
        gen.post_update_num_computed_tokens(idx_mapping, ours, query_start_loc)
        vllm_input_batch.post_update_num_computed_tokens(idx_mapping, theirs, query_start_loc)
        _same("num_computed_tokens", ours, theirs)


def test_the_leak_vllm_lets_through_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A decode step for a request whose prefill never sampled: vLLM copies the slot's
    placeholder (0) into input_ids; the generated relay refuses it."""
    monkeypatch.setattr(gen.runtime, "VALUE_CHECKS", True)
    state = gen.STATES["eagle"](MAX_NUM_REQS, 2, "cpu")
    theirs = VllmSide(2)
    state.add_request(4, 5, 5)
    theirs.add_request(4, 5, 5)
    args = (
        torch.tensor([4], dtype=torch.int32), torch.tensor([0, 1], dtype=torch.int32),
        torch.tensor([6], dtype=torch.int32), torch.full((MAX_NUM_REQS,), 5, dtype=torch.int32),
    )  # fmt: skip
    input_ids = torch.full((8,), -9, dtype=torch.int32)
    cu_num_logits = torch.tensor([0, 1], dtype=torch.int32)
    vllm_input_batch.combine_sampled_and_draft_tokens(
        input_ids, args[0], theirs.last_sampled_tokens, args[1], args[2], args[3],
        theirs.draft_tokens, cu_num_logits, 1,
    )  # fmt: skip
    assert int(input_ids[0]) == 0  # the placeholder, silently computed as a token
    with pytest.raises(gen.RelayError, match="reads its last sampled token"):
        gen.combine_sampled_and_draft_tokens(
            torch.full((8,), -9, dtype=torch.int32), args[0], state.last_sampled_tokens,
            args[1], args[2], args[3], state.draft_tokens, cu_num_logits, 1,
        )  # fmt: skip


@pytest.mark.parametrize("num_new_sampled_tokens", [0, 1])
def test_combine_on_random_states_matches(num_new_sampled_tokens: int) -> None:
    """combine_sampled_and_draft_tokens alone on random slot states, prefill lengths and
    draft counts, with and without a new sampled token per request (vLLM's
    `num_new_sampled_tokens_per_step`), on vLLM's own tensors (no generated state)."""
    rng = random.Random(num_new_sampled_tokens)
    for _ in range(12):
        steps = rng.randint(1, 4)
        num_reqs = rng.randint(1, MAX_NUM_REQS)
        slots = rng.sample(range(MAX_NUM_REQS), num_reqs)
        computed = [rng.randint(0, 20) for _ in slots]
        prefill_len = torch.randint(1, 24, (MAX_NUM_REQS,), dtype=torch.int32)
        logits = [
            rng.randint(max(num_new_sampled_tokens, 1), steps + num_new_sampled_tokens)
            for _ in slots
        ]
        queries = [n + rng.randint(0, 3) for n in logits]
        query_start_loc = torch.zeros(num_reqs + 1, dtype=torch.int32)
        query_start_loc[1:] = torch.tensor(queries).cumsum(0)
        cu_num_logits = torch.zeros(num_reqs + 1, dtype=torch.int32)
        cu_num_logits[1:] = torch.tensor(logits).cumsum(0)
        seq_lens = torch.tensor(
            [c + q for c, q in zip(computed, queries, strict=True)], dtype=torch.int32
        )
        last = torch.randint(0, VOCAB, (MAX_NUM_REQS, 1))
        drafts = torch.randint(0, VOCAB, (MAX_NUM_REQS, steps))
        idx_mapping = torch.tensor(slots, dtype=torch.int32)
        ids = {k: torch.full((MAX_NUM_TOKENS,), -9, dtype=torch.int32) for k in ("ours", "vllm")}
        args = (idx_mapping, last, query_start_loc, seq_lens, prefill_len, drafts, cu_num_logits)
        got = gen.combine_sampled_and_draft_tokens(
            ids["ours"], *args, sum(logits), num_new_sampled_tokens
        )
        want = vllm_input_batch.combine_sampled_and_draft_tokens(
            ids["vllm"], *args, sum(logits), num_new_sampled_tokens
        )
        _same("input_ids", ids["ours"], ids["vllm"])
        _same("logits_indices", got, want)
