"""A chat corpus the target writes itself: greedy answers to the offline prompts, resumable.

``python -m relayc.tools.train.chat_corpus --out DIR [--prompts N] [--smoke]``

The prompts come from :func:`relayc.tools.train.chat_prompts.build_prompts` (seeded,
offline, held-out prompts excluded). :func:`generate_corpus` asks the target for greedy
answers, ``--chunk`` prompts an ``Engine.chat`` call with ``--batch`` requests decoding
together (the scheduler refills the batch as requests finish), and appends each chunk's
examples to ``DIR/examples.jsonl``, one JSON line an example (prompt text and ids, answer
ids with the stop token, finish reason), so an interrupted run resumes where it stopped:
prompts already answered are skipped and a last line cut short is dropped.
``DIR/manifest.json`` records the prompt list's SHA-256, the model file's SHA-256, the
settings and the counts; a run on a directory made with other settings is refused rather
than mixed. ``DIR/prompts.json`` holds the whole prompt list.

Greedy answers are the target's own up to the batch: a prompt's prefill may share an
eager bfloat16 forward with other prompts, whose rows can differ in the last bits from a
forward alone (relayc.engine.decoder.cpu_decoder), so the same settings (``--batch``, ``--chunk``)
reproduce the corpus, and another batch size can change a few answers.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from relayc.specs.errors import OneLineParser, UsageError
from relayc.tools.args import int_in
from relayc.tools.demo import CHAT_PROMPTS
from relayc.tools.train.chat_prompts import ChatPrompt, build_prompts, prompts_sha256

FORMAT = "relayc-chat-corpus/1"
DEFAULT_PROMPTS = 6000
# Measured on SmolLM2 bfloat16, one thread, 64 chat prompts of 128 new tokens on the shared
# two-core machine: 16 requests 170-210 answer tokens/s, 32 about 310, 64 about 280 (one
# batch of all 64, its tail nearly empty: a longer run might favour 64 a little).
DEFAULT_BATCH = 32
DEFAULT_MAX_NEW_TOKENS = 192
EXAMPLES = "examples.jsonl"
MANIFEST = "manifest.json"
PROMPTS = "prompts.json"
LOCK = "lock"  # flock()ed by the run writing the directory


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


class ChatEngine(Protocol):
    """What generation needs of an engine (``relayc.engine.Engine``, or a fake in tests)."""

    def chat(self, conversations: Any, params: Any = None) -> list[Any]: ...


@dataclass(frozen=True)
class Settings:
    """What the answers depend on besides the prompts; a directory keeps one."""

    model: str  # the model as named to Engine
    model_sha256: str | None  # the weights file's SHA-256 (None: not a single file)
    dtype: str
    max_new_tokens: int
    batch_size: int  # requests decoding together (the engine's max_batch_size)
    chunk: int  # prompts an Engine.chat call: the examples one write appends
    prompt_seed: int


@dataclass
class Progress:
    """The totals of the examples in a corpus file."""

    examples: int = 0
    prompt_tokens: int = 0
    answer_tokens: int = 0
    finish_reasons: Counter[str] = field(default_factory=Counter)

    def add(self, record: dict[str, Any]) -> None:
        self.examples += 1
        self.prompt_tokens += len(record["prompt_ids"])
        self.answer_tokens += len(record["answer_ids"])
        self.finish_reasons[record["finish_reason"]] += 1

    def summary(self) -> dict[str, Any]:
        return {
            "examples": self.examples,
            "prompt_tokens": self.prompt_tokens,
            "answer_tokens": self.answer_tokens,
            "finish_reasons": dict(sorted(self.finish_reasons.items())),
        }


def load_done(path: Path, prompts: Sequence[ChatPrompt], progress: Progress) -> set[int]:
    """The prompt indices already answered in ``path``; a last line cut short by an
    interrupted write is truncated away. Raises ``UsageError`` when a record's prompt is
    not the current list's prompt at its index (another seed or builder)."""
    done: set[int] = set()
    if not path.exists():
        return done
    good_end = 0
    with path.open("rb") as f:
        for line in f:
            try:
                record = json.loads(line) if line.endswith(b"\n") else None
            except json.JSONDecodeError:
                record = None
            if record is None:
                break
            index = record["index"]
            if index >= len(prompts):
                raise UsageError(
                    f"{path} answers prompt {index}; pass `--prompts` {index + 1} or more "
                    "to resume it"
                )
            if prompts[index].text != record["prompt"]:
                raise UsageError(
                    f"{path}: example {index} answers a prompt that is not prompt {index} "
                    "of this prompt list (another `--seed` or builder); use another `--out`"
                )
            if index not in done:
                done.add(index)
                progress.add(record)
            good_end += len(line)
    if good_end != path.stat().st_size:
        with path.open("r+b") as f:
            f.truncate(good_end)
    return done


def _write_json(path: Path, value: Any) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value, indent=1) + "\n")
    os.replace(tmp, path)


def read_manifest(out: Path, settings: Settings) -> dict[str, Any]:
    """``out``'s manifest (a new one when there is none); ``UsageError`` naming what
    differs when ``out`` was made with other settings."""
    manifest_path = out / MANIFEST
    if not manifest_path.exists():
        return {"runs": []}
    manifest = json.loads(manifest_path.read_text())
    kept = manifest.get("settings", {})
    differ = [k for k, v in asdict(settings).items() if kept.get(k) != v]
    if differ:
        pairs = ", ".join(
            f"`{k}` {kept.get(k)!r} there, {getattr(settings, k)!r} now" for k in differ
        )
        raise UsageError(
            f"{out} holds a corpus made with other settings ({pairs}); use the same "
            "settings to resume it, or another `--out`"
        )
    return manifest


def generate_corpus(
    engine: ChatEngine,
    prompts: Sequence[ChatPrompt],
    out: Path,
    settings: Settings,
    *,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Answer every prompt not yet in ``out/examples.jsonl``, ``settings.chunk`` prompts
    an ``engine.chat`` call, appending each chunk's examples (errors are logged and left
    for the next run) and rewriting the manifest after each; returns the manifest.
    ``UsageError`` while another run holds ``out``'s lock."""
    out.mkdir(parents=True, exist_ok=True)
    with (out / LOCK).open("w") as lock:
        # One writer a directory: two would append the same prompts' answers twice.
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UsageError(f"another run is writing {out}; wait for it or stop it") from None
        return _generate(engine, prompts, out, settings, log=log)


def _generate(
    engine: ChatEngine,
    prompts: Sequence[ChatPrompt],
    out: Path,
    settings: Settings,
    *,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    from relayc.engine import SamplingParams  # torch: the prompt builder needs none

    manifest = read_manifest(out, settings)
    progress = Progress()
    examples_path = out / EXAMPLES
    done = load_done(examples_path, prompts, progress)
    _write_json(out / PROMPTS, [{"index": i, **asdict(p)} for i, p in enumerate(prompts)])
    todo = [i for i in range(len(prompts)) if i not in done]
    log(f"{len(done)} of {len(prompts)} prompts answered already; {len(todo)} to go")
    params = SamplingParams(max_new_tokens=settings.max_new_tokens)
    run: dict[str, Any] = {"examples": 0, "answer_tokens": 0, "errors": 0, "seconds": 0.0}
    run["torch"] = torch_version()
    if todo:
        manifest["runs"].append(run)
    started = time.perf_counter()

    def publish() -> None:
        run["seconds"] = round(time.perf_counter() - started, 1)
        run["answer_tokens_per_s"] = round(run["answer_tokens"] / max(run["seconds"], 1e-9), 1)
        manifest.update(
            format=FORMAT,
            settings=asdict(settings),
            prompts={
                "count": len(prompts),
                "sha256": prompts_sha256(prompts),
                "sha256_of": "each prompt's UTF-8 text followed by a NUL byte, in order",
                "families": dict(sorted(Counter(p.family for p in prompts).items())),
                "heldout_excluded": str(CHAT_PROMPTS.relative_to(CHAT_PROMPTS.parents[3])),
            },
            record=(
                "one JSON line an example: index, family, prompt (text), prompt_ids "
                "(the model's chat template: its default system turn, the user turn, the opened "
                "assistant turn), "
                "answer_ids (greedy, the stop token included when it stopped), answer "
                "(text), finish_reason (stop | length)"
            ),
            totals=progress.summary(),
        )
        _write_json(out / MANIFEST, manifest)

    with examples_path.open("a") as f:
        for start in range(0, len(todo), settings.chunk):
            indices = todo[start : start + settings.chunk]
            conversations = [[{"role": "user", "content": prompts[i].text}] for i in indices]
            outputs = engine.chat(conversations, params)
            lines = []
            for index, output in zip(indices, outputs, strict=True):
                if output.finish_reason not in ("stop", "length"):
                    run["errors"] += 1
                    log(f"prompt {index}: {output.finish_reason} {output.error}")
                    continue
                record = {
                    "index": index,
                    "family": prompts[index].family,
                    "prompt": prompts[index].text,
                    "prompt_ids": list(output.prompt_token_ids),
                    "answer_ids": list(output.token_ids),
                    "answer": output.text,
                    "finish_reason": output.finish_reason,
                }
                progress.add(record)
                run["examples"] += 1
                run["answer_tokens"] += len(record["answer_ids"])
                lines.append(json.dumps(record, ensure_ascii=False) + "\n")
            f.write("".join(lines))
            f.flush()
            os.fsync(f.fileno())
            publish()
            log(
                f"{progress.examples}/{len(prompts)} examples, {progress.answer_tokens} "
                f"answer tokens; this run {run['answer_tokens_per_s']} tokens/s"
            )
    publish()
    return manifest


def torch_version() -> str:
    import torch

    return torch.__version__


def model_sha256(model: str) -> str | None:
    """The SHA-256 of the model's weights file (a named model's or a ``.gguf`` path's)."""
    from relayc.engine.checkpoints.named import NAMED_MODELS, named_model_file

    if model in NAMED_MODELS:
        return file_sha256(named_model_file(model))
    path = Path(model)
    return file_sha256(path) if path.is_file() else None


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = OneLineParser(
        prog="python -m relayc.tools.train.chat_corpus",
        description="Build the offline chat prompts and the target's greedy answers.",
    )
    parser.add_argument("--out", required=True, help="directory of the corpus (resumed)")
    parser.add_argument(
        "--prompts", type=int_in(1), default=DEFAULT_PROMPTS, help="how many prompts"
    )
    parser.add_argument("--seed", type=int_in(0), default=0, help="the prompt builder's seed")
    parser.add_argument("--model", default="smollm2", help="the target (Engine's `model`)")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--max-new-tokens", type=int_in(1), default=DEFAULT_MAX_NEW_TOKENS)
    parser.add_argument(
        "--batch", type=int_in(1), default=DEFAULT_BATCH, help="requests decoding together"
    )
    parser.add_argument(
        "--chunk", type=int_in(1), default=128, help="prompts per engine call (per write)"
    )
    parser.add_argument(
        "--smoke", action="store_true", help="16 prompts, 32 new tokens: about a minute"
    )
    parser.add_argument(
        "--print-prompts", action="store_true", help="print the prompts and their hash; no model"
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.prompts, args.max_new_tokens, args.batch, args.chunk = 16, 32, 8, 8
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    prompts = build_prompts(args.prompts, args.seed)
    if args.print_prompts:
        for prompt in prompts:
            print(json.dumps(asdict(prompt)))
        print(f"sha256 {prompts_sha256(prompts)}", file=sys.stderr)
        return 0
    from relayc.engine import Engine
    from relayc.engine.serving.overlap import set_cpu_threads

    set_cpu_threads(1)
    settings = Settings(
        model=args.model,
        model_sha256=model_sha256(args.model),
        dtype=args.dtype,
        max_new_tokens=args.max_new_tokens,
        batch_size=args.batch,
        chunk=args.chunk,
        prompt_seed=args.seed,
    )
    out = Path(args.out)
    try:
        read_manifest(out, settings)  # before the model loads
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    engine = Engine(
        model=args.model,
        dtype=args.dtype,
        max_batch_size=args.batch,
        kv_pool_tokens=max(16384, args.batch * 1024),
        progress=lambda line: print(line, flush=True),
    )
    try:
        manifest = generate_corpus(
            engine,
            prompts,
            out,
            settings,
            log=lambda line: print(line, flush=True),
        )
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    finally:
        engine.close()
    print(json.dumps(manifest["totals"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
