"""The SGLang drop-in generated from the bundled specs: overlap_utils.py and the relayc_relay_*.py modules it imports. Do not edit: run `relayc compile --target sglang`."""
