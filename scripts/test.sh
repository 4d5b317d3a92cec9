#!/usr/bin/env bash
# The test command (README, CI): set up .venv, lint, check the generated modules, run the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
VENV=${VENV:-.venv}
echo "== ruff"
"$VENV/bin/ruff" check relayc tests bench
"$VENV/bin/ruff" format --check relayc tests bench
echo "== mypy (config: pyproject.toml [tool.mypy])"
"$VENV/bin/mypy"
echo "== relayc check (generated modules match their specs)"
"$VENV/bin/relayc" check
echo "== pytest"
"$VENV/bin/python" -m pytest -q "$@"
# The default run takes this CPU's best bfloat16 kernel (AMX where it has it); the model-level
# bfloat16 tests again on the portable one, which every CPU runs (the kernel-level tests in
# test_cpu_decoder_bf16_kernels.py already run each kernel this CPU has).
echo "== pytest, bfloat16 on the portable kernel (RELAYC_BF16_KERNEL=portable)"
RELAYC_BF16_KERNEL=portable "$VENV/bin/python" -m pytest -q tests/engine/test_cpu_decoder_bf16.py
