"""The native CPU decoder: packed weights, the decoder layers and LM head as native calls.

cpu_decoder.py    ScriptedLayers: a layer stack as one native (or TorchScript) call; which
                  path runs where
packing.py        NativeWeights: a stack's weights packed for the native decoder; row limits
head.py           NativeHead, NativeLinear: the final norm + LM head, a draft head's linears
draft_layer.py    NativeDraftLayer: an EAGLE-3 head's layer as native calls
fused_forward.py  FusedForward: a whole decode or verify forward in one native call
"""
