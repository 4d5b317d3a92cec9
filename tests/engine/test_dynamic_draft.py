"""Dynamic draft length for the standalone drafter (``Engine(draft_confidence=...)``, issue 14):
greedy outputs equal plain decoding, sampling stays lossless (chi-square against the exact
target distribution), a never-stopping threshold is an exact no-op, static graphs agree
with eager, the CPU loop skips the draft forwards once every request stopped, and the
threshold adaptation is transformers' ROC rule."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import torch

from relayc.engine import Engine, LlamaForCausalLM, SamplingParams, random_model
from relayc.engine.draft.standalone import DraftConfidence, drafted_mask
from relayc.engine.model.weights import random_model as make_model
from relayc.runtime.backend import graph_safe_paths
from tests.engine.engine_helpers import (
    one_intra_op_thread,  # noqa: F401 - autouse fixture
    random_workload,
)
from tests.nodes import test_spec_sampling as spec_sampling
from tests.nodes.spec_driver import SpecDriver

CHAIN = {"num_steps": 4, "topk": 1, "num_draft_tokens": 5}


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    return random_model(seed=5)


@pytest.fixture
def draft_lens(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every kept chain length :meth:`DraftConfidence.record` sees (real rows only)."""
    seen: list[int] = []
    real = DraftConfidence.record

    def spy(self: DraftConfidence, rows: torch.Tensor, probs: torch.Tensor, tokens: Any) -> None:
        real(self, rows, probs, tokens)
        seen.extend(self.draft_lens[rows.long()][rows > 0].tolist())

    monkeypatch.setattr(DraftConfidence, "record", spy)
    return seen


def _generate(model: LlamaForCausalLM, params: list[SamplingParams], **kwargs: Any) -> list[Any]:
    work = random_workload(3, len(params), max_prompt=12, max_new=1, last_arrival=4)
    with Engine(model, max_batch_size=4, **kwargs) as engine:
        return engine.generate(work.prompts, params, arrivals=work.arrivals)


@pytest.mark.parametrize("overlap", [True, False])
def test_greedy_outputs_equal_plain_decoding(
    model: LlamaForCausalLM, overlap: bool, draft_lens: list[int]
) -> None:
    params = [SamplingParams(max_new_tokens=10 + i % 5) for i in range(6)]
    plain = _generate(model, params, algorithm="none", overlap=overlap)
    dynamic = _generate(
        model, params, algorithm="standalone", draft_confidence=0.4, overlap=overlap, **CHAIN
    )
    assert [o.token_ids for o in dynamic] == [o.token_ids for o in plain]
    # The option acted: some chains stopped early, and no accept ran past a stop.
    assert min(draft_lens) < CHAIN["num_steps"] and max(draft_lens) <= CHAIN["num_steps"]
    assert all(1 <= a <= CHAIN["num_draft_tokens"] for o in dynamic for a in o.accept_lengths)


def test_a_threshold_that_never_stops_is_an_exact_no_op(
    model: LlamaForCausalLM, monkeypatch: pytest.MonkeyPatch, draft_lens: list[int]
) -> None:
    """The masking path with every draft kept gives the option-off run's tokens and accept
    lengths, greedy and sampled rows alike."""
    monkeypatch.setattr(DraftConfidence, "_fit", lambda self, *args: args[-1])
    params = [
        SamplingParams(max_new_tokens=12, temperature=0.0 if i % 2 else 1.0, seed=i)
        for i in range(5)
    ]
    off = _generate(model, params, algorithm="standalone", **CHAIN)
    kept = _generate(model, params, algorithm="standalone", draft_confidence=1e-30, **CHAIN)
    assert [o.token_ids for o in kept] == [o.token_ids for o in off]
    assert [o.accept_lengths for o in kept] == [o.accept_lengths for o in off]
    assert set(draft_lens) == {CHAIN["num_steps"]}


@pytest.mark.parametrize("block_verification", [False, True])
def test_static_graphs_equal_eager_with_the_option(
    model: LlamaForCausalLM, block_verification: bool
) -> None:
    """The static-buffer path inside graph-safe paths (as under a CUDA graph) cannot stop
    the draft loop early and masks the drafts instead: the same tokens and accept lengths
    as the eager run that stops, greedy and sampled."""
    params = [
        SamplingParams(max_new_tokens=10, temperature=0.0 if i % 2 else 0.9, seed=7 + i)
        for i in range(6)
    ]
    kwargs = {
        "algorithm": "standalone",
        "draft_confidence": 0.5,
        "block_verification": block_verification,
        **CHAIN,
    }
    eager = _generate(model, params, graphs="off", overlap=False, **kwargs)
    with graph_safe_paths():  # a context variable: no overlap thread, which would not see it
        static = _generate(model, params, graphs="static", overlap=False, **kwargs)
    # Outside graph-safe paths the static path stops early and verifies short chains.
    host = _generate(model, params, graphs="static", overlap=False, **kwargs)
    for run in (static, host):
        assert [o.token_ids for o in run] == [o.token_ids for o in eager]
        assert [o.accept_lengths for o in run] == [o.accept_lengths for o in eager]


@pytest.mark.parametrize("block_verification", [False, True])
def test_sampling_stays_lossless(block_verification: bool) -> None:
    target = make_model(spec_sampling.TINY_VOCAB, seed=3)
    with torch.no_grad():  # as in test_spec_sampling: sharper distributions
        target.model.norm.weight.mul_(2.5)
    spec = SpecDriver(
        target,
        "standalone",
        num_steps=3,
        topk=1,
        n=4,
        batch=spec_sampling.REQUESTS,
        debug=False,
        kv_size=spec_sampling.REQUESTS * 40,
    )
    algorithm = spec.algorithm
    algorithm.block_verification = block_verification
    # A high threshold on a 4-token vocabulary: many chains stop after one or two drafts.
    algorithm.draft_confidence = DraftConfidence(spec_sampling.REQUESTS + 1, 3, 0.7, target.device)
    lens: list[int] = []
    real = DraftConfidence.record

    def spy(self: DraftConfidence, rows: torch.Tensor, probs: torch.Tensor, tokens: Any) -> None:
        real(self, rows, probs, tokens)
        lens.extend(self.draft_lens[rows.long()].tolist())

    algorithm.draft_confidence.record = spy.__get__(algorithm.draft_confidence)  # type: ignore[method-assign]
    requests = spec_sampling.REQUESTS
    spec.prefill(
        [spec_sampling.PROMPT] * requests,
        [SamplingParams(temperature=1.0)] * requests,
        range(requests),
    )
    while min(len(o) for o in spec.outputs) < spec_sampling.TOKENS:
        spec.decode()
    counts = Counter(tuple(o[: spec_sampling.TOKENS]) for o in spec.outputs)
    probs = spec_sampling.exact_probabilities(target)
    stat, critical = spec_sampling.chi_square(counts, probs, requests)
    assert stat < critical, f"chi-square {stat:.1f} >= {critical:.1f}"
    assert {1, 2, 3} <= set(lens)


def test_the_draft_loop_stops_once_every_request_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    """A threshold of 1 stops every chain after its first draft: on the CPU outside
    graph-safe paths the draft model runs no chain forward; the drafts are masked either way."""
    from relayc.engine.core.config import ModelConfig
    from relayc.engine.draft.standalone import StandaloneDrafter

    config = ModelConfig(
        vocab_size=32, hidden_size=32, intermediate_size=48, num_layers=1, head_dim=8
    )
    drafter = StandaloneDrafter(make_model(config, seed=1))
    kv = drafter.make_kv_cache(256)
    req_to_token = torch.arange(1, 4 * 32 + 1, dtype=torch.int32).view(4, 32)
    calls: list[int] = []
    forward = drafter.model.forward
    monkeypatch.setattr(drafter.model, "forward", lambda b: calls.append(1) or forward(b))
    probs = torch.softmax(torch.randn(2, 32), dim=-1)
    args = (
        probs.argmax(dim=-1, keepdim=True),
        probs,
        torch.tensor([3, 5]),
        torch.tensor([1, 2]),
        req_to_token,
        kv,
        torch.tensor([[200, 201, 202], [203, 204, 205]]),
    )
    kwargs: dict[str, Any] = {"num_steps": 4, "max_prefix_len": 6}
    full = drafter.draft_chain(*args, **kwargs)
    assert len(calls) == 3
    calls.clear()
    stopped = drafter.draft_chain(*args, thresholds=torch.ones(2), **kwargs)
    assert not calls
    assert torch.equal(stopped.draft_probs[:, 0], full.draft_probs[:, 0])
    assert not stopped.draft_probs[:, 1:].any()
    with graph_safe_paths():
        masked = drafter.draft_chain(*args, thresholds=torch.ones(2), **kwargs)
    assert len(calls) == 3
    assert torch.equal(masked.draft_probs, stopped.draft_probs)


def test_the_kept_drafts_end_after_the_first_unconfident_one() -> None:
    confidences = torch.tensor([[0.9, 0.3, 0.8, 0.1], [0.9, 0.9, 0.9, 0.9], [0.1, 0.9, 0.9, 0.9]])
    kept = drafted_mask(confidences, torch.tensor([0.4, 0.4, 0.4]))
    assert kept.sum(dim=1).tolist() == [2, 4, 1]


def _roc_threshold(probs: list[float], labels: list[int]) -> float:
    """transformers' rule spelled out: the threshold (+inf first, then the scores from high
    to low) minimising fpr + 3 * fnr, the first on ties."""
    pos, neg = sum(labels), len(labels) - sum(labels)
    best, best_cost = float("inf"), 3.0
    for t in sorted(set(probs), reverse=True):
        tp = sum(1 for p, y in zip(probs, labels, strict=True) if p >= t and y)
        fp = sum(1 for p, y in zip(probs, labels, strict=True) if p >= t and not y)
        cost = fp / neg + 3 * (1 - tp / pos)
        if cost < best_cost:
            best, best_cost = t, cost
    return best


def test_the_threshold_follows_transformers_roc_rule() -> None:
    gen = torch.Generator().manual_seed(0)
    state = DraftConfidence(3, 4, 0.4, "cpu", history=16)
    rows = torch.tensor([1, 2])
    history: dict[int, tuple[list[float], list[int]]] = {1: ([], []), 2: ([], [])}
    for step in range(12):
        confidences = torch.rand(2, 4, generator=gen)
        probs = torch.zeros(2, 4, 6)
        tokens = torch.zeros(2, 4, dtype=torch.int64)
        kept = drafted_mask(confidences, state.thresholds[rows])
        probs[:, :, 0] = confidences * kept
        probs[:, :, 1] = (1 - confidences) * kept
        state.record(rows, probs, tokens)
        accepted = torch.minimum(torch.randint(0, 5, (2,), generator=gen), kept.sum(dim=1))
        state.update(rows, accepted)
        for i, row in enumerate(rows.tolist()):
            n, length = int(accepted[i]), int(kept[i].sum())
            ps, ls = history[row]
            ps.extend(confidences[i, : n + (n < length)].tolist())
            ls.extend([1] * n + [0] * (n < length))
            ps[:], ls[:] = ps[-16:], ls[-16:]
            expected = state.initial if step == 0 else None
            if len(ps) > 5 and 0 in ls and 1 in ls:
                expected = _roc_threshold(ps, ls)
            if expected is not None:
                assert float(state.thresholds[row]) == pytest.approx(expected), (step, row)
    state.reset(rows[:1])
    assert float(state.thresholds[1]) == pytest.approx(0.4) and int(state.count[1]) == 0


@pytest.mark.parametrize(
    ("algorithm", "value", "sizes"),
    [
        ("eagle", 0.4, {"num_steps": 3, "topk": 2, "num_draft_tokens": 5}),
        ("standalone", 1.5, CHAIN),
        ("standalone", 0.0, CHAIN),
    ],
)
def test_bad_uses_of_the_option_are_refused(
    model: LlamaForCausalLM, algorithm: str, value: float, sizes: dict[str, int]
) -> None:
    with pytest.raises(ValueError, match="`draft_confidence`"):
        Engine(model, algorithm=algorithm, draft_confidence=value, **sizes)


def test_the_decode_step_with_the_option_passes_capture_check() -> None:
    """Thresholds, masking and the adaptation run inside the captured device step: no host
    reads, no data-dependent shapes, no reallocated buffers."""
    target = make_model(spec_sampling.TINY_VOCAB, seed=11)
    prompts = [[1, 2, 3], [2, 1], [3, 3, 1, 2]]
    spec = SpecDriver(target, "standalone", num_steps=3, topk=1, n=4, batch=3, debug=False)
    spec.algorithm.draft_confidence = DraftConfidence(4, 3, 0.4, target.device)
    params = [SamplingParams(temperature=0.7), SamplingParams(), SamplingParams(temperature=1.0)]
    spec.prefill(prompts, params, [1, 2, 3])
    spec.decode()
    spec.capture_check()
