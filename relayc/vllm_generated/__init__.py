"""The vLLM relay for the bundled specs: the generated vllm_relay.py and the hand-written runtime it imports, relayc_vllm_runtime.py. Do not edit them: run `relayc compile --bundled`."""
