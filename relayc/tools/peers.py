"""Hugging Face transformers as a peer on the same weights: a tool over the engine.

The shipped target and its standalone draft model are plain ``LlamaForCausalLM``
checkpoints, so transformers loads them unchanged; SmolLM2-135M-Instruct is read by
transformers' own GGUF loader from the same file relayc reads (``HFTarget.smollm2``).
Every peer here decodes greedily from token ids, as relayc's engine does with the same
prompts (the toy: BOS + bytes, no stop token; SmolLM2: its chat template, stopping at
its end-of-generation tokens, as relayc does), so its outputs can be compared with
relayc's greedy `none` token for token. `relayc demo` and ``bench/peers.py`` both build
their transformers rows from here.

transformers is optional (a test extra, not a runtime dependency): it is imported only
when a peer is built; :func:`transformers_missing` says why it cannot be, without raising.
"""

from __future__ import annotations

import contextlib
import functools
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from relayc.engine.checkpoints.shipped import DEMO_DIR
from relayc.engine.text.bytes import ByteTokenizer

PAD_ID = ByteTokenizer.pad_id

HF_GREEDY = "hf greedy"
HF_BARE_LOOP = "hf bare loop"
HF_PROMPT_LOOKUP = "hf prompt lookup"
HF_ASSISTED_DEFAULTS = "hf assisted (defaults)"

# (prompts as token ids, concurrency) -> (new token ids per prompt, accept lengths)
RunFn = Callable[[list[list[int]], int], tuple[list[list[int]], list[float]]]


@dataclass
class Peer:
    label: str
    run: RunFn
    max_batch: int = 1 << 30  # peers that decode one request at a time only
    close: Callable[[], None] = lambda: None


def transformers_missing() -> str | None:
    """Why transformers cannot be imported (one line), or None when it can."""
    try:
        import transformers  # noqa: F401
    except ImportError as exc:  # also a module set to None in sys.modules
        return f"transformers is not importable ({exc})"
    return None


@dataclass
class Timing:
    wall: float  # seconds
    cpu: float  # process CPU seconds

    @property
    def share(self) -> float:
        """CPU time per wall second: near 1.0 with one torch thread on an unstarved CPU."""
        return self.cpu / self.wall


def round_robin(runs: Sequence[Callable[[], object]], repeats: int) -> list[list[Timing]]:
    """Every run timed ``repeats`` times, one call of each per round, so a slow spell of a
    shared CPU does not fall on one run's calls only; the timings of each run, in order."""
    timings: list[list[Timing]] = [[] for _ in runs]
    for _ in range(max(repeats, 1)):
        for run, times in zip(runs, timings, strict=True):
            start_wall, start_cpu = time.perf_counter(), time.process_time()
            run()
            times.append(Timing(time.perf_counter() - start_wall, time.process_time() - start_cpu))
    return timings


class ForwardCounter:
    """Counts a model's forwards (accept length = new tokens per target forward)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.calls = 0
        model.register_forward_pre_hook(self._hook)

    def _hook(self, *_: Any) -> None:
        self.calls += 1


def left_padded(
    prompts: Sequence[list[int]], pad_id: int = PAD_ID
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and attention mask of ``prompts`` padded on the left to one width."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.int64)
    mask = torch.zeros((len(prompts), width), dtype=torch.int64)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt)
        mask[row, width - len(prompt) :] = 1
    return ids, mask


@contextlib.contextmanager
def quiet_tqdm() -> Iterator[None]:
    """No progress bar from transformers' GGUF loader inside: it calls tqdm itself, past
    transformers' own progress-bar switch (and tqdm reads ``TQDM_*`` only when imported)."""
    try:
        import transformers.modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:  # another transformers layout: a bar is all it costs
        yield
        return
    original = getattr(gguf_utils, "tqdm", None)
    if original is None:
        yield
        return
    gguf_utils.tqdm = functools.partial(original, disable=True)
    try:
        yield
    finally:
        gguf_utils.tqdm = original


def load_llama(directory: Path) -> Any:
    """A shipped checkpoint as transformers' ``LlamaForCausalLM``, set up for greedy
    decoding with no stop token (relayc's engine stops on length only here too)."""
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    model = transformers.LlamaForCausalLM.from_pretrained(
        directory, dtype=torch.float32, attn_implementation="sdpa"
    ).eval()
    config = model.generation_config
    config.pad_token_id, config.eos_token_id, config.bos_token_id = PAD_ID, None, None
    config.do_sample = False
    return model


@dataclass
class HFTarget:
    """transformers' peers over one loaded target: greedy ``generate``, prompt lookup,
    assisted generation with the shipped standalone draft, a bare model + cache + argmax
    loop. Each method returns a :class:`Peer`."""

    max_new_tokens: int
    checkpoints: Path = DEMO_DIR
    model: Any = None  # a loaded transformers model; None: the shipped target
    pad_id: int = PAD_ID
    counter: ForwardCounter = field(init=False)

    def __post_init__(self) -> None:
        if self.model is None:
            self.model = load_llama(self.checkpoints / "target")
        self.counter = ForwardCounter(self.model)

    @classmethod
    def smollm2(cls, max_new_tokens: int, dtype: torch.dtype = torch.float32) -> HFTarget:
        """SmolLM2-135M-Instruct through transformers' GGUF loader (``gguf`` and
        ``accelerate`` installed), on the file relayc reads; greedy, stopping at the
        tokens relayc's engine stops at (the file's end-of-generation ids)."""
        import transformers

        from relayc.engine.checkpoints.gguf import open_gguf
        from relayc.engine.checkpoints.named import named_model_file
        from relayc.engine.text.tokenizer import tokenizer_from_gguf

        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()
        path = named_model_file("smollm2")
        with quiet_tqdm():  # its GGUF loader draws a bar of its own, not transformers'
            model = transformers.AutoModelForCausalLM.from_pretrained(
                path.parent, gguf_file=path.name, dtype=dtype, attn_implementation="sdpa"
            ).eval()
        eog = list(tokenizer_from_gguf(open_gguf(path)).eog_ids)
        config = model.generation_config
        config.eos_token_id, config.do_sample = eog, False
        config.pad_token_id = pad = model.config.pad_token_id or eog[0]
        config.temperature = config.top_p = config.top_k = None
        return cls(max_new_tokens, model=model, pad_id=pad)

    @property
    def has_draft(self) -> bool:
        """Whether a draft with the same tokenizer exists for assisted generation."""
        return (self.checkpoints / "standalone" / "config.json").is_file() and (
            self.model.config.vocab_size == ByteTokenizer.vocab_size
        )

    def _generate(self, **extra: Any) -> RunFn:
        # Plain greedy spends a first forward on the prompt alone; assisted generation's
        # first forward verifies the first candidates along with the prompt.
        prefill = 0 if extra else 1

        @torch.no_grad()
        def run(prompts: list[list[int]], group: int) -> tuple[list[list[int]], list[float]]:
            outputs: list[list[int]] = []
            accepts: list[float] = []
            for g in range(0, len(prompts), group):
                ids, mask = left_padded(prompts[g : g + group], self.pad_id)
                before = self.counter.calls
                out = self.model.generate(
                    ids, attention_mask=mask, max_new_tokens=self.max_new_tokens, **extra
                )
                new = out[:, ids.shape[1] :]
                outputs.extend(self._until_stop(row) for row in new.tolist())
                steps = self.counter.calls - before - prefill
                if steps > 0 and len(new) == 1:
                    accepts.append((new.shape[1] - prefill) / steps)
            return outputs, accepts

        return run

    def _until_stop(self, row: list[int]) -> list[int]:
        """A generated row up to and including its first stop token (a batch pads the rows
        that stopped early)."""
        stops = self.model.generation_config.eos_token_id
        stops = set(stops if isinstance(stops, list) else [] if stops is None else [stops])
        for index, token in enumerate(row):
            if token in stops:
                return row[: index + 1]
        return row

    def greedy(self) -> Peer:
        return Peer(HF_GREEDY, self._generate())

    def prompt_lookup(self, tokens: int = 10) -> Peer:
        """n-gram drafting from the prompt; one request at a time (transformers' rule)."""
        return Peer(HF_PROMPT_LOOKUP, self._generate(prompt_lookup_num_tokens=tokens), 1)

    def assisted(self, constant: int | None = None) -> Peer:
        """Assisted generation with the shipped standalone draft: transformers' defaults
        (up to 20 tokens, confidence-threshold early stop, adapted draft length), or a
        ``constant`` number of draft tokens. Each call loads its own draft copy, because
        transformers keeps the adapted draft length on the assistant's generation config
        across calls."""
        draft = load_llama(self.checkpoints / "standalone")
        label = HF_ASSISTED_DEFAULTS
        if constant is not None:
            draft.generation_config.num_assistant_tokens = constant
            draft.generation_config.num_assistant_tokens_schedule = "constant"
            draft.generation_config.assistant_confidence_threshold = 0.0
            label = f"hf assisted ({constant} const)"
        return Peer(label, self._generate(assistant_model=draft), 1)

    def bare_loop(self) -> Peer:
        """The target, a ``DynamicCache`` and argmax, no ``generate``: what transformers'
        generation machinery costs on top."""
        import transformers

        # The loop passes `past_key_values`, which transformers >= 4.45 all accept (newer
        # ones warn that it is to be renamed).
        warnings.filterwarnings("ignore", category=FutureWarning, module="torch.nn.modules")
        model, max_new_tokens = self.model, self.max_new_tokens

        @torch.no_grad()
        def run(prompts: list[list[int]], group: int) -> tuple[list[list[int]], list[float]]:
            outputs: list[list[int]] = []
            for g in range(0, len(prompts), group):
                ids, mask = left_padded(prompts[g : g + group])
                positions = (mask.cumsum(-1) - 1).clamp(min=0)
                cache = transformers.DynamicCache()
                logits = model(
                    ids, attention_mask=mask, position_ids=positions, past_key_values=cache
                ).logits[:, -1]
                tokens = [logits.argmax(-1)]
                for _ in range(max_new_tokens - 1):
                    mask = torch.cat([mask, mask.new_ones(len(mask), 1)], dim=1)
                    positions = positions[:, -1:] + 1
                    logits = model(
                        tokens[-1][:, None],
                        attention_mask=mask,
                        position_ids=positions,
                        past_key_values=cache,
                    ).logits[:, -1]
                    tokens.append(logits.argmax(-1))
                outputs.extend(torch.stack(tokens, dim=1).tolist())
            return outputs, []

        return Peer(HF_BARE_LOOP, run)
