"""Drive SGLang's FutureMap and the generated one with the same randomized call sequence.

One `Twin` holds SGLang's relay (`ref`) and the generated one (`gen`) for one
algorithm, plus what a scheduler knows: the running batch (as two ScheduleBatch
stand-ins whose `spec_info` are SGLang's own EagleDraftInput / NgramVerifyInput, so
batch filter and merge run SGLang's code), the free request-pool slots, and which rows
of each field have been written. Each step is a prefill (new requests, possibly into
freed slots, sometimes with slot-0 padding rows), a decode, a mixed prefill+decode, or
requests finishing (a filter). After each resolve every tensor the two produced is
compared: dtype, shape and values, on the rows that were written (an unwritten row of
an `empty` buffer is garbage on both sides).
"""

from __future__ import annotations

import random
import types
from dataclasses import dataclass, field
from typing import Any

import torch

POOL = 24  # request-pool slots, 0 included (the padding slot)
MAX_LEN = 64  # req_to_token width
TOPK = 3
NUM_STEPS = 2
HIDDEN = 16
VOCAB = 24
DRAFT_TOKENS = 4  # n-gram verify width


@dataclass(frozen=True)
class Scenario:
    name: str
    sglang_algorithm: str | None  # SGLang's name; None: non-speculative
    server_kwargs: dict[str, Any] = field(default_factory=dict)
    hidden: bool = True  # EAGLE-family payloads carry hidden states (sometimes None)
    draft_probs: bool = False  # payloads carry draft probabilities (rejection sampling)
    mixed: bool = False  # SGLang supports mixed chunk prefill for the algorithm
    topk: bool = True  # payloads carry top-k (sometimes None at prefill)
    dsa: bool = False  # payloads carry DSA top-k seeds; draft inputs flag them available


SCENARIOS = (
    Scenario("none", None, mixed=True),
    Scenario("eagle", "EAGLE", mixed=True),
    Scenario("eagle3", "EAGLE3", mixed=True),  # relayc's eagle3 spec; SGLang: EAGLE's buffers
    Scenario("eagle-no-hidden", "EAGLE", hidden=False, mixed=True),
    Scenario("eagle-multilayer", "EAGLE", {"enable_multi_layer_eagle": True}),
    Scenario("standalone", "STANDALONE", draft_probs=True),
    Scenario("ngram", "NGRAM"),
    # The block drafters relay the bonus token and the lengths only. Their payloads are
    # built like EAGLE's here: DFlashDraftInputV2 still carries (legacy) top-k and hidden
    # states, which both sides must drop. UnoDraftInput carries none of them.
    Scenario("dflash", "DFLASH", mixed=True),
    Scenario("dspark", "DSPARK", mixed=True),
    Scenario("uno", "UNO", hidden=False, topk=False),
)
# Rejection sampling under EAGLE relays draft_probs, which the bundled eagle spec does
# not: the test compiles a spec that adds it (README, "Adding a relay field").
DRAFT_PROBS_SCENARIO = Scenario(
    "eagle-draft-probs", "EAGLE", {"speculative_use_rejection_sampling": True}, draft_probs=True
)

DSA_TOPK = 4
# DSA top-k seeds relayed by an eagle spec that adds the field (the test compiles it).
DSA_SCENARIO = Scenario("eagle-dsa", "EAGLE", dsa=True, mixed=True)

# SGLang allocates these buffers although the algorithm never reads them back; the
# generated relay allocates what the spec relays (and n-gram's scalar accept_lens
# eagerly, as the spec says, where SGLang waits for the first n-gram stash).
ALLOCATION_DIFFERENCES = {
    "none": {"new_seq_lens_buf"},
    "ngram": {"output_tokens_buf", "accept_lens_buf"},
}
SPEC_EXTRAS = (
    "bonus_tokens",
    "topk_p",
    "topk_index",
    "hidden_states",
    "draft_probs",
    "dsa_topk_indices",
    "accept_tokens",
    "accept_lens",
)


class Mismatch(AssertionError):
    pass


def check_same(what: str, ref: Any, gen: Any, rows: torch.Tensor | None = None) -> None:
    """Equal dtype, shape and values (on `rows`, a bool mask over dim 0, when given)."""
    if isinstance(ref, torch.Tensor) != isinstance(gen, torch.Tensor):
        raise Mismatch(f"{what}: SGLang {type(ref).__name__}, generated {type(gen).__name__}")
    if not isinstance(ref, torch.Tensor):
        if ref != gen:
            raise Mismatch(f"{what}: SGLang {ref!r}, generated {gen!r}")
        return
    if ref.dtype != gen.dtype or ref.shape != gen.shape or ref.device != gen.device:
        raise Mismatch(
            f"{what}: SGLang {ref.dtype} {list(ref.shape)} on {ref.device}, generated "
            f"{gen.dtype} {list(gen.shape)} on {gen.device}"
        )
    if rows is not None:
        ref, gen = ref[rows], gen[rows]
    if not torch.equal(ref, gen):
        raise Mismatch(f"{what}: values differ\nSGLang    {ref}\ngenerated {gen}")


class Twin:
    def __init__(
        self, sgl: types.SimpleNamespace, gen_module: Any, scenario: Scenario, seed: int
    ) -> None:
        self.sgl = sgl
        self.gen_module = gen_module
        self.scenario = scenario
        self.rng = random.Random(seed)
        self.torch_gen = torch.Generator().manual_seed(seed)
        self.algo = sgl.SpeculativeAlgorithm.from_string(scenario.sglang_algorithm)
        self.is_ngram = self.algo.is_ngram()
        self.speculative = self.algo.is_some()
        self.multilayer = bool(scenario.server_kwargs.get("enable_multi_layer_eagle"))
        pool = types.SimpleNamespace(
            req_to_token=torch.arange(POOL * MAX_LEN, dtype=torch.int32).reshape(POOL, MAX_LEN)
        )
        self.needs_cpu_seq_lens = self.rng.random() < 0.7
        self.ref = sgl.overlap_utils.FutureMap(
            torch.device("cpu"), self.algo, pool, self.needs_cpu_seq_lens
        )
        self.gen = gen_module.FutureMap(
            torch.device("cpu"), self.algo, pool, self.needs_cpu_seq_lens
        )
        self.free = list(range(1, POOL))
        self.rng.shuffle(self.free)
        self.seq_len: dict[int, int] = {}
        self.running: list[int] = []
        self.batches = {"ref": self._batch([]), "gen": self._batch([])}
        self.written: dict[str, torch.Tensor] = {}
        self.resolves = 0

    # -- random values ---------------------------------------------------------------
    def _ints(self, shape: tuple[int, ...], high: int = 1000, dtype=torch.int64) -> torch.Tensor:
        return torch.randint(0, high, shape, generator=self.torch_gen, dtype=dtype)

    def _floats(self, shape: tuple[int, ...], dtype=torch.float32) -> torch.Tensor:
        return torch.rand(shape, generator=self.torch_gen).to(dtype)

    def _mark(self, name: str, indices: torch.Tensor) -> None:
        mask = self.written.setdefault(name, torch.zeros(POOL, dtype=torch.bool))
        mask[indices] = True

    # -- batches ---------------------------------------------------------------------
    def _spec_info(self, indices: torch.Tensor) -> Any:
        if not self.speculative:
            return None
        if self.is_ngram:
            return self.sgl.NgramVerifyInput(
                future_indices=indices.clone(),
                new_seq_lens=torch.zeros(indices.shape[0], dtype=torch.int64),
                draft_token_num=DRAFT_TOKENS,
            )
        return self.sgl.EagleDraftInput(future_indices=indices.clone())

    def _batch(self, slots: list[int]) -> types.SimpleNamespace:
        indices = torch.tensor(slots, dtype=torch.int64)
        return types.SimpleNamespace(
            device=torch.device("cpu"),
            enable_overlap=True,
            spec_algorithm=self.algo,
            spec_info=self._spec_info(indices),
            req_pool_indices=indices,
            req_pool_indices_cpu=indices.clone(),
            prefill_input_ids_cpu=None,
            mix_running_indices=None,
            mix_running_indices_cpu=None,
            input_ids=None,
            seq_lens=None,
            seq_lens_cpu=None,
            seq_lens_sum=None,
            out_cache_loc=None,
            prefix_lens=None,
        )

    # -- relay writes ----------------------------------------------------------------
    def _payloads(self, n: int, prefill: bool) -> tuple[Any, Any, dict[str, torch.Tensor]]:
        """The same payload for both sides, built the way SGLang's scheduler builds it."""
        sc = self.scenario
        if self.is_ngram:
            accept_lens = self._ints((n,), DRAFT_TOKENS, torch.int32) + 1
            values = {"accept_tokens": self._ints((n * DRAFT_TOKENS,)), "accept_lens": accept_lens}
            verify = self.sgl.NgramVerifyInput(
                new_seq_lens=torch.zeros(n, dtype=torch.int64),
                draft_token_num=DRAFT_TOKENS,
                **values,
            )
            return (
                self.sgl.overlap_utils.RelayPayload.from_ngram(verify),
                self.gen_module.RelayPayload.from_ngram(verify),
                {"accept_tokens": values["accept_tokens"], "accept_lens": accept_lens},
            )
        # int32 bonus tokens now and then: both sides cast to int64
        bonus_dtype = torch.int32 if self.rng.random() < 0.2 else torch.int64
        values = {"bonus_tokens": self._ints((n,), 32000, bonus_dtype)}
        if not self.speculative:
            return (
                self.sgl.overlap_utils.RelayPayload(bonus_tokens=values["bonus_tokens"]),
                self.gen_module.RelayPayload(bonus_tokens=values["bonus_tokens"]),
                values,
            )
        # A prefill may omit the draft extras; a decode's top-k and draft probabilities
        # come together from draft extend, its hidden states may be absent.
        if sc.topk and not (prefill and self.rng.random() < 0.3):
            width = (TOPK * NUM_STEPS,) if self.multilayer else (TOPK,)
            values["topk_p"] = self._floats((n, *width))
            values["topk_index"] = self._ints((n, *width), 32000)
            if sc.draft_probs:
                values["draft_probs"] = self._floats((n, VOCAB))
        if sc.dsa and not prefill and self.rng.random() < 0.7:
            values["dsa_topk_indices"] = self._ints((n, DSA_TOPK), 4096, torch.int32)
        if sc.hidden and self.rng.random() < 0.8:
            values["hidden_states"] = self._floats((n, HIDDEN), torch.bfloat16)
        draft_input = self.sgl.EagleDraftInput(**values)
        return (
            self.sgl.overlap_utils.RelayPayload.from_draft_input(draft_input),
            self.gen_module.RelayPayload.from_draft_input(draft_input),
            values,
        )

    def produce(self, slots: list[int], prefill: bool) -> None:
        """End of a forward: publish new lengths, stash the payload (maybe with padding)."""
        n = len(slots)
        indices = torch.tensor(slots, dtype=torch.int64)
        pad = self.rng.choice((0, 0, 1, 3))  # CUDA-graph padded rows write slot 0
        stash_indices = torch.cat([indices, torch.zeros(pad, dtype=torch.int64)])
        for slot in slots:
            step = 1 if prefill else self.rng.randint(1, 3)
            self.seq_len[slot] = min(
                self.seq_len.get(slot, self.rng.randint(2, 20)) + step, MAX_LEN - 2
            )
        lens = torch.tensor([self.seq_len[s] for s in slots] + [1] * pad, dtype=torch.int64)
        if self.speculative or self.rng.random() < 0.5:
            # spec: the worker's on_publish; non-spec: the scheduler publishes seq_lens + 1
            self.ref.publish(stash_indices, lens)
            self.gen.publish(stash_indices, lens)
            self._mark("new_seq_lens", indices)
        ref_payload, gen_payload, values = self._payloads(n + pad, prefill)
        self.ref.stash(stash_indices, ref_payload)
        self.gen.stash(stash_indices, gen_payload)
        for name, value in values.items():
            if value is not None:
                self._mark(name, indices)
        self.check_allocation()

    # -- relay reads -----------------------------------------------------------------
    def _rows(self, name: str, indices: torch.Tensor) -> torch.Tensor:
        return self.written.get(name, torch.zeros(POOL, dtype=torch.bool))[indices]

    def compare_spec_extras(self, indices: torch.Tensor) -> None:
        ref_info, gen_info = self.batches["ref"].spec_info, self.batches["gen"].spec_info
        for name in SPEC_EXTRAS:
            ref_value = getattr(ref_info, name, None)
            gen_value = getattr(gen_info, name, None)
            rows = None
            if isinstance(ref_value, torch.Tensor) and ref_value.shape[:1] == indices.shape:
                rows = self._rows(name, indices)
            elif name == "accept_tokens" and isinstance(ref_value, torch.Tensor):
                rows = self._rows(name, indices).repeat_interleave(DRAFT_TOKENS)
            check_same(f"spec_info.{name}", ref_value, gen_value, rows)

    def decode(self) -> None:
        if not self.running:
            return
        indices = torch.tensor(self.running, dtype=torch.int64)
        # SGLang reads the seeds only for a draft input flagged as having them (it asserts
        # the buffer exists then).
        seeds = self.ref.dsa_topk_indices_buf is not None and self.rng.random() < 0.7
        for side in ("ref", "gen"):
            batch = self.batches[side]
            if self.scenario.dsa and batch.spec_info is not None:
                batch.spec_info.future_dsa_topk_indices_available = seeds
            batch.input_ids = None
            fmap = self.ref if side == "ref" else self.gen
            fmap.resolve_seq_lens_cpu(batch)
            self.sgl.overlap_utils.resolve_forward_inputs(batch, fmap) if side == "ref" else (
                self.gen_module.resolve_forward_inputs(batch, fmap)
            )
        ref, gen = self.batches["ref"], self.batches["gen"]
        if self.speculative:
            rows = self._rows("new_seq_lens", indices)
            check_same("seq_lens", ref.seq_lens, gen.seq_lens, rows)
            check_same("seq_lens_cpu", ref.seq_lens_cpu, gen.seq_lens_cpu, rows)
            if bool(rows.all()):
                check_same("seq_lens_sum", ref.seq_lens_sum, gen.seq_lens_sum)
            self.compare_spec_extras(indices)
        check_same("input_ids", ref.input_ids, gen.input_ids, self._rows("bonus_tokens", indices))
        self.resolves += 1
        self.produce(self.running, prefill=False)

    def prefill(self, mixed: bool = False) -> None:
        k = min(self.rng.randint(1, 4), len(self.free))
        if k == 0:
            return
        new = [self.free.pop() for _ in range(k)]
        tokens = self._ints((self.rng.randint(k, 3 * k),), 32000)
        tails = self.running if mixed else []
        n_tails = len(tails)
        seq_lens = self._ints((k + n_tails,), MAX_LEN // 2)
        if mixed and self.speculative and self.rng.random() < 0.5:
            # the non-overlap path stashes the tails' pending tokens before the mixed resolve
            bonus = self._ints((n_tails,), 32000)
            self.ref.stash_bonus_tokens(torch.tensor(tails), bonus)
            self.gen.stash_bonus_tokens(torch.tensor(tails), bonus)
            self._mark("bonus_tokens", torch.tensor(tails, dtype=torch.int64))
        out_cache_loc = self._ints((tokens.shape[0] + n_tails,), 1 << 20)
        results = {}
        for side, fmap in (("ref", self.ref), ("gen", self.gen)):
            batch = self._batch(new + tails)
            batch.prefill_input_ids_cpu = tokens.clone()
            batch.spec_info = None  # a prefill carries no relayed draft input yet
            if mixed:
                batch.mix_running_indices = torch.tensor(tails, dtype=torch.int64)
                batch.mix_running_indices_cpu = batch.mix_running_indices.clone()
                batch.seq_lens = seq_lens.clone()
                batch.seq_lens_cpu = seq_lens.clone()
                batch.seq_lens_sum = int(seq_lens.sum())
                batch.out_cache_loc = out_cache_loc.clone()
                batch.prefix_lens = [int(x) for x in seq_lens.tolist()]
            resolve = (
                self.sgl.overlap_utils.resolve_forward_inputs
                if side == "ref"
                else self.gen_module.resolve_forward_inputs
            )
            resolve(batch, fmap)
            results[side] = batch
        ref, gen = results["ref"], results["gen"]
        tail_indices = torch.tensor(tails, dtype=torch.int64)
        input_rows = torch.cat(
            [
                torch.ones(tokens.shape[0], dtype=torch.bool),
                self._rows("bonus_tokens", tail_indices),
            ]
        )
        check_same("input_ids (prefill)", ref.input_ids, gen.input_ids, input_rows)
        if mixed and self.speculative and bool(self._rows("new_seq_lens", tail_indices).all()):
            for name in (
                "seq_lens",
                "seq_lens_cpu",
                "seq_lens_sum",
                "out_cache_loc",
                "prefix_lens",
            ):
                check_same(f"mixed {name}", getattr(ref, name), getattr(gen, name))
        self.resolves += 1
        self.produce(new + tails, prefill=True)
        self.merge(new)

    def merge(self, new: list[int]) -> None:
        for side in ("ref", "gen"):
            running, incoming = self.batches[side], self._batch(new)
            if running.spec_info is not None:
                running.spec_info.merge_batch(incoming.spec_info)  # SGLang's merge
            running.req_pool_indices = torch.cat(
                [running.req_pool_indices, incoming.req_pool_indices]
            )
            running.req_pool_indices_cpu = running.req_pool_indices.clone()
        self.running = self.running + new

    def finish(self) -> None:
        """Some requests finish: keep an index subset (SGLang's filter), free the rest."""
        if not self.running:
            return
        keep = sorted(
            self.rng.sample(range(len(self.running)), self.rng.randint(0, len(self.running)))
        )
        keep_t = torch.tensor(keep, dtype=torch.int64)
        for side in ("ref", "gen"):
            batch = self.batches[side]
            if batch.spec_info is not None:
                batch.spec_info.filter_batch(keep_t)  # SGLang's filter
            batch.req_pool_indices = batch.req_pool_indices[keep_t]
            batch.req_pool_indices_cpu = batch.req_pool_indices.clone()
        freed = [s for i, s in enumerate(self.running) if i not in keep]
        self.running = [self.running[i] for i in keep]
        self.free.extend(freed)
        self.rng.shuffle(self.free)

    # -- state -----------------------------------------------------------------------
    def check_allocation(self) -> None:
        """Same buffers allocated (lazily), same dtypes and row shapes, same event."""
        exempt = ALLOCATION_DIFFERENCES.get(self.gen.ALGORITHM, set())
        for name in sorted(n for n in {*vars(self.ref), *vars(self.gen)} if n.endswith("_buf")):
            if name in exempt:
                continue
            ref, gen = getattr(self.ref, name, None), getattr(self.gen, name, None)
            if (ref is None) != (gen is None):
                raise Mismatch(
                    f"{name}: SGLang {'un' * (ref is None)}allocated, generated "
                    f"{'un' * (gen is None)}allocated"
                )
            if ref is not None:
                check_same(f"{name} layout", ref.new_empty(0), gen.new_empty(0))
                if ref.shape != gen.shape:
                    raise Mismatch(f"{name}: SGLang {list(ref.shape)}, generated {list(gen.shape)}")
        if (self.ref.publish_ready is None) != (self.gen.publish_ready is None):
            raise Mismatch("publish_ready: one side recorded a publish event, the other not")
        for name in ("new_seq_lens_cpu_pinned", "fwd_prepare_d2h_stream"):
            if (getattr(self.ref, name) is None) != (getattr(self.gen, name) is None):
                raise Mismatch(f"{name}: host mirror set up on one side only")

    def run(self, steps: int) -> None:
        self.check_allocation()
        for _ in range(steps):
            roll = self.rng.random()
            if not self.running or roll < 0.25:
                self.prefill()
            elif self.scenario.mixed and roll < 0.35:
                self.prefill(mixed=True)
            elif roll < 0.5:
                self.finish()
            else:
                self.decode()
