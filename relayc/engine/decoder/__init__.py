"""The native CPU decoder: packed weights, the decoder layers and LM head as native calls.

cpu_decoder.py    ScriptedLayers: a layer stack as one native (or TorchScript) call
packed.py         NativeWeights, NativeHead, NativeLinear: the weights packed for decoder.c
draft_layer.py    NativeDraftLayer: a draft head's layer as native calls
fused_forward.py  FusedForward: a whole decode or verify forward in one native call
"""
