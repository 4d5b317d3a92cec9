"""``relayc generate``: stream one completion from the reference engine.

Streamed text goes to stdout as it arrives (token ids, space-separated, for a
model without a tokenizer); the summary line (tokens, tokens/s, mean accept
length) goes to stderr, so stdout holds only the completion.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import TYPE_CHECKING

from relayc.engine.algorithms import registry
from relayc.specs.errors import EXIT_OK, UsageError, did_you_mean, quoted_list
from relayc.tools.args import (
    MAX_SEED,
    float_in,
    int_in,
    model_arg,
    model_dir,
    token_ids,
    torch_device,
    utf8_text,
)
from relayc.tools.terminal import printable

# relayc.engine.checkpoints.quantize.QUANTIZATIONS (a test keeps them equal), not imported
# here: it imports torch
DRAFT_QUANTIZATIONS = ("q8_0", "q4_1", "q4_0")
REAL_MODEL = "smollm2"  # the default model, as `relayc demo`'s (relayc.tools.demo)
# A --chat answer ends at the model's end of turn; the cap only bounds a model that rambles.
CHAT_MAX_NEW_TOKENS = 512
PROMPT_MAX_NEW_TOKENS = 32  # a --prompt continuation has no turn to end

if TYPE_CHECKING:  # torch: `relayc validate` imports this module and should not pay for it
    from relayc.engine.core.sampling import SamplingParams
    from relayc.engine.serving.engine import Engine
    from relayc.engine.serving.request import Prompt


def algorithm_name(text: str) -> str:
    """An argparse type: an algorithm the reference engine runs (with "did you mean")."""
    runs = registry.engine_names()
    if text in runs:
        return text
    if text in registry.plugins.names():
        try:
            registry.lookup(text, engine=True)
        except ValueError as exc:  # no engine drafter, or its package is broken: it says so
            raise argparse.ArgumentTypeError(str(exc)) from None
    hint = did_you_mean(text, runs)
    raise argparse.ArgumentTypeError(
        f"unknown algorithm `{text}`"
        + (f" ({hint})" if hint else "")
        + f"; the engine runs {quoted_list(runs)}"
    )


algorithm_name.__name__ = "algorithm"  # argparse names the type in its messages


def runnable(model: str | None) -> tuple[str, ...] | None:
    """What runs on ``model`` without ``--draft-model``: None for any algorithm (a file or
    `random`, whose drafters are random unless given), else the drafter-free ones and
    those whose drafter ships for it."""
    if model is None:
        return (*registry.drafter_free(), *registry.toy_drafters())
    if model in registry.named_models():
        return (*registry.drafter_free(), *registry.shipping_for(model))
    return None


def _algorithm_help() -> str:
    runs = registry.engine_names()
    free = registry.drafter_free()
    named = "; ".join(
        f"with {name}{' (the default)' if name == REAL_MODEL else ''}: "
        + ", ".join(runnable(name) or runs)
        for name in registry.named_models()
    )
    drafting = ", ".join(a for a in runs if a not in free)
    return (
        f"what to run (default {runs[0]}): {' or '.join(free)} with any model; {named}; "
        f"with --toy: {', '.join(runnable(None) or runs)}; with any model, {drafting} "
        "given a trained --draft-model DIR (without one, a model file's or `--model "
        "random`'s drafter is random: it runs, and accepts next to nothing)"
    )


def add_generate_command(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``relayc generate`` on the CLI's subparsers."""
    p = subparsers.add_parser(
        "generate",
        help="generate text with the reference engine (streamed)",
        description="Stream a completion of --prompt, --chat (one user message through the "
        "model's chat template) or --prompt-ids from the reference engine: SmolLM2-135M-"
        "Instruct by default (as `relayc demo`), a Llama GGUF file, a local Hugging Face "
        "Llama checkpoint, `--model random`, or `--toy`: the shipped byte-level demo model "
        "(trained on Python source) with its draft models. "
        "Text goes to stdout (token ids when the model has no tokenizer); loading progress "
        "and a summary line (tokens, tokens/s, mean accept length: tokens per decode step) "
        "to stderr.",
        epilog="Algorithms: "
        + "; ".join(f"{a.name}: {a.summary}" for a in registry.engine_algorithms())
        + ". Exit codes: 0 ok, 2 usage errors (bad arguments, checkpoint or request), "
        "70 a bug in relayc (reported with its traceback), 130 interrupted (Ctrl-C).",
    )
    prompt = p.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", type=utf8_text, help="prompt text (the model's tokenizer)")
    prompt.add_argument(
        "--chat",
        type=utf8_text,
        metavar="MESSAGE",
        help="a user message, answered through the model's chat template (stops at the end "
        "of the answer)",
    )
    prompt.add_argument(
        "--prompt-ids",
        type=token_ids,
        metavar="IDS",
        help="the prompt as token ids, e.g. 1,2,3 (BOS not added): for a model without a "
        "tokenizer, or an exact prompt",
    )
    p.add_argument(
        "--max-new-tokens",
        type=int_in(1),
        default=None,
        metavar="N",
        help=f"at most N new tokens (default {CHAT_MAX_NEW_TOKENS} with --chat, which stops "
        f"at the end of the answer first; else {PROMPT_MAX_NEW_TOKENS})",
    )
    p.add_argument(
        "--temperature", type=float_in(0.0), default=0.0, help="0 = greedy (default); > 0 samples"
    )
    p.add_argument(
        "--top-k", type=int_in(0), default=0, help="keep the k most likely tokens (0 = off)"
    )
    p.add_argument(
        "--top-p",
        type=float_in(0.0, 1.0, low_open=True),
        default=1.0,
        help="nucleus mass in (0, 1] (1 = off)",
    )
    p.add_argument(
        "--seed",
        type=int_in(0, MAX_SEED),
        default=0,
        help="seeds the sampler (and `--model random`'s weights)",
    )
    # the default: the baseline, first in the registry's listing
    p.add_argument(
        "--algorithm",
        type=algorithm_name,
        default=registry.engine_names()[0],
        help=_algorithm_help(),
    )
    p.add_argument(
        "--num-steps",
        type=int_in(1),
        default=None,
        help="draft steps (EAGLE; default 3; dflash: num_draft_tokens - 1)",
    )
    p.add_argument("--topk", type=int_in(1), default=1, help="draft branching per step (default 1)")
    p.add_argument(
        "--num-draft-tokens",
        type=int_in(1),
        default=None,
        metavar="N",
        help="tokens verified per step, root included (default 4; dflash: the drafter's block)",
    )
    p.add_argument(
        "--no-overlap", action="store_true", help="run scheduling and the forward synchronously"
    )
    which = p.add_mutually_exclusive_group()
    which.add_argument(
        "--model",
        type=model_arg,
        metavar="MODEL",
        help="`smollm2` (the default), a Llama .gguf file, a Hugging Face Llama checkpoint "
        "directory, or `random`",
    )
    which.add_argument(
        "--toy",
        action="store_true",
        help="the shipped byte-level demo model (trained here on Python source; no chat "
        f"template) and its drafters: {', '.join(registry.toy_drafters())}",
    )
    p.add_argument(
        "--dtype",
        choices=("float32", "bfloat16", "int8"),
        help="the weights' precision (default: float32 for GGUF files, whose quantized "
        "matrices the CPU decoder then reads as stored; the checkpoint's own else); bfloat16 "
        "rounds the weights, and reads half the bytes of float32 weights; int8 multiplies "
        "a GGUF file's Q4_0/Q4_1/Q8_0 matrices with 8-bit activations (integer dot products)",
    )
    p.add_argument(
        "--draft-model",
        type=model_dir,
        metavar="DIR",
        help="draft checkpoint directory (EAGLE head, MTP drafter or standalone model; default: "
        "the shipped one with the shipped model, else random)",
    )
    p.add_argument(
        "--draft-quantization",
        type=str.lower,
        choices=DRAFT_QUANTIZATIONS,
        help="quantize the drafter's matrices after loading to llama.cpp's Q8_0, Q4_1 or Q4_0, "
        "which the CPU decoder reads in about a half, a third or a quarter of the time of "
        "bfloat16 (the drafts change by the rounding, the tokens stay the same)",
    )
    p.add_argument("--device", type=torch_device, default="cpu", help="torch device (default cpu)")
    p.set_defaults(func=cmd_generate)


def cmd_generate(args: argparse.Namespace) -> int:
    """``relayc generate``: 0 ok, 2 usage errors (raised as ``UsageError`` where the bad value
    is read; the engine's ``EngineArgumentError`` becomes one here, and a checkpoint's
    ``CheckpointError`` from anywhere reaches ``relayc.cli.main`` as one, too)."""
    # Imported here: torch is slow to import, and `relayc validate` should not pay for it.
    from relayc.engine.checkpoints.named import named_model_file
    from relayc.engine.core.sampling import SamplingParams
    from relayc.engine.decoder.cpu_decoder import cpu_path
    from relayc.engine.errors import CheckpointError
    from relayc.engine.serving.engine import Engine
    from relayc.engine.serving.engine_args import EngineArgumentError
    from relayc.engine.serving.overlap import set_cpu_threads
    from relayc.engine.text.chat import Chat

    set_cpu_threads()  # as `relayc demo` and the benchmarks do

    def progress(line: str) -> None:
        print(printable(line), file=sys.stderr, flush=True)  # loader lines name files

    model = None if args.toy else (args.model or REAL_MODEL)
    _check_drafter(args, model)
    try:
        if model == REAL_MODEL:
            named_model_file(REAL_MODEL)  # not installed: say how, and name the alternative
    except CheckpointError as exc:
        raise UsageError(f"{exc}; or pass --toy for the byte-level demo model") from None
    if args.device == "cpu":
        _build_native_decoder(progress)
    num_steps: int | None = args.num_steps
    num_draft_tokens: int | None = args.num_draft_tokens
    block_drafter = registry.default_dims(args.algorithm, None, None) == (None, None)
    if block_drafter and num_steps is not None and num_draft_tokens is None:
        # As --help says: a drafter whose block settles the dims (DFlash) drafts num_steps
        # tokens in one block, the bonus token ahead of them. Passed on as is, the engine
        # would compare it with the drafter's block only once the drafter is loaded.
        num_draft_tokens, num_steps = num_steps + 1, None
    try:
        engine = Engine(
            model=model,
            dtype=args.dtype,
            progress=progress,
            algorithm=args.algorithm,
            num_steps=num_steps,
            topk=args.topk,
            num_draft_tokens=num_draft_tokens,
            draft_model=args.draft_model,
            draft_quantization=args.draft_quantization,
            overlap=not args.no_overlap,
            seed=args.seed,
            device=args.device,
        )
    except EngineArgumentError as exc:
        raise UsageError(str(exc)) from None
    max_new_tokens = args.max_new_tokens
    if max_new_tokens is None:
        chat = args.chat is not None
        max_new_tokens = CHAT_MAX_NEW_TOKENS if chat else PROMPT_MAX_NEW_TOKENS
    params = SamplingParams(
        max_new_tokens=max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
    )
    with engine:
        if (args.prompt is not None or args.chat is not None) and engine.tokenizer is None:
            why = f": {engine.tokenizer_error}" if engine.tokenizer_error else ""
            raise UsageError(
                f"this model has no tokenizer (vocabulary of {engine.model.config.vocab_size})"
                f"{why}; give the prompt as token ids: --prompt-ids 1,2,3"
            )
        prompt: Prompt
        if args.chat is not None:
            prompt = Chat([{"role": "user", "content": args.chat}])
        else:
            prompt = args.prompt if args.prompt is not None else args.prompt_ids
        start = time.perf_counter()
        tokens, finish, first = _stream(engine, prompt, params)
        elapsed = time.perf_counter() - start
    overlap = "off" if args.no_overlap else "on"
    accept = engine.scheduler.stats.mean_accept_length
    # The first token waits for the prompt's prefill; the rest is the decoding speed.
    after = (
        f", then {(tokens - 1) / (elapsed - first):.1f} tokens/s"
        if first is not None and tokens > 1 and elapsed > first
        else ""
    )
    ttft = f"first token after {first:.2f} s{after}; " if first is not None else ""
    print(
        f"{tokens} tokens in {elapsed:.2f} s, {tokens / elapsed:.1f} tokens/s "
        f"({ttft}finish: {finish}, overlap {overlap}), algorithm {args.algorithm}, "
        f"mean accept length {accept:.2f}",
        file=sys.stderr,
    )
    if engine.device.type == "cpu":
        print(f"decoded with {cpu_path(engine.model)}", file=sys.stderr)
    return EXIT_OK


def _stream(
    engine: Engine, prompt: Prompt, params: SamplingParams
) -> tuple[int, str, float | None]:
    """Write the completion to stdout as it arrives: its text, or its token ids when the
    model has no tokenizer. Returns the token count, the finish reason and the seconds
    until the first token arrived (None: none did)."""
    tokens, finish, first = 0, None, None
    start = time.perf_counter()
    try:
        with closing(engine.stream([prompt], params)) as deltas:
            for delta in deltas:
                if delta.error:
                    raise UsageError(delta.error)
                if engine.tokenizer:
                    text = delta.text
                else:
                    text = " ".join(str(t) for t in delta.token_ids)
                    text = f" {text}" if tokens and text else text
                sys.stdout.write(printable(text))
                sys.stdout.flush()
                if first is None and delta.token_ids:
                    first = time.perf_counter() - start
                tokens += len(delta.token_ids)
                finish = delta.finish_reason or finish
    finally:
        if tokens:  # end the streamed line, also when cut short (Ctrl-C, an error)
            sys.stdout.write("\n")
    return tokens, str(finish), first


def _check_drafter(args: argparse.Namespace, model: str | None) -> None:
    """Refuse, before any model loads, what the engine would refuse only after loading:
    an algorithm with no drafter for the model, a drafter quantization it cannot apply."""
    runs = runnable(model)
    if args.draft_model is None and runs is not None and args.algorithm not in runs:
        name = "the byte-level demo model (--toy)" if model is None else f"{model!r}"
        raise UsageError(
            f"no `{args.algorithm}` drafter ships for {name}: with it run "
            f"{quoted_list(runs)}, or bring a trained `{args.algorithm}` drafter with "
            "--draft-model DIR"
        )
    if model is None and args.draft_model is None:
        num_steps, _ = registry.default_dims(args.algorithm, args.num_steps, args.num_draft_tokens)
        try:  # the MTP drafter serves its own number of steps only
            registry.shipped_drafter(args.algorithm, num_steps)
        except (ValueError, FileNotFoundError) as exc:
            raise UsageError(f"{exc} (here: --num-steps N, --draft-model DIR)") from None
    if args.draft_quantization is not None:
        if args.dtype == "bfloat16":
            raise UsageError(
                f"--draft-quantization {args.draft_quantization} quantizes float32 matrices; "
                "drop --dtype bfloat16 (or the quantization)"
            )
        if args.device != "cpu":
            raise UsageError(
                f"--draft-quantization is read by the native CPU decoder; on {args.device} it "
                "would only change the drafts: drop it"
            )


def _build_native_decoder(progress: Callable[[str], None]) -> None:
    """Build the native CPU decoder now, when it is not cached yet, saying so: the first
    run compiles it (~20 s, once per machine and compiler), and inside the model load it
    looked like a slow load, silent, and was reported as one."""
    from relayc.engine.native.library import build_progress, cache_dir, native_decoder

    def report(seconds: float | None) -> None:
        if seconds is None:
            progress("building the native decoder for this CPU (once, ~20 s)...")
        else:
            progress(
                f"built the native decoder in {seconds:.1f} s (cached in {_home(cache_dir())})"
            )

    with build_progress(report):
        native_decoder()  # None (and a warning) where it cannot be built: torch layers then


def _home(path: Path) -> str:
    """``path`` with the home folder written ``~``, as a reader would type it."""
    try:
        return f"~/{path.relative_to(Path.home()).as_posix()}"
    except ValueError:
        return str(path)
