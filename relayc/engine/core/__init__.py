"""The types every forward shares: config, KV pools, forward batch, attention, the Llama layers.

config.py         ModelConfig and the tiny byte-level default
kv_cache.py       ReqToTokenPool, TokenToKVPool (KV-slot allocator), KVCache
forward_batch.py  ForwardBatch: one forward's tokens, slots and attention mode
attention.py      batched attention over the paged cache, and the dense path
layers.py         Linear, RMSNorm, rotary tables, attention, MLP, the decoder layer
sampling.py       SamplingParams and the counter-keyed batched sampler
walk.py           module walks and parameter stamps without recursion
"""
