"""The SGLang drop-in for the bundled specs: the generated overlap_utils.py and the hand-written runtime it imports, relayc_relay_runtime.py. Do not edit them: run `relayc compile --bundled`."""
