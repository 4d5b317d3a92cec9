"""The SGLang relay module generated from the bundled specs. Do not edit: run `relayc compile --target sglang`."""
