"""The target model: LlamaForCausalLM, its weights (seeded init, checkpoints), the reference.

llama.py    LlamaForCausalLM: which path (native, scripted, eager) a forward takes
weights.py  seeded init, Hugging Face checkpoint load / save
naive.py    greedy_generate_naive, the cache-free reference
scoring.py  teacher-forced log-probabilities through the paged forward
"""
