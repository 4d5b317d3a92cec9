"""The serving loop: requests, step batches, the overlap scheduler and the Engine on top.

request.py      Request (the scheduler's record), Output, StreamDelta, FinishReason
algorithms.py   DecodeAlgorithm, and GeneratedAlgorithm: any spec's generated prefill /
                decode steps on the op implementations (one or several tokens per step)
graphs.py       CUDA graphs and native tapes of a decode step, by batch bucket
step_batch.py   one forward as prepared on the host, and its move to the device
overlap.py      the overlap contract; forward runners: inline, thread (CPU), stream (CUDA)
scheduler.py    admission and batching
undrafted.py    the one-token step of a batch its host drafter proposed nothing for
engine.py       Engine: generate / stream, bad-input handling
engine_args.py  the Engine's arguments, checked
"""
