"""The reference engine: a Llama-architecture model, paged KV cache and an overlap scheduler.

config.py         ModelConfig and the tiny byte-level default
kv_cache.py       ReqToTokenPool, TokenToKVPool (KV-slot allocator), KVCache
forward_batch.py  ForwardBatch: one forward's tokens, slots and attention mode
attention.py      batched attention over the paged cache, and the dense path
model.py          LlamaForCausalLM
weights.py        seeded init, Hugging Face checkpoint load / save
sampling.py       SamplingParams and the counter-keyed batched sampler
tokenizer.py      ByteTokenizer
naive.py          greedy_generate_naive, the cache-free reference
request.py        Request (the scheduler's record), Output, StreamDelta, FinishReason
algorithms.py     DecodeAlgorithm, and GeneratedAlgorithm: any spec's generated prefill /
                  decode steps on the op implementations (one or several tokens per step)
speculative.py    each algorithm's drafter and decode KV window
step_batch.py     one forward as prepared on the host, and its move to the device
overlap.py        forward runners: inline, worker thread (CPU), forward stream (CUDA)
scheduler.py      admission, batching and the overlap contract
engine.py         Engine: generate / stream, bad-input handling
ops/              the implementations of the spec's ops on this engine

The tools over the engine (``relayc generate``, ``relayc demo``, training) live in
``relayc.tools``. The names below load on first use (PEP 562), so ``relayc.tools.generate``
-- which ``relayc``'s command line imports for every command -- does not pull in torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from relayc.engine.algorithms import DecodeAlgorithm, StepInputs, StepOutput
    from relayc.engine.config import TINY_CONFIG, ModelConfig
    from relayc.engine.engine import Engine
    from relayc.engine.forward_batch import ForwardBatch, ForwardMode
    from relayc.engine.kv_cache import KVCache, ReqToTokenPool, TokenToKVPool
    from relayc.engine.model import ForwardOutput, LlamaForCausalLM
    from relayc.engine.naive import greedy_generate_naive
    from relayc.engine.request import FinishReason, Output, StreamDelta
    from relayc.engine.sampling import SamplingBatch, SamplingParams, sample
    from relayc.engine.tokenizer import ByteTokenizer
    from relayc.engine.weights import (
        CheckpointError,
        init_random,
        load_checkpoint,
        random_model,
        save_checkpoint,
    )

_EXPORTS: dict[str, str] = {
    "DecodeAlgorithm": "relayc.engine.algorithms",
    "StepInputs": "relayc.engine.algorithms",
    "StepOutput": "relayc.engine.algorithms",
    "TINY_CONFIG": "relayc.engine.config",
    "ModelConfig": "relayc.engine.config",
    "Engine": "relayc.engine.engine",
    "ForwardBatch": "relayc.engine.forward_batch",
    "ForwardMode": "relayc.engine.forward_batch",
    "KVCache": "relayc.engine.kv_cache",
    "ReqToTokenPool": "relayc.engine.kv_cache",
    "TokenToKVPool": "relayc.engine.kv_cache",
    "ForwardOutput": "relayc.engine.model",
    "LlamaForCausalLM": "relayc.engine.model",
    "greedy_generate_naive": "relayc.engine.naive",
    "FinishReason": "relayc.engine.request",
    "Output": "relayc.engine.request",
    "StreamDelta": "relayc.engine.request",
    "SamplingBatch": "relayc.engine.sampling",
    "SamplingParams": "relayc.engine.sampling",
    "sample": "relayc.engine.sampling",
    "ByteTokenizer": "relayc.engine.tokenizer",
    "CheckpointError": "relayc.engine.weights",
    "init_random": "relayc.engine.weights",
    "load_checkpoint": "relayc.engine.weights",
    "random_model": "relayc.engine.weights",
    "save_checkpoint": "relayc.engine.weights",
}

__all__ = [
    "TINY_CONFIG",
    "ByteTokenizer",
    "CheckpointError",
    "DecodeAlgorithm",
    "Engine",
    "FinishReason",
    "ForwardBatch",
    "ForwardMode",
    "ForwardOutput",
    "KVCache",
    "LlamaForCausalLM",
    "ModelConfig",
    "Output",
    "ReqToTokenPool",
    "SamplingBatch",
    "SamplingParams",
    "StepInputs",
    "StepOutput",
    "StreamDelta",
    "TokenToKVPool",
    "greedy_generate_naive",
    "init_random",
    "load_checkpoint",
    "random_model",
    "sample",
    "save_checkpoint",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
