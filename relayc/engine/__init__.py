"""The reference engine: a Llama-architecture model, paged KV cache and an overlap scheduler."""
