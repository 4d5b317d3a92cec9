"""The engine's decode steps recorded as CPU graphs (``graphs="tape"``): every algorithm's
outputs equal ``graphs="off"`` on batches that fill a bucket, are padded to one and exceed
the largest, greedy and sampled, with overlap on and off; each bucket's step is recorded
(none refused) and replayed, a steady batch from its new lengths and slots alone; a weight
changed between calls is recorded again."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from relayc.engine import (
    Engine,
    LlamaForCausalLM,
    ModelConfig,
    SamplingParams,
    random_model,
)
from relayc.engine.draft import Eagle3Head
from relayc.engine.native import library as native
from tests.engine.engine_helpers import one_intra_op_thread  # noqa: F401 - autouse fixture

CONFIGS = [
    ("none", {}),
    ("eagle", {"num_steps": 2, "topk": 2, "num_draft_tokens": 4}),
    ("eagle3", {"num_steps": 3, "topk": 1, "num_draft_tokens": 4}),
    ("eagle3", {"num_steps": 2, "topk": 2, "num_draft_tokens": 4}),
    ("eagle_multilayer", {"num_steps": 2, "topk": 1, "num_draft_tokens": 3}),
    ("ngram", {"num_steps": 2, "topk": 1, "num_draft_tokens": 4}),
    ("standalone", {"num_steps": 2, "topk": 1, "num_draft_tokens": 3}),
    ("dflash", {"num_draft_tokens": 4}),  # the seeded random block drafter
]
IDS = [
    "none", "eagle", "eagle3-chain", "eagle3-tree", "eagle_multilayer", "ngram", "standalone",
    "dflash",
]  # fmt: skip
BUCKETS = (1, 2, 4)  # so 5 concurrent requests exceed the largest and run eagerly
TINY = ModelConfig(
    hidden_size=32, intermediate_size=64, num_layers=4, num_heads=2, num_kv_heads=1, head_dim=16
)


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    return random_model(TINY, seed=5)


@pytest.fixture(scope="module")
def head_dir(model: LlamaForCausalLM, tmp_path_factory: pytest.TempPathFactory) -> Path:
    head = Eagle3Head.random(model, seed=8, draft_vocab_size=40, layer_ids=[0, 1, 2])
    return head.save(tmp_path_factory.mktemp("eagle3") / "head")


def _prompts(n: int, seed: int) -> tuple[list[list[int]], list[SamplingParams]]:
    gen = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, 256, (3 + 2 * i % 7,), generator=gen).tolist() for i in range(n)]
    params = [SamplingParams(max_new_tokens=4 + i % 5) for i in range(n)]
    return prompts, params


def _engine(
    model: LlamaForCausalLM, algorithm: str, mode: str, overlap: bool, head: Path, **sizes: int
) -> Engine:
    engine = Engine(
        model,
        algorithm=algorithm,
        draft_model=str(head) if algorithm == "eagle3" else None,
        overlap=overlap,
        graphs=mode,
        capture_batch_sizes=BUCKETS,
        max_batch_size=8,
        kv_pool_tokens=1024,
        max_context=48,
        seed=0,
        **sizes,
    )
    # The recorded verify step is under test: every batch verifies, where n-gram's batches
    # that draft nothing would run one-token steps instead (tests/engine/test_undrafted.py).
    engine.algorithm.drafts_nothing = lambda req_pool_indices: False  # type: ignore[method-assign]
    return engine


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "no-overlap"])
@pytest.mark.parametrize(("algorithm", "sizes"), CONFIGS, ids=IDS)
def test_recorded_steps_match_eager(
    model: LlamaForCausalLM, head_dir: Path, algorithm: str, sizes: dict[str, int], overlap: bool
) -> None:
    eager = _engine(model, algorithm, "off", overlap, head_dir, **sizes)
    taped = _engine(model, algorithm, "tape", overlap, head_dir, **sizes)
    graphs = taped.algorithm.graphs
    assert graphs.mode == "tape"
    for n in (1, 3, 4, 5):
        prompts, params = _prompts(n, seed=n)
        want = [o.token_ids for o in eager.generate(prompts, params)]
        got = [o.token_ids for o in taped.generate(prompts, params)]
        assert got == want, f"{algorithm} with {n} requests, overlap={overlap}"
    runner = graphs.runners[True]
    assert runner.tape_refusals == {}, runner.tape_refusals
    assert set(runner.tapes) == set(BUCKETS) and runner.replays > runner.tape_reruns
    assert runner.eager_runs > 0  # 5 requests: above the largest bucket
    # a steady batch replays from its new lengths and slots alone (GraphRunner.replay_held);
    # n-gram's host steps feed every replay new drafts, so it copies its inputs each time
    assert (runner.held_replays > 0) == (algorithm != "ngram"), runner.held_replays
    # the native library runs each recording's runs of native calls in one call
    if native.native_decoder() is not None:
        assert all(tape.batched > 0 for tape in runner.tapes.values()), runner.tapes
    # one request at a time runs inline, so its steady iterations skip the scheduling too
    assert (taped.scheduler.stats.held_steps > 0) == (algorithm != "ngram")
    assert torch.is_grad_enabled()  # the held steps switch autograd off and back


@pytest.mark.parametrize(("algorithm", "sizes"), CONFIGS[:3], ids=IDS[:3])
def test_sampled_requests_replay_their_own_recording(
    model: LlamaForCausalLM, head_dir: Path, algorithm: str, sizes: dict[str, int]
) -> None:
    eager = _engine(model, algorithm, "off", False, head_dir, **sizes)
    taped = _engine(model, algorithm, "tape", False, head_dir, **sizes)
    prompts, _ = _prompts(3, seed=11)
    params = [SamplingParams(max_new_tokens=6, temperature=0.8, seed=i) for i in range(3)]
    want = [o.token_ids for o in eager.generate(prompts, params)]
    assert [o.token_ids for o in taped.generate(prompts, params)] == want
    runner = taped.algorithm.graphs.runners[False]  # keyed by all-greedy
    assert runner.tape_refusals == {} and runner.tapes
    assert runner.held_replays > 0  # each step's draws follow from its lengths, not copied


def test_a_weight_changed_between_calls_is_recorded_again(head_dir: Path) -> None:
    model = random_model(TINY, seed=9)
    eager = _engine(model, "none", "off", False, head_dir)
    taped = _engine(model, "none", "tape", False, head_dir)
    prompts, params = _prompts(2, seed=3)
    assert [o.token_ids for o in taped.generate(prompts, params)] == [
        o.token_ids for o in eager.generate(prompts, params)
    ]
    first = taped.algorithm.graphs.runners[True]
    with torch.no_grad():
        model.lm_head.weight.mul_(-1.5)  # in place: the packs and the recordings are stale
    want = [o.token_ids for o in eager.generate(prompts, params)]
    assert [o.token_ids for o in taped.generate(prompts, params)] == want
    assert taped.algorithm.graphs.runners[True] is not first
    second = taped.algorithm.graphs.runners[True]
    taped.generate(prompts, params)  # unchanged weights: the recordings are kept
    assert taped.algorithm.graphs.runners[True] is second


def test_a_refusal_inside_torchscript_runs_the_static_path(
    head_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the native library the layers run as TorchScript, whose SDPA has no out=
    form: the recorder refuses from inside the interpreter (which re-raises a bare
    RuntimeError), and the bucket runs from its static buffers, with the same tokens."""
    from relayc.engine.native import library as native

    monkeypatch.setattr(native, "_tried", True)
    monkeypatch.setattr(native, "_lib", None)
    model = random_model(TINY, seed=4)
    eager = _engine(model, "none", "off", False, head_dir)
    taped = _engine(model, "none", "tape", False, head_dir)
    prompts, params = _prompts(3, seed=2)
    want = [o.token_ids for o in eager.generate(prompts, params)]
    assert [o.token_ids for o in taped.generate(prompts, params)] == want
    refusals = taped.algorithm.graphs.runners[True].tape_refusals
    assert refusals and all("has no out= form" in why for why in refusals.values())


def test_tape_mode_is_for_the_cpu(model: LlamaForCausalLM) -> None:
    from relayc.runtime.graph_runner import resolve_mode

    assert resolve_mode("tape", "cpu") == "tape"
    with pytest.raises(ValueError, match=r"'tape' records CPU steps.*use 'graph' on CUDA"):
        resolve_mode("tape", "cuda")


@pytest.mark.parametrize(("algorithm", "sizes"), CONFIGS[:3], ids=IDS[:3])
def test_a_held_step_whose_replay_declines_is_scheduled(
    model: LlamaForCausalLM,
    head_dir: Path,
    algorithm: str,
    sizes: dict[str, int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A native call that declines in a steady batch's held step: its KV slots go back and
    the iteration is scheduled as any other (where the held replay and then the recorded
    step decline too, and it reruns eagerly); the tokens are eager's and every KV slot is free at the end."""
    from relayc.runtime.tape import Tape

    eager = _engine(model, algorithm, "off", False, head_dir, **sizes)
    taped = _engine(model, algorithm, "tape", False, head_dir, **sizes)
    prompts, params = _prompts(1, seed=4)
    params = [SamplingParams(max_new_tokens=9)]
    want = [o.token_ids for o in eager.generate(prompts, params)]
    replay, calls = Tape.replay, [0]

    def declines_thrice(tape: Tape) -> bool:
        calls[0] += 1
        return False if calls[0] in (4, 5, 6) else replay(tape)

    monkeypatch.setattr(Tape, "replay", declines_thrice)
    with torch.no_grad():
        got = [o.token_ids for o in taped.generate(prompts, params)]
        assert not torch.is_grad_enabled()  # a held step restores the caller's mode
    assert got == want
    stats, runner = taped.scheduler.stats, taped.algorithm.graphs.runners[True]
    assert calls[0] > 6 and stats.held_steps > 0 and runner.tape_reruns == 1
    assert taped.scheduler.kv_pool.available_size() == 1024


@pytest.mark.parametrize(("algorithm", "sizes"), CONFIGS[:3], ids=IDS[:3])
def test_held_steps_keep_each_requests_counts_exact(
    model: LlamaForCausalLM, head_dir: Path, algorithm: str, sizes: dict[str, int]
) -> None:
    """Between held steps nothing is in flight, so a request's host counts are exact: every
    sampled token scheduled and seen, every token but the last committed."""
    taped = _engine(model, algorithm, "tape", False, head_dir, **sizes)
    prompts, _ = _prompts(1, seed=6)
    seen = 0
    for delta in taped.stream(prompts, [SamplingParams(max_new_tokens=12)]):
        seen += len(delta.token_ids)
        for request in taped.scheduler.running:
            assert request.inflight == request.inflight_decodes == 0
            assert request.scheduled_samples == len(request.output_ids) == seen
            assert request.kv_len == request.prompt_len + seen - 1
    assert seen == 12 and taped.scheduler.stats.held_steps > 0
