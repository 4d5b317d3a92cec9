"""One prepared check for a lent GPU (under 5 minutes): kernels, capture, replay, timings.

    python bench/gpu_check.py                # CUDA: Triton kernels + CUDA graphs
    python bench/gpu_check.py --device cpu   # the same logic on the CPU (static buffers, no
                                             # graphs, torch kernels), to test this script

1. The Triton verify kernels and the fused relay kernels against their torch paths on
   random inputs (integer outputs must be equal).
2. For every speculative algorithm: prefill a batch, snapshot the device state, run one
   decode step eagerly, restore, replay it from the captured graph of its bucket; the
   outputs and the relay must be identical. Then time eager vs graph steps.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
if "--device" in sys.argv and "cpu" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")


from dataclasses import replace

import torch

from relayc.engine.sampling import SamplingBatch, SamplingParams
from relayc.engine.weights import random_model
from relayc.runtime.graph_runner import GraphRunner, StaticInput
from tests.nodes.spec_driver import SMALL, SpecDriver

ALGORITHMS = [
    ("eagle", 3, 1, 4),
    ("eagle", 3, 4, 8),
    ("eagle_multilayer", 3, 2, 6),
    ("ngram", 3, 1, 5),
    ("standalone", 3, 1, 4),
]


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


def snapshot(spec: SpecDriver) -> dict[str, torch.Tensor]:
    state = {
        f"relay.{name}": buffer
        for name, buffer in spec.algorithm.relay.buffers.items()
        if buffer is not None
    }
    state["req_to_token"] = spec.driver.req_pool.req_to_token
    caches = [spec.driver.kv_cache] + ([spec.algorithm.draft_kv] if spec.algorithm.draft_kv else [])
    for c, cache in enumerate(caches):
        for layer in range(len(cache.k)):
            state[f"k{c}.{layer}"], state[f"v{c}.{layer}"] = cache.k[layer], cache.v[layer]
    return {k: v.clone() for k, v in state.items()} | {"_live": state}  # type: ignore[dict-item]


def restore(saved: dict) -> None:  # type: ignore[type-arg]
    for key, live in saved["_live"].items():
        live.copy_(saved[key])


def check_algorithm(device: str, name: str, num_steps: int, topk: int, n: int) -> str:
    torch.manual_seed(0)
    target = random_model(SMALL, seed=11, device=device)
    batch = 6
    spec = SpecDriver(target, name, num_steps=num_steps, topk=topk, n=n, batch=8, debug=False)
    prompts = [[(3 * b + i) % 40 for i in range(5 + b)] for b in range(batch)]
    spec.prefill(prompts, [SamplingParams()] * batch, range(batch))
    ctx, inputs, _ = spec._inputs()
    host = spec.algorithm.decode_step.run_host(ctx, **inputs)
    # Per-row tensors the ops read from ctx are static inputs of the graphs too.
    width = spec.algorithm.decode_width
    sampling = ctx.sampling
    ctx_values = {
        "out_cache_loc": ctx.out_cache_loc.view(batch, width),
        "temperatures": sampling.temperatures,
        "top_ks": sampling.top_ks,
        "top_ps": sampling.top_ps,
        "seeds": sampling.seeds,
    }

    def bind_ctx(ctx, static):  # type: ignore[no-untyped-def]
        sampling = SamplingBatch(
            static["temperatures"], static["top_ks"], static["top_ps"], static["seeds"]
        )
        return replace(ctx, out_cache_loc=static["out_cache_loc"].view(-1), sampling=sampling)

    runner = GraphRunner(
        spec.algorithm.decode_step,
        device=device,
        batch_sizes=[1, 2, 4, 8],
        inputs={"req_pool_indices": StaticInput(torch.int64), "seq_lens": StaticInput(torch.int64)},
        host_inputs={k: StaticInput(v.dtype, tuple(v.shape[1:])) for k, v in host.items()},
        ctx_inputs={
            "out_cache_loc": StaticInput(torch.int64, (width,)),
            "temperatures": StaticInput(torch.float32),
            "top_ks": StaticInput(torch.int64),
            "top_ps": StaticInput(torch.float32, (), 1.0),
            "seeds": StaticInput(torch.int64),
        },
        bind_ctx=bind_ctx,
        mode="graph" if device == "cuda" else "static",
    )
    saved = snapshot(spec)
    runner.capture(ctx)
    restore(saved)
    eager = {
        k: v.clone()
        for k, v in spec.algorithm.decode_step.run_device(ctx, **inputs, host=host).items()
    }
    relay_eager = snapshot(spec)
    restore(saved)
    replayed = runner.run(ctx, inputs, host, ctx_values)
    for key, value in eager.items():
        assert torch.equal(replayed[key], value), f"{name}: replay differs at {key}"
    relay_replay = snapshot(spec)
    for key in relay_eager:
        if key.startswith("relay."):
            rows = inputs["req_pool_indices"]
            assert torch.equal(relay_eager[key][rows], relay_replay[key][rows]), key

    def timed(fn, repeat: int = 20) -> float:  # type: ignore[no-untyped-def]
        for _ in range(3):
            restore(saved)
            fn()
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(repeat):
            restore(saved)
            fn()
        if device == "cuda":
            torch.cuda.synchronize()
        return (time.perf_counter() - start) / repeat * 1e3

    eager_ms = timed(lambda: spec.algorithm.decode_step.run_device(ctx, **inputs, host=host))
    graph_ms = timed(lambda: runner.run(ctx, inputs, host, ctx_values))
    return (
        f"{name:<17} topk {topk}  replay == eager  eager {eager_ms:7.2f} ms  "
        f"graph {graph_ms:7.2f} ms  ({eager_ms / graph_ms:.1f}x)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA device: run with --device cpu to exercise the script")
    start = time.perf_counter()
    torch.set_num_threads(1)
    check_kernels(args.device)
    for config in ALGORITHMS:
        print(check_algorithm(args.device, *config))
    print(f"gpu_check passed in {time.perf_counter() - start:.0f} s on {args.device}")


if __name__ == "__main__":
    main()
