"""The vLLM differential test (its own venv: scripts/test-vllm.sh)."""
