"""Text in and out of a real model: its tokenizer, its chat template, streamed detokenization.

``tokenizer``: ``Tokenizer``, a model's own BPE tokenizer built by the ``tokenizers``
library from a GGUF file's metadata or a checkpoint folder's ``tokenizer.json``
(the byte-level demo model keeps ``relayc.engine.text.bytes.ByteTokenizer``);
``chat``: chat messages rendered by the model's own Jinja template in a sandbox;
``detok``: incremental detokenization that never splits a character or a merge.
"""
