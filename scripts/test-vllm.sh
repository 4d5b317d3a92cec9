#!/usr/bin/env bash
# The vLLM differential test (CI): relayc's generated vLLM relay against vLLM 0.33.0's own
# Model Runner V2 kernels. Its own venv, so the default test run stays light: torch, numpy,
# triton, packaging, regex and pytest (tests/vllm/requirements.txt), then vLLM with
# --no-deps (its full requirement set pulls CUDA builds). relayc is not installed there: the
# test imports the checked-in generated module from the source tree. The venv lives outside
# the clone and is reused; vLLM's Triton kernels run on the CPU under TRITON_INTERPRET=1,
# with CUDA_VISIBLE_DEVICES="" so that vLLM keeps the real triton.jit (docs/vllm.md).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${VLLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/relayc/venv-vllm}
VLLM_VERSION=0.33.0

if [ ! -x "$VENV/bin/python" ]; then
  echo "== creating $VENV"
  mkdir -p "$(dirname "$VENV")"
  "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
echo "== installing tests/vllm/requirements.txt and vllm==$VLLM_VERSION (--no-deps)"
"${PIP[@]}" install -r tests/vllm/requirements.txt
"${PIP[@]}" install --no-deps "vllm==$VLLM_VERSION"
echo "== pytest (vLLM differential test)"
CUDA_VISIBLE_DEVICES="" TRITON_INTERPRET=1 RELAYC_REQUIRE_VLLM=1 \
  "$VENV/bin/python" -m pytest -q -p no:cacheprovider tests/vllm "$@"
