"""The reference engine: a Llama-architecture model, paged KV cache and an overlap scheduler.

Its rooms, bottom to top; a room imports only the rooms below it (tests/test_layering.py):

errors.py     CheckpointError, which every checkpoint and tokenizer reader raises
text/         tokenizers (byte-level, a model's own BPE), chat templates, detokenization
native/       the C library (its C units in csrc/): build and load, call tapes, quantized blocks
core/         the types every forward shares: config, KV pools, forward batch,
              attention, the Llama layers, sampling
decoder/      the native CPU decoder: packed weights, layer stacks and heads in one call
model/        LlamaForCausalLM, its weights (seeded init, checkpoints), the naive reference
checkpoints/  GGUF files, named and shipped models, quantization, the one loader
draft/        the drafters (EAGLE, EAGLE-3, MTP, n-gram, standalone) and each
              algorithm's drafter
ops/          the implementations of the spec's ops on this engine
algorithms/   one module per algorithm, registered as `relayc.algorithms` entry points
serving/      requests, step batches, overlap runners, scheduler, Engine

The tools over the engine (``relayc generate``, ``relayc demo``, training) live in
``relayc.tools``. The names below load on first use (PEP 562), so ``relayc.tools.generate``
-- which ``relayc``'s command line imports for every command -- does not pull in torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from relayc.engine.core.config import TINY_CONFIG, ModelConfig
    from relayc.engine.core.forward_batch import ForwardBatch, ForwardMode
    from relayc.engine.core.kv_cache import KVCache, ReqToTokenPool, TokenToKVPool
    from relayc.engine.core.sampling import SamplingBatch, SamplingParams, sample
    from relayc.engine.errors import CheckpointError
    from relayc.engine.model.llama import ForwardOutput, LlamaForCausalLM
    from relayc.engine.model.naive import greedy_generate_naive
    from relayc.engine.model.weights import (
        init_random,
        load_checkpoint,
        random_model,
        save_checkpoint,
    )
    from relayc.engine.serving.algorithms import DecodeAlgorithm, StepInputs, StepOutput
    from relayc.engine.serving.engine import Engine
    from relayc.engine.serving.request import FinishReason, Output, StreamDelta
    from relayc.engine.text.bytes import ByteTokenizer

_EXPORTS: dict[str, str] = {
    "DecodeAlgorithm": "relayc.engine.serving.algorithms",
    "StepInputs": "relayc.engine.serving.algorithms",
    "StepOutput": "relayc.engine.serving.algorithms",
    "TINY_CONFIG": "relayc.engine.core.config",
    "ModelConfig": "relayc.engine.core.config",
    "Engine": "relayc.engine.serving.engine",
    "ForwardBatch": "relayc.engine.core.forward_batch",
    "ForwardMode": "relayc.engine.core.forward_batch",
    "KVCache": "relayc.engine.core.kv_cache",
    "ReqToTokenPool": "relayc.engine.core.kv_cache",
    "TokenToKVPool": "relayc.engine.core.kv_cache",
    "ForwardOutput": "relayc.engine.model.llama",
    "LlamaForCausalLM": "relayc.engine.model.llama",
    "greedy_generate_naive": "relayc.engine.model.naive",
    "FinishReason": "relayc.engine.serving.request",
    "Output": "relayc.engine.serving.request",
    "StreamDelta": "relayc.engine.serving.request",
    "SamplingBatch": "relayc.engine.core.sampling",
    "SamplingParams": "relayc.engine.core.sampling",
    "sample": "relayc.engine.core.sampling",
    "ByteTokenizer": "relayc.engine.text.bytes",
    "CheckpointError": "relayc.engine.errors",
    "init_random": "relayc.engine.model.weights",
    "load_checkpoint": "relayc.engine.model.weights",
    "random_model": "relayc.engine.model.weights",
    "save_checkpoint": "relayc.engine.model.weights",
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
