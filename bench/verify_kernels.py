"""Time the verify kernels at serving sizes; prints one table with ratios.

    python bench/verify_kernels.py                 # CPU: vectorised torch path vs the loop reference
    python bench/verify_kernels.py --device cuda   # GPU: Triton kernels vs the torch path on the GPU
                                            # (and sgl_kernel's CUDA kernels if installed)

Both columns of a row run in the same process on the same inputs, one after the
other, so the ratio is meaningful on a noisy machine even when the absolute times
are not. Times are medians.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

# `python bench/verify_kernels.py` puts bench/ on the path, not the repo root: import this
# checkout's relayc (not another install) and the tests' tree generator.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from relayc.kernels.chain_sampling import (
    chain_speculative_sampling,
    chain_speculative_sampling_reference,
)
from relayc.kernels.tree_sampling import (
    tree_speculative_sampling_target_only,
    tree_speculative_sampling_target_only_reference,
)
from relayc.kernels.verify_greedy import (
    verify_tree_greedy,
    verify_tree_greedy_reference,
)
from tests.kernels.trees import random_trees


@dataclass
class Case:
    name: str
    make_args: Callable[[], tuple]  # fresh outputs each call, shared inputs
    reference: Callable[..., None]
    entry: Callable[..., None]
    sgl_name: str | None  # the sgl_kernel function with the same signature, if any


def build_cases(batch: int, num_draft: int, vocab: int, device: str) -> list[Case]:
    gen = torch.Generator().manual_seed(0)
    trees = random_trees(batch, num_draft, vocab, gen, max_depth=num_draft)
    logits = torch.randn(batch, num_draft, vocab, generator=gen) * 2
    # Make the target like each node's first child most of the time, as a good
    # draft model does, so that walks go deep instead of stopping at the root.
    first_child = trees.retrive_next_token
    boost = (first_child >= 0) & (torch.rand(batch, num_draft, generator=gen) < 0.8)
    child_token = trees.candidates.gather(1, first_child.clamp(min=0))
    logits.scatter_add_(2, child_token[..., None], boost[..., None].float() * 8)
    target_probs = logits.softmax(-1)
    draft_probs = torch.zeros_like(target_probs)  # target-only, as SGLang calls it
    target_predict = target_probs.argmax(-1)
    coins = torch.rand(batch, num_draft, generator=gen)
    final_coins = torch.rand(batch, generator=gen)

    num_drafts = num_draft - 1  # the chain with as many nodes as the tree
    chain_draft = (torch.randn(batch, num_drafts, vocab, generator=gen) * 2).softmax(-1)
    chain_tokens = torch.multinomial(chain_draft.reshape(-1, vocab), 1, generator=gen)
    chain_tokens = chain_tokens.reshape(batch, num_drafts)

    to = lambda t: t.to(device)  # noqa: E731
    tree_inputs = [
        to(t)
        for t in (
            trees.candidates,
            trees.retrive_index,
            trees.retrive_next_token,
            trees.retrive_next_sibling,
        )
    ]
    target_predict, coins, final_coins = to(target_predict), to(coins), to(final_coins)
    target_probs, draft_probs = to(target_probs), to(draft_probs)
    chain_tokens, chain_draft = to(chain_tokens), to(chain_draft)
    chain_coins = coins[:, :num_drafts].contiguous()

    def outputs(spec_steps: int) -> tuple[torch.Tensor, ...]:
        return (
            torch.full((batch * num_draft,), -1, dtype=torch.int32, device=device),
            torch.full((batch, spec_steps), -1, dtype=torch.int32, device=device),
            torch.full((batch,), -1, dtype=torch.int32, device=device),
        )

    spec_steps = min(num_draft, 8)
    return [
        Case(
            "verify_tree_greedy",
            lambda: (*outputs(spec_steps), *tree_inputs, target_predict),
            verify_tree_greedy_reference,
            verify_tree_greedy,
            "verify_tree_greedy",
        ),
        Case(
            "tree_speculative_sampling",
            lambda: (
                *outputs(spec_steps),
                *tree_inputs,
                coins,
                final_coins,
                target_probs,
                # sgl_kernel writes rejected tokens' target probs into this as
                # scratch; later reps then see slightly different rows, same work.
                draft_probs,
            ),
            tree_speculative_sampling_target_only_reference,
            tree_speculative_sampling_target_only,
            "tree_speculative_sampling_target_only",
        ),
        Case(
            "chain_speculative_sampling",
            lambda: (
                *outputs(num_drafts + 1),
                chain_tokens,
                chain_coins,
                final_coins,
                target_probs,
                chain_draft,
            ),
            chain_speculative_sampling_reference,
            chain_speculative_sampling,
            None,
        ),
    ]


def median_ms(fn: Callable[[], None], reps: int, sync: Callable[[], None]) -> float:
    fn()  # warm-up: Triton compiles on the first call
    sync()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def bench_cpu(cases: list[Case], reps: int) -> None:
    print(f"{'kernel':<28} {'reference ms':>13} {'torch ms':>10} {'speed-up':>9}")
    for case in cases:
        ref = median_ms(lambda c=case: c.reference(*c.make_args()), max(1, reps // 10), _no_sync)
        vec = median_ms(lambda c=case: c.entry(*c.make_args(), backend="torch"), reps, _no_sync)
        print(f"{case.name:<28} {ref:>13.2f} {vec:>10.3f} {ref / vec:>8.1f}x")


def bench_cuda(cases: list[Case], reps: int) -> None:
    try:
        import sgl_kernel
    except ImportError:
        sgl_kernel = None
    sync = torch.cuda.synchronize
    header = (
        f"{'kernel':<28} {'torch ms':>10} {'triton ms':>10} {'speed-up':>9} {'sgl_kernel ms':>14}"
    )
    print(header)
    for case in cases:
        vec = median_ms(lambda c=case: c.entry(*c.make_args(), backend="torch"), reps, sync)
        tri = median_ms(lambda c=case: c.entry(*c.make_args(), backend="triton"), reps, sync)
        sgl = "n/a"
        if sgl_kernel is not None and case.sgl_name is not None:
            fn = getattr(sgl_kernel, case.sgl_name)
            sgl = f"{median_ms(lambda c=case, f=fn: f(*c.make_args()), reps, sync):.3f}"
        print(f"{case.name:<28} {vec:>10.3f} {tri:>10.3f} {vec / tri:>8.1f}x {sgl:>14}")


def _no_sync() -> None:
    pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--num-draft", type=int, default=8, help="N, tree nodes incl. the root")
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda needs a CUDA GPU")
    cases = build_cases(args.batch, args.num_draft, args.vocab, args.device)
    print(
        f"B={args.batch} N={args.num_draft} V={args.vocab} device={args.device} "
        f"torch={torch.__version__} threads={torch.get_num_threads()}"
    )
    (bench_cuda if args.device == "cuda" else bench_cpu)(cases, args.reps)


if __name__ == "__main__":
    main()
