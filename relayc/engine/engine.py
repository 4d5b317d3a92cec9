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

from collections.abc import Callable, Iterator, Mapping, Sequence
from os import PathLike
from types import ModuleType
from typing import Any

import torch

from relayc.engine.algorithms import DecodeAlgorithm, check_algorithm, make_algorithm
from relayc.engine.config import ModelConfig
from relayc.engine.graphs import DecodeGraphs
from relayc.engine.model import LlamaForCausalLM, use_cpu_matmul_layout
from relayc.engine.overlap import make_runner
from relayc.engine.request import FinishReason, Output, Request, StreamDelta
from relayc.engine.sampling import SamplingParams
from relayc.engine.scheduler import Scheduler, SchedulerConfig
from relayc.engine.shipped import RANDOM, shipped_drafter, shipped_target
from relayc.engine.tokenizer import VOCAB_SIZE, ByteTokenizer
from relayc.engine.weights import load_checkpoint, random_model

Prompt = str | Sequence[int]


class Engine:
    """Generate with a Llama model on the paged cache, overlapping scheduling with the forward.

    ``model``: None for the shipped byte-level demo target trained on Python source
    (``relayc/assets/demo``; with it ``draft_model=None`` means the shipped drafter of
    ``algorithm``), ``"random"`` for the same tiny architecture with random weights from
    ``seed``, a Hugging Face Llama checkpoint directory, or a ``LlamaForCausalLM``.
    ``seed`` also seeds every request whose ``SamplingParams.seed`` is None
    (``seed + index in the call``). ``debug=True`` poisons the relay buffers and
    checks every KV free (slower; for tests).

    ``algorithm``: ``"none"`` or a speculative algorithm (``"eagle"``,
    ``"eagle_multilayer"``, ``"ngram"``, ``"standalone"``), which ``num_steps``,
    ``topk``, ``num_draft_tokens`` and ``draft_model`` configure; or a
    ``DecodeAlgorithm`` built on ``model`` with relay rows for ``req_pool_size``
    slots (custom algorithms, tests). ``block_verification=True``: sampled requests of a
    chain-drafting algorithm (``"standalone"``) are verified by block verification (Sun
    et al. 2024) instead of token by token; lossless either way.

    ``relay_module``: a module ``relayc compile`` generated from your own spec, run
    instead of ``relayc.generated.<algorithm>`` with the drafter of ``algorithm``.
    ``impls``: op name -> ``fn(ctx, **inputs) -> dict of outputs``, merged over the
    engine's own implementations (user ops, or replacing a built-in one); an op the
    module runs without an implementation raises here.
    ``graphs``: how decode steps run (``relayc.engine.graphs``): ``"auto"`` (CUDA graphs
    on CUDA, eager elsewhere), ``"graph"``, ``"static"`` (the graph path's static buffers
    and padding without CUDA graphs) or ``"off"``; ``capture_batch_sizes`` overrides the
    spec's buckets (capped by ``max_batch_size``; larger batches run eagerly).
    """

    def __init__(
        self,
        model: str | PathLike[str] | LlamaForCausalLM | None = None,
        algorithm: str | DecodeAlgorithm = "none",
        num_steps: int = 3,
        topk: int = 1,
        num_draft_tokens: int = 4,
        draft_model: Any = None,
        overlap: bool = True,
        seed: int = 0,
        *,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | None = None,
        max_batch_size: int = 64,
        req_pool_size: int | None = None,
        kv_pool_tokens: int = 16384,
        max_context: int | None = None,
        max_prefill_tokens: int = 4096,
        debug: bool = False,
        block_verification: bool = False,
        relay_module: ModuleType | None = None,
        impls: Mapping[str, Callable[..., Any]] | None = None,
        graphs: str = "auto",
        capture_batch_sizes: Sequence[int] | None = None,
    ) -> None:
        if not isinstance(algorithm, DecodeAlgorithm):
            check_algorithm(algorithm)
        self.device = torch.device(device)
        if isinstance(model, LlamaForCausalLM):
            self.model = model
            self.device = model.device
        elif model is None and (shipped := shipped_target()) is not None:
            self.model = load_checkpoint(shipped, device=self.device, dtype=dtype)
            if draft_model is None and isinstance(algorithm, str):
                draft_model = shipped_drafter(algorithm, num_steps)
        elif model is None or model == RANDOM:
            config = ModelConfig() if dtype is None else ModelConfig(dtype=dtype)
            self.model = random_model(config, seed=seed, device=self.device)
        else:
            self.model = load_checkpoint(model, device=self.device, dtype=dtype)
        self.model.eval()
        self.overlap, self.seed = overlap, seed
        config = self.model.config
        self.tokenizer = ByteTokenizer() if config.vocab_size == VOCAB_SIZE else None
        context = min(max_context or config.max_position, config.max_position)
        self.config = SchedulerConfig(
            max_batch_size=max_batch_size,
            # A finished request holds its slot until its last forward is processed.
            req_pool_size=req_pool_size or 2 * max_batch_size,
            kv_pool_tokens=kv_pool_tokens,
            max_context=context,
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
                module=relay_module,
                impls=impls,
            )
        self.algorithm_name = self.algorithm.name
        self.algorithm.graphs = DecodeGraphs.build(
            graphs,
            self.device,
            self.algorithm.capture_batch_sizes,
            max_batch_size=max_batch_size,
            batch_sizes=capture_batch_sizes,
            debug=debug,
        )
        if self.device.type == "cpu":
            for module in (self.model, *self.algorithm.draft_modules()):
                use_cpu_matmul_layout(module)
        self.runner = make_runner(self.device, overlap)
        self.scheduler = Scheduler(
            self.model, self.algorithm, self.runner, self.config, check_pools=debug
        )

    def close(self) -> None:
        self.runner.close()

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
        for delta in self._run(requests, rejected):
            tokens[delta.index].extend(delta.token_ids)
            if delta.finish_reason is None:
                continue
            ids = tokens[delta.index]
            request = requests.get(delta.index)
            outputs[delta.index] = Output(
                index=delta.index,
                prompt_token_ids=request.prompt_ids if request else [],
                token_ids=ids,
                text=self.tokenizer.decode(ids) if self.tokenizer else None,
                finish_reason=delta.finish_reason,
                error=delta.error,
                accept_lengths=list(request.accept_lengths) if request else [],
            )
        return [outputs[i] for i in range(len(prompts))]

    def stream(
        self,
        prompts: Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        arrivals: Sequence[int] | None = None,
    ) -> Iterator[StreamDelta]:
        """Yield ``StreamDelta``s as tokens reach the host; each request's last has a finish reason.

        Rejected requests come first. Closing the iterator early aborts the rest.
        One call at a time: a stream must be exhausted or closed before the next call.
        """
        return self._run(*self._submit(prompts, params, arrivals))

    def _submit(
        self,
        prompts: Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None,
        arrivals: Sequence[int] | None,
    ) -> tuple[dict[int, Request], list[StreamDelta]]:
        """Check every request (eagerly, so call mistakes raise here); queue nothing yet."""
        params_list = self._params_list(prompts, params)
        arrival_list = self._arrival_list(prompts, arrivals)
        requests: dict[int, Request] = {}
        rejected: list[StreamDelta] = []
        for index, (prompt, p) in enumerate(zip(prompts, params_list, strict=True)):
            request_or_error = self._make_request(index, prompt, p, arrival_list[index])
            if isinstance(request_or_error, str):
                rejected.append(StreamDelta(index, [], "", FinishReason.ERROR, request_or_error))
            else:
                requests[index] = request_or_error
        return requests, rejected

    def _run(
        self, requests: dict[int, Request], rejected: list[StreamDelta]
    ) -> Iterator[StreamDelta]:
        # Requests reach the scheduler on the first next(), so a stream that is
        # never iterated leaves nothing behind; arrivals count from then.
        live = dict(requests)
        byte_text = self.tokenizer is not None
        try:
            for request in live.values():
                request.arrival += self.scheduler.iteration
                self.scheduler.add_request(request)
            yield from rejected
            while live:
                for request in self.scheduler.step():
                    delta = request.take_delta(byte_text)
                    if delta.token_ids or delta.finish_reason is not None:
                        yield delta
                    if request.finish_reason is not None:
                        live.pop(request.rid, None)
        finally:
            for request in live.values():
                self.scheduler.abort(request)
            self.scheduler.drain()

    # -- request checks -------------------------------------------------------------------
    @staticmethod
    def _check_prompts(prompts: Sequence[Prompt]) -> None:
        if isinstance(prompts, str) or not isinstance(prompts, Sequence):
            raise TypeError("`prompts` must be a list of strings or token-id lists, not a string")

    def _params_list(
        self,
        prompts: Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None,
    ) -> list[SamplingParams]:
        self._check_prompts(prompts)
        if params is None or isinstance(params, SamplingParams):
            return [params or SamplingParams()] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"got {len(params)} SamplingParams for {len(prompts)} prompts")
        return list(params)

    @staticmethod
    def _arrival_list(prompts: Sequence[Prompt], arrivals: Sequence[int] | None) -> list[int]:
        if arrivals is None:
            return [0] * len(prompts)
        if len(arrivals) != len(prompts) or any(a < 0 for a in arrivals):
            raise ValueError("`arrivals` needs one non-negative iteration per prompt")
        return [int(a) for a in arrivals]

    def _encode(self, prompt: Prompt) -> list[int] | str:
        """Token ids, or an error message."""
        vocab = self.model.config.vocab_size
        if isinstance(prompt, str):
            if not prompt:
                return "prompt is empty"
            if self.tokenizer is None:
                return "string prompts need a tokenizer and this model has none; pass token ids"
            return self.tokenizer.encode(prompt, add_bos=True)
        if not isinstance(prompt, Sequence) or isinstance(prompt, bytes):
            return f"a prompt must be a string or a list of token ids; got {type(prompt).__name__}"
        ids = list(prompt)
        if not ids:
            return "prompt is empty"
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            return "prompt token ids must be integers"
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            shown = ", ".join(map(str, bad[:5])) + (", ..." if len(bad) > 5 else "")
            return f"prompt token ids [{shown}] are outside the vocabulary [0, {vocab})"
        return ids

    def _make_request(
        self, index: int, prompt: Prompt, params: object, arrival: int
    ) -> Request | str:
        ids = self._encode(prompt)
        if isinstance(ids, str):
            return ids
        if not isinstance(params, SamplingParams):
            return f"sampling params must be a SamplingParams; got {type(params).__name__}"
        for name in ("max_new_tokens", "top_k"):
            value = getattr(params, name)
            if not isinstance(value, int) or isinstance(value, bool):
                return f"invalid sampling params: `{name}` must be an integer; got {value!r}"
        try:
            params.validate(self.model.config.vocab_size)
        except (TypeError, ValueError) as exc:
            return f"invalid sampling params: {exc}"
        context = self.config.max_context
        if len(ids) > context:
            return (
                f"prompt has {len(ids)} tokens but the context holds {context} "
                "(`max_context`); shorten the prompt"
            )
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
        if request.kv_need > self.config.kv_pool_tokens:
            width = request.decode_width
            windows = f" + 2 * ({width} - 1) for decode windows" if width > 1 else ""
            return (
                f"request needs {request.kv_need} KV slots (prompt + max_new_tokens - 1{windows}) "
                f"but the pool holds {self.config.kv_pool_tokens}; raise `kv_pool_tokens` or lower "
                "`max_new_tokens`"
            )
        return request
