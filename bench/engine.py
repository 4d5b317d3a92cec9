"""Engine throughput with overlap on and off, in one run, and where an iteration's time goes.

Each mode runs the same greedy workload (``--requests`` prompts, ``--max-new-tokens``
each, ``--concurrency`` of them queued at a time: all at once by default) ``--repeats``
times, alternating modes so machine noise hits both; the best run of each is reported,
plus the median on/off ratio of back-to-back pairs. The outputs of both modes must be
identical.

Columns, per iteration: ``forward`` is the time inside the forward jobs (on CUDA only
their launch), ``host`` the scheduler's own work, ``wait`` the time blocked on a job's
results, ``exposed`` the wall time outside the jobs -- the host work and handoffs overlap
is meant to hide. With overlap the host work runs while the forward of the previous
iteration is in flight, so wall ~ max(host, forward) instead of host + forward.

The breakdown table splits a job further: ``target`` is the time inside the target
model's forwards (verify, decode, prefill), ``draft`` inside the draft model's (a head's
layer and LM head, a standalone draft model's forward), ``between`` the rest of the job --
tree build, verify/accept, KV compaction, the relay's resolve/stash/publish, sampling,
Python dispatch -- and ``host`` the scheduler's work outside the job. ``between + host`` is
the non-forward time of an iteration (``--steps`` adds the forwards' own Python, the time
inside them but outside the native library's compute calls, and the sum: the time outside
native code); ``cpu/wall`` is the process's CPU time over wall
time (well under 1 with one request at a time: the machine was busy).

    python bench/engine.py [--requests 32] [--max-new-tokens 64] [--threads 1]
                           [--algorithm none] [--concurrency N]
    python bench/engine.py --model smollm2 --dtype bfloat16 --algorithm eagle3 --topk 4 \\
        --num-draft-tokens 8 --random-head --requests 4 --concurrency 1 [--profile]

``--model smollm2`` runs the real model on its held-out chat prompts
(``relayc.tools.demo.chat_prompts``) instead of the default model's mixed-length word
prompts. ``--random-head`` drafts ``eagle3`` with an untrained head
(``Eagle3Head.random(target, seed=0)`` saved to a temporary directory): good for timing,
not for acceptance. ``--profile`` then runs the workload once more under cProfile with a
clock that stops inside the forwards, overlap off (every job on the calling thread), and
prints the functions with the most self time outside them.

``--graphs`` defaults to ``off``: the breakdown times the model's and the drafter's forward
calls, which a recorded step (``tape``, the engine's own default on the CPU) does not make --
``--graphs tape`` (or ``auto``) gives its tokens/s, but shows the step's time as ``between``.
``bench/tape.py`` measures the recorded mode's host time.

``--threads`` sets torch's intra-op threads (default 1: on a small machine the forward
worker and the host thread then each get a core).
"""

from __future__ import annotations

import sys
from pathlib import Path

# this checkout's relayc, not the one the environment installed (an editable install points
# at another checkout: a worktree's benchmark would otherwise time the main tree's code)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import cProfile
import os
import pstats
import random
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from relayc.engine import Engine, SamplingParams
from relayc.engine.serving.request import Prompt


class ForwardTimer:
    """Wall time inside the target's and the drafter's forwards, by kind.

    Wraps ``forward`` of the target and of the drafter's layers (and the drafter's
    ``logits``) on the instances; nested calls count once, in their outermost kind.
    ``on_enter`` / ``on_exit`` run around every outermost forward (the profile's clock).
    """

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {"target": 0.0, "draft": 0.0}
        self.calls: dict[str, int] = {"target": 0, "draft": 0}
        self._local = threading.local()
        self.on_enter: Callable[[], None] | None = None
        self.on_exit: Callable[[], None] | None = None

    def wrap(self, owner: Any, attr: str, kind: str) -> None:
        inner = getattr(owner, attr)

        def timed(*args: Any, **kwargs: Any) -> Any:
            local = self._local
            depth = getattr(local, "depth", 0)
            if depth:
                return inner(*args, **kwargs)
            if self.on_enter is not None:
                self.on_enter()
            local.depth = 1
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds[kind] += time.perf_counter() - start
                self.calls[kind] += 1
                local.depth = 0
                if self.on_exit is not None:
                    self.on_exit()

        setattr(owner, attr, timed)

    def attach(self, engine: Engine) -> None:
        self.wrap(engine.model, "forward", "target")
        drafter = getattr(engine.algorithm, "drafter", None)
        if isinstance(drafter, nn.Module):  # a head: its layers and its logits
            for child in drafter.children():
                for module in child if isinstance(child, nn.ModuleList) else [child]:
                    self.wrap(module, "forward", "draft")
            if hasattr(drafter, "logits"):
                self.wrap(drafter, "logits", "draft")
            # an EAGLE-3 head's draft extend and chain in one native call each
            # (relayc.engine.draft.native_draft): draft forwards too
            whole = getattr(drafter, "native_draft", None)
            for attr in ("extend", "chain"):
                if whole is not None and hasattr(whole, attr):
                    self.wrap(whole, attr, "draft")
        elif isinstance(model := getattr(drafter, "model", None), nn.Module):  # a draft model
            self.wrap(model, "forward", "draft")

    def snapshot(self) -> tuple[float, float, int, int]:
        s, c = self.seconds, self.calls
        return s["target"], s["draft"], c["target"], c["draft"]


class StepTimer:
    """Wall time of each decode-step op outside the forwards (``--steps``).

    Wraps the generated decode step's op callables (``DecodeStep.OPS``) and its relay's
    ``resolve`` / ``publish`` / ``stash`` on the instance; an op's time is its wall time
    minus the forward time ``timer`` counted inside it. ``rest`` (in the report) is the
    job's between-time no op accounts for: the step's own code, the graph runner, the
    scheduler's job wrapper.
    """

    def __init__(self, timer: ForwardTimer) -> None:
        self.timer = timer
        self.seconds: dict[str, float] = {}

    def _wrap(self, owner: Any, attr: str, name: str) -> None:
        inner = getattr(owner, attr)
        self.seconds[name] = 0.0

        def timed(*args: Any, **kwargs: Any) -> Any:
            forwards = self.timer.seconds["target"] + self.timer.seconds["draft"]
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                wall = time.perf_counter() - start
                inside = self.timer.seconds["target"] + self.timer.seconds["draft"] - forwards
                self.seconds[name] += wall - inside

        setattr(owner, attr, timed)

    def attach(self, engine: Engine) -> None:
        step = engine.algorithm.decode_step
        for op in step.OPS:
            self._wrap(step, f"_{op}", op)
        for method in ("resolve", "publish", "stash"):
            if hasattr(step.relay, method):
                self._wrap(step.relay, method, f"relay.{method}")

    def snapshot(self) -> dict[str, float]:
        return dict(self.seconds)


class NativeTimer:
    """Wall time inside the native decoder's compute calls (``--steps``): the layers, the LM
    heads, the argmax. A forward's time outside them is Python: argument checks, attention
    metadata, tensors made for the call -- host work as much as what runs between forwards.

    Wraps the functions on the loaded library itself, so every engine of the process is
    timed through them (the ``--steps`` run is the only one running while they are).
    """

    FUNCTIONS = (
        "relayc_forward",
        "relayc_draft_chain",
        "relayc_draft_extend",
        "relayc_accept_greedy",
        "relayc_compact",
        "relayc_decoder",
        "relayc_decoder_bf16",
        "relayc_decoder_ex",
        "relayc_decoder_bf16_ex",
        "relayc_decoder_blocks_ex",
        "relayc_head",
        "relayc_head_bf16",
        "relayc_head_blocks",
        "relayc_head_argmax",
        "relayc_argmax",
        "relayc_linear",
        "relayc_tape_run",  # a recorded step's native calls, run by the library in one call
    )

    def __init__(self, forwards: ForwardTimer) -> None:
        self.forwards = forwards  # its depth tells a call inside a forward from one between
        self.seconds = 0.0
        self.inside = 0.0  # of which inside the forwards ``forwards`` times
        self.calls = 0

    def attach(self) -> bool:
        """Wrap the library's functions; False where no native library runs."""
        from relayc.engine.native import library as native

        lib = native.native_decoder()
        if lib is None:
            return False
        for name in self.FUNCTIONS:
            inner = getattr(lib, name)

            def timed(*args: Any, _inner: Any = inner) -> Any:
                start = time.perf_counter()
                try:
                    return _inner(*args)
                finally:
                    seconds = time.perf_counter() - start
                    self.seconds += seconds
                    if getattr(self.forwards._local, "depth", 0):
                        self.inside += seconds
                    self.calls += 1

            timed.__wrapped__ = inner  # type: ignore[attr-defined]  # a tape batches it still
            setattr(lib, name, timed)
        return True


class ForwardFreeClock:
    """A clock for cProfile that stands still inside the forwards (``ForwardTimer``'s hooks),
    so every function's time is its time outside them."""

    def __init__(self) -> None:
        self._paused_s = 0.0
        self._paused_at: float | None = None

    def __call__(self) -> float:
        now = time.perf_counter() if self._paused_at is None else self._paused_at
        return now - self._paused_s

    def pause(self) -> None:
        self._paused_at = time.perf_counter()

    def resume(self) -> None:
        if self._paused_at is not None:
            self._paused_s += time.perf_counter() - self._paused_at
            self._paused_at = None


@dataclass
class Run:
    tokens: int
    wall_s: float
    cpu_s: float
    iterations: int
    host_s: float
    wait_s: float
    job_s: float
    target_s: float
    draft_s: float
    target_calls: int
    draft_calls: int
    accept_steps: int
    accept_tokens: int
    outputs: list[list[int]] = field(repr=False)

    @property
    def mean_accept_length(self) -> float:
        return self.accept_tokens / self.accept_steps if self.accept_steps else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s

    def per_iter_ms(self, seconds: float) -> float:
        return seconds / self.iterations * 1e3

    @property
    def exposed_s(self) -> float:
        """Wall time outside the forward jobs: what overlap hides (CPU runners)."""
        return self.wall_s - self.job_s

    @property
    def between_s(self) -> float:
        """Job time outside the target's and the drafter's forwards."""
        return self.job_s - self.target_s - self.draft_s


def workload(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    words = "relay stash resolve overlap scheduler token cache slot event stream".split()
    return [" ".join(rng.choice(words) for _ in range(rng.randint(2, 12))) for _ in range(n)]


def run_once(
    engine: Engine,
    timer: ForwardTimer,
    prompts: Sequence[Prompt],
    params: SamplingParams,
    concurrency: int,
) -> Run:
    before = engine.scheduler.stats
    iterations, host, wait, job = before.iterations, before.host_s, before.wait_s, before.job_s
    steps, accepted = before.accept_steps, before.accept_tokens
    target, draft, target_calls, draft_calls = timer.snapshot()
    start, cpu = time.perf_counter(), time.process_time()
    outs = []
    for i in range(0, len(prompts), concurrency):
        outs += engine.generate(list(prompts[i : i + concurrency]), params)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    stats = engine.scheduler.stats
    after = timer.snapshot()
    return Run(
        tokens=sum(len(o.token_ids) for o in outs),
        wall_s=wall,
        cpu_s=cpu,
        iterations=stats.iterations - iterations,
        host_s=stats.host_s - host,
        wait_s=stats.wait_s - wait,
        job_s=stats.job_s - job,
        target_s=after[0] - target,
        draft_s=after[1] - draft,
        target_calls=after[2] - target_calls,
        draft_calls=after[3] - draft_calls,
        accept_steps=stats.accept_steps - steps,
        accept_tokens=stats.accept_tokens - accepted,
        outputs=[o.token_ids for o in outs],
    )


@contextmanager
def profiled(timer: ForwardTimer, top: int) -> Iterator[None]:
    """cProfile on this thread with the forwards' time taken out; prints the ``top``
    functions by self time, then by cumulative time."""
    clock = ForwardFreeClock()
    profile = cProfile.Profile(clock)
    timer.on_enter, timer.on_exit = clock.pause, clock.resume
    profile.enable()
    try:
        yield
    finally:
        profile.disable()
        timer.on_enter = timer.on_exit = None
    stats = pstats.Stats(profile)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    if callees := os.environ.get("RELAYC_PROFILE_CALLEES"):
        stats.print_callees(*callees.split(","))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model", default=None, help="smollm2, a checkpoint, a .gguf file")
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--algorithm", default="none")
    parser.add_argument("--num-steps", type=int, default=None)
    parser.add_argument("--topk", type=int, default=1)
    parser.add_argument("--num-draft-tokens", type=int, default=None)
    parser.add_argument("--draft-model", default=None)
    parser.add_argument("--random-head", action="store_true", help="eagle3: an untrained head")
    parser.add_argument(
        "--draft-quantization",
        default=None,
        help="q8_0, q4_1 or q4_0: the drafter's matrices in that llama.cpp format",
    )
    parser.add_argument(
        "--concurrency", type=int, default=0, help="requests queued at a time (0: all)"
    )
    parser.add_argument("--profile", action="store_true", help="where non-forward time goes")
    parser.add_argument("--profile-top", type=int, default=30)
    parser.add_argument(
        "--steps", action="store_true", help="per-op time outside the forwards (overlap off)"
    )
    parser.add_argument(
        "--graphs",
        default="off",
        help="Engine(graphs=...): off (the default here: the breakdown times forward calls), "
        "auto, tape (the CPU's recorded steps) or static",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    prompts: list[Prompt]
    if args.model == "smollm2":
        from relayc.tools.demo import chat_prompts

        chats = chat_prompts()
        prompts = [chats[i % len(chats)] for i in range(args.requests)]
    else:
        prompts = list(workload(args.requests, seed=0))
    concurrency = args.concurrency or len(prompts)
    params = SamplingParams(max_new_tokens=args.max_new_tokens)
    sizes = {}
    if args.algorithm != "none":
        sizes = {
            "num_steps": args.num_steps,
            "topk": args.topk,
            "num_draft_tokens": args.num_draft_tokens,
        }
    with tempfile.TemporaryDirectory() as scratch:
        draft_model = args.draft_model
        if args.random_head:
            from relayc.engine.draft import Eagle3Head

            target = Engine(model=args.model, dtype=args.dtype, device=args.device)
            draft_model = str(Eagle3Head.random(target.model, seed=0).save(scratch))
            target.close()

        def build(overlap: bool) -> Engine:
            return Engine(
                model=args.model,
                dtype=args.dtype,
                algorithm=args.algorithm,
                draft_model=draft_model,
                overlap=overlap,
                **({"draft_quantization": q} if (q := args.draft_quantization) else {}),
                seed=0,
                device=args.device,
                graphs=args.graphs,
                **sizes,
            )

        engines = {overlap: build(overlap) for overlap in (True, False)}
    timers = {overlap: ForwardTimer() for overlap in engines}
    for overlap, engine in engines.items():
        timers[overlap].attach(engine)
        engine.generate(prompts[:4], SamplingParams(max_new_tokens=4))  # warm up
    best: dict[bool, Run] = {}
    paired: list[float] = []  # on/off tokens/s of back-to-back runs: robust to slow drift
    for _ in range(args.repeats):
        pair = {}
        for overlap, engine in engines.items():
            run = run_once(engine, timers[overlap], prompts, params, concurrency)
            pair[overlap] = run
            if overlap not in best or run.wall_s < best[overlap].wall_s:
                best[overlap] = run
        paired.append(pair[True].tokens_per_s / pair[False].tokens_per_s)

    on, off = best[True], best[False]
    algorithm = args.algorithm + (f" {sizes}" if sizes else "")
    print(
        f"engine: model {args.model or 'default'} ({engines[True].model.config.dtype}), "
        f"{args.requests} requests x {args.max_new_tokens} new tokens, {concurrency} at a "
        f"time, greedy, algorithm {algorithm}, {args.threads} intra-op thread(s), device "
        f"{args.device}, best of {args.repeats}"
    )
    header = (
        f"{'overlap':<8} {'tokens':>7} {'wall s':>7} {'tokens/s':>9} {'iters':>6} "
        f"{'ms/iter':>8} {'forward':>8} {'host':>6} {'wait':>6} {'exposed':>8} {'accept':>7}"
        "  (ms/iter; accept: mean tokens per decode step)"
    )
    print(header)
    print("-" * len(header))
    for name, run in (("on", on), ("off", off)):
        print(
            f"{name:<8} {run.tokens:>7} {run.wall_s:>7.3f} {run.tokens_per_s:>9.1f} "
            f"{run.iterations:>6} {run.per_iter_ms(run.wall_s):>8.2f} "
            f"{run.per_iter_ms(run.job_s):>8.2f} {run.per_iter_ms(run.host_s):>6.2f} "
            f"{run.per_iter_ms(run.wait_s):>6.2f} {run.per_iter_ms(run.exposed_s):>8.2f} "
            f"{run.mean_accept_length:>7.2f}"
        )
    print(
        f"on/off: tokens/s x{on.tokens_per_s / off.tokens_per_s:.2f}, "
        f"ms/iter x{on.per_iter_ms(on.wall_s) / off.per_iter_ms(off.wall_s):.2f}, "
        f"host ms/iter x{on.per_iter_ms(on.host_s) / off.per_iter_ms(off.host_s):.2f}, "
        f"exposed ms/iter x{on.exposed_s / on.iterations / (off.exposed_s / off.iterations):.2f}"
    )
    print(
        f"on/off tokens/s of back-to-back pairs: median x{statistics.median(paired):.2f} "
        f"(range x{min(paired):.2f}..x{max(paired):.2f})"
    )
    print(f"outputs identical: {'yes' if on.outputs == off.outputs else 'NO'}")
    print()
    header = (
        f"{'overlap':<8} {'ms/iter':>8} {'target':>8} {'draft':>8} {'between':>8} {'host':>7} "
        f"{'non-fwd':>8} {'fwd calls':>10} {'cpu/wall':>9}"
        "  (ms/iter; non-fwd = between + host; fwd calls: target+draft per iter)"
    )
    print(header)
    print("-" * len(header))
    for name, run in (("on", on), ("off", off)):
        calls = (run.target_calls + run.draft_calls) / run.iterations
        print(
            f"{name:<8} {run.per_iter_ms(run.wall_s):>8.2f} {run.per_iter_ms(run.target_s):>8.2f} "
            f"{run.per_iter_ms(run.draft_s):>8.2f} {run.per_iter_ms(run.between_s):>8.3f} "
            f"{run.per_iter_ms(run.host_s):>7.3f} "
            f"{run.per_iter_ms(run.between_s + run.host_s):>8.3f} {calls:>10.1f} "
            f"{run.cpu_s / run.wall_s:>9.2f}"
        )
    if args.steps:
        steps = StepTimer(timers[False])
        steps.attach(engines[False])
        native = NativeTimer(timers[False])
        native_on = native.attach()
        # a recorded step (graphs="tape") holds the library's functions: record it again
        # through the timed ones
        engines[False].algorithm.graphs.reset()
        run = run_once(engines[False], timers[False], prompts, params, concurrency)
        ops = steps.snapshot()
        print("\nper decode-step op, outside the forwards (overlap off, one run, us/iter):")
        between = run.per_iter_ms(run.between_s) * 1e3
        for name, seconds in sorted(ops.items(), key=lambda kv: -kv[1]):
            print(f"  {name:<24} {run.per_iter_ms(seconds) * 1e3:>8.0f}")
        print(
            f"  {'rest of the job':<24} {between - run.per_iter_ms(sum(ops.values())) * 1e3:>8.0f}"
        )
        print(f"  {'between (all)':<24} {between:>8.0f}")
        print(f"  {'host':<24} {run.per_iter_ms(run.host_s) * 1e3:>8.0f}")
        if native_on:
            forwards = run.target_s + run.draft_s
            glue = run.per_iter_ms(forwards - native.inside) * 1e3
            between_native = run.per_iter_ms(native.seconds - native.inside) * 1e3
            outside = glue + between - between_native + run.per_iter_ms(run.host_s) * 1e3
            print(
                f"  {'forwards, outside native':<24} {glue:>8.0f}  (their Python; "
                f"{native.calls / run.iterations:.1f} native calls per iter)"
            )
            print(f"  {'native calls between':<24} {between_native:>8.0f}  (in `between` above)")
            print(
                f"  {'outside native calls':<24} {outside:>8.0f}  (the forwards' Python, between "
                "and host, less the native calls between)"
            )
    if args.profile:
        print("\nprofile (overlap off; self time outside the target's and drafter's forwards):")
        with profiled(timers[False], args.profile_top):
            run_once(engines[False], timers[False], prompts, params, concurrency)
    for engine in engines.values():
        engine.close()


if __name__ == "__main__":
    main()
