"""The engine's decode steps through the graph runner (issue 13 item 3): with
``graphs="static"`` -- padding to the bucket with slot-0 rows, static input buffers, the
captured path without CUDA graphs -- every algorithm's outputs equal ``graphs="off"``, on
batches that fill a bucket, are padded to one, and exceed the largest (eager)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from relayc.engine import Engine, LlamaForCausalLM, ModelConfig, SamplingParams, random_model
from relayc.engine.native.library import native_decoder
from relayc.engine.serving.graphs import TAPE_BUCKETS, DecodeGraphs, capture_buckets
from tests.engine.engine_helpers import one_intra_op_thread  # noqa: F401 - autouse fixture

CONFIGS = [
    ("none", {}),
    ("eagle", {"num_steps": 2, "topk": 2, "num_draft_tokens": 4}),
    ("eagle_multilayer", {"num_steps": 2, "topk": 2, "num_draft_tokens": 4}),
    ("ngram", {"num_steps": 2, "topk": 1, "num_draft_tokens": 4}),
    ("standalone", {"num_steps": 2, "topk": 1, "num_draft_tokens": 3}),
]
BUCKETS = (1, 2, 4, 8)  # so 9 concurrent requests exceed the largest and run eagerly
TINY = ModelConfig(
    hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=16
)


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    return random_model(TINY, seed=5)


def _prompts(n: int, seed: int) -> tuple[list[list[int]], list[SamplingParams]]:
    gen = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, 256, (3 + 2 * i % 7,), generator=gen).tolist() for i in range(n)]
    # Different lengths, so the batch shrinks through every bucket as requests finish.
    params = [SamplingParams(max_new_tokens=3 + i % 5) for i in range(n)]
    return prompts, params


def _engine(
    model: LlamaForCausalLM, algorithm: str, mode: str, overlap: bool, **sizes: int
) -> Engine:
    return Engine(
        model,
        algorithm=algorithm,
        overlap=overlap,
        graphs=mode,
        capture_batch_sizes=BUCKETS,
        max_batch_size=16,
        kv_pool_tokens=1024,
        max_context=48,
        **sizes,
    )


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "no-overlap"])
@pytest.mark.parametrize(("algorithm", "sizes"), CONFIGS, ids=[a for a, _ in CONFIGS])
def test_static_graph_path_matches_eager(
    model: LlamaForCausalLM, algorithm: str, sizes: dict[str, int], overlap: bool
) -> None:
    eager = _engine(model, algorithm, "off", overlap, **sizes)
    static = _engine(model, algorithm, "static", overlap, **sizes)
    # The random model's text gives a host drafter nothing to match, and a batch it drafts
    # nothing for runs one-token steps (serving/undrafted.py): this test is about the verify
    # step's graphs, so every batch verifies here.
    static.algorithm.drafts_nothing = lambda req_pool_indices: False  # type: ignore[method-assign]
    graphs = static.algorithm.graphs
    assert graphs.mode == "static" and graphs.batch_sizes == BUCKETS
    for n in (1, 3, 8, 9):
        prompts, params = _prompts(n, seed=n)
        want = [o.token_ids for o in eager.generate(prompts, params)]
        before = {k: (r.replays, r.eager_runs) for k, r in graphs.runners.items()}
        got = [o.token_ids for o in static.generate(prompts, params)]
        assert got == want, f"{algorithm} with {n} requests, overlap={overlap}"
        runner = graphs.runners.get(True)
        assert runner is not None, f"`{algorithm}` does not run its decode step through graphs"
        replays, eager_runs = before.get(True, (0, 0))
        assert runner.replays > replays, f"{n} requests: no decode step ran from static buffers"
        if n == 9:  # the first decode has 9 rows: above the largest bucket
            assert runner.eager_runs > eager_runs
        else:
            assert runner.eager_runs == eager_runs
    assert set(runner._static) <= set(BUCKETS)
    eager.close()
    static.close()


def test_sampled_requests_match_eager_through_their_own_graphs(model: LlamaForCausalLM) -> None:
    """A batch with a sampling request runs the sampled graphs (keyed apart from greedy)."""
    sizes = {"num_steps": 2, "topk": 2, "num_draft_tokens": 4}
    prompts, _ = _prompts(3, seed=7)
    params = [
        SamplingParams(max_new_tokens=6, temperature=0.8, top_k=20, seed=1),
        SamplingParams(max_new_tokens=6),
        SamplingParams(max_new_tokens=6, temperature=1.0, top_p=0.9, seed=2),
    ]
    outs = {}
    for mode in ("off", "static"):
        engine = _engine(model, "eagle", mode, True, **sizes)
        outs[mode] = [o.token_ids for o in engine.generate(prompts, params)]
        if mode == "static":
            assert engine.algorithm.graphs.runners[False].replays > 0
        engine.close()
    assert outs["static"] == outs["off"]


def test_capture_buckets_follow_the_spec_up_to_the_engine_batch() -> None:
    spec = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    assert capture_buckets(spec, 64) == (1, 2, 4, 8, 16, 32, 64)
    assert capture_buckets(spec, 6) == (1, 2, 4, 8)  # 5 and 6 still have a bucket
    assert capture_buckets((1, 2, 4, 8), 16) == (1, 2, 4, 8)  # 9..16 run eagerly
    assert capture_buckets((4,), 2) == (4,)
    assert capture_buckets((), 8) == ()


def test_graph_modes_are_checked(model: LlamaForCausalLM) -> None:
    with pytest.raises(ValueError, match="auto, graph, tape, static, off"):
        Engine(model, graphs="fast")
    with pytest.raises(ValueError, match="needs a CUDA device"):
        Engine(model, graphs="graph")
    with pytest.raises(ValueError, match="capture_batch_sizes must be positive"):
        Engine(model, graphs="static", capture_batch_sizes=[0, 4])
    # auto on the CPU: recorded steps, every batch size up to TAPE_BUCKETS its own bucket
    assert native_decoder() is not None, "the native decoder should build here"
    assert Engine(model).algorithm.graphs.mode == "tape"
    auto = DecodeGraphs.build("auto", "cpu", (1, 2), max_batch_size=4)
    assert auto.mode == "tape" and auto.batch_sizes == (1, 2, 3, 4)
    wide = DecodeGraphs.build("tape", "cpu", (1, 2), max_batch_size=64)
    assert wide.batch_sizes == tuple(range(1, TAPE_BUCKETS + 1))
    given = DecodeGraphs.build("auto", "cpu", (1, 2), max_batch_size=64, batch_sizes=[2, 16])
    assert given.batch_sizes == (2, 16)
    # debug's relay checks read the device on the host, which a recording refuses
    assert DecodeGraphs.build("auto", "cpu", (1, 2), max_batch_size=4, debug=True).mode == "off"


def test_the_engine_pays_the_first_recording_s_imports_when_it_is_built() -> None:
    """The first recorded step enters a TorchDispatchMode, whose first op imports
    torch._dynamo (about 1.5 s): built with recorded steps, the engine imports it, so the
    first request is not that much slower than the rest (checked by the import, in a fresh
    process, not by a time)."""
    if native_decoder() is None:
        pytest.skip("recorded steps (graphs='tape') need the native decoder")
    script = (
        "import sys\n"
        "from relayc.engine import Engine\n"
        "engine = Engine('random', overlap=False)\n"
        "assert engine.algorithm.graphs.mode == 'tape', engine.algorithm.graphs.mode\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True"]
