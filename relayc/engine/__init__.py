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
algorithms.py     the per-algorithm decode step (prefill / decode hooks) on the relay
step_batch.py     one forward as prepared on the host, and its move to the device
overlap.py        forward runners: inline, worker thread (CPU), forward stream (CUDA)
scheduler.py      admission, batching and the overlap contract
engine.py         Engine: generate / stream, bad-input handling
cli.py            `relayc generate`
"""

from __future__ import annotations

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

__all__ = [
    "TINY_CONFIG",
    "ByteTokenizer",
    "CheckpointError",
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
    "StreamDelta",
    "TokenToKVPool",
    "greedy_generate_naive",
    "init_random",
    "load_checkpoint",
    "random_model",
    "sample",
    "save_checkpoint",
]
