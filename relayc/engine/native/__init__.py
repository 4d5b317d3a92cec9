"""The native C library (its C units in csrc/): its build and loader, call tapes, quantized weight blocks.

library.py      compile csrc/ once per machine, load it, the ctypes signatures
tape_ops.py     ops recorded as native calls in a tape instead of torch calls
scripted.py     the eager decoder layers as one TorchScript function (same ops, same bits)
head_argmax.py  the argmax the native LM head computed beside its logits
blocks.py       a GGUF file's quantized matrices, kept beside the float32 weights
"""
