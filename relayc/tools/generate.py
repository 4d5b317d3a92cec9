"""``relayc generate``: stream one completion from the reference engine.

Streamed text goes to stdout as it arrives (token ids, space-separated, for a
model without a tokenizer); the summary line (tokens, tokens/s, mean accept
length) goes to stderr, so stdout holds only the completion.
"""

from __future__ import annotations

import argparse
import sys
import time
from contextlib import closing
from typing import TYPE_CHECKING

from relayc.specs.errors import EXIT_OK, UsageError
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

# relayc.engine.checkpoints.quantize.QUANTIZATIONS (a test keeps them equal), not imported
# here: it imports torch
DRAFT_QUANTIZATIONS = ("q8_0", "q4_1", "q4_0")
REAL_MODEL = "smollm2"  # the default model, as `relayc demo`'s (relayc.tools.demo)

if TYPE_CHECKING:  # torch: `relayc validate` imports this module and should not pay for it
    from relayc.engine.core.sampling import SamplingParams
    from relayc.engine.serving.engine import Engine
    from relayc.engine.serving.request import Prompt

# Control characters a random model happily samples (ESC among them) would
# drive the terminal; print them escaped. Newlines and tabs stay.
_KEEP = {"\n", "\t"}


def _printable(text: str) -> str:
    def escape(c: str) -> str:
        if c.isprintable() or c in _KEEP:
            return c
        return f"\\x{ord(c):02x}" if ord(c) < 256 else f"\\u{ord(c):04x}"

    return "".join(escape(c) for c in text)


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
        epilog="Exit codes: 0 ok, 2 usage errors (bad arguments, checkpoint or request), "
        "130 interrupted (Ctrl-C).",
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
    p.add_argument("--max-new-tokens", type=int_in(1), default=32, metavar="N", help="default 32")
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
    p.add_argument(
        "--algorithm",
        default="none",
        help="none (default: one token per step), eagle, eagle3, eagle_multilayer, ngram, "
        "standalone or dflash",
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
        "template) and its drafters: eagle, eagle_multilayer, standalone, eagle3",
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
    """``relayc generate``: 0 ok, 2 usage errors (raised as ``UsageError``; a checkpoint's
    ``CheckpointError`` from anywhere reaches ``relayc.cli.main`` as one, too)."""
    # Imported here: torch is slow to import, and `relayc validate` should not pay for it.
    from relayc.engine.checkpoints.named import named_model_file
    from relayc.engine.core.sampling import SamplingParams
    from relayc.engine.decoder.cpu_decoder import cpu_path
    from relayc.engine.errors import CheckpointError
    from relayc.engine.serving.engine import Engine
    from relayc.engine.serving.overlap import set_cpu_threads
    from relayc.engine.text.chat import Chat

    set_cpu_threads()  # as `relayc demo` and the benchmarks do

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    model = None if args.toy else (args.model or REAL_MODEL)
    try:
        if model == REAL_MODEL:
            named_model_file(REAL_MODEL)  # not installed: say how, and name the alternative
    except CheckpointError as exc:
        raise UsageError(f"{exc}; or pass --toy for the byte-level demo model") from None
    try:
        engine = Engine(
            model=model,
            dtype=args.dtype,
            progress=progress,
            algorithm=args.algorithm,
            num_steps=args.num_steps,
            topk=args.topk,
            num_draft_tokens=args.num_draft_tokens,
            draft_model=args.draft_model,
            draft_quantization=args.draft_quantization,
            overlap=not args.no_overlap,
            seed=args.seed,
            device=args.device,
        )
    except (ValueError, RuntimeError, OSError) as exc:  # NotImplementedError too
        raise UsageError(str(exc)) from None
    params = SamplingParams(
        max_new_tokens=args.max_new_tokens,
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
                sys.stdout.write(_printable(text))
                sys.stdout.flush()
                if first is None and delta.token_ids:
                    first = time.perf_counter() - start
                tokens += len(delta.token_ids)
                finish = delta.finish_reason or finish
    finally:
        if tokens:  # end the streamed line, also when cut short (Ctrl-C, an error)
            sys.stdout.write("\n")
    return tokens, str(finish), first
