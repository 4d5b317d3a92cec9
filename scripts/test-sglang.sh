#!/usr/bin/env bash
# The SGLang differential test (CI): relayc's generated SGLang relay against sglang 0.5.23's
# own FutureMap. Its own venv, so the default test run stays light: relayc[sglang-test]
# (sglang's import-time deps, pinned), then sglang itself with --no-deps (its full
# requirement set pulls CUDA builds). torch is installed first and held by a constraint,
# as in scripts/bootstrap.sh. The venv lives outside the clone and is reused: a fresh one
# takes 1.5-8.5 minutes (quiet vs loaded machine, 2.5 GB); a reused one, seconds of pip
# checking that everything is satisfied.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${SGLANG_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/relayc/venv-sglang}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
SGLANG_VERSION=0.5.23

if [ ! -x "$VENV/bin/python" ]; then
  echo "== creating $VENV"
  mkdir -p "$(dirname "$VENV")"
  "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  echo "== installing torch==$TORCH_VERSION"
  "${PIP[@]}" install "torch==$TORCH_VERSION"
fi
echo "torch==$TORCH_VERSION" > "$VENV/torch-constraint.txt"
echo "== installing relayc[sglang-test] and sglang==$SGLANG_VERSION (--no-deps)"
"${PIP[@]}" install -c "$VENV/torch-constraint.txt" -e ".[sglang-test]"
"${PIP[@]}" install --no-deps "sglang==$SGLANG_VERSION"
echo "== pytest (SGLang differential test)"
RELAYC_REQUIRE_SGLANG=1 "$VENV/bin/python" -m pytest -q -p no:cacheprovider tests/compiler/test_sglang_target.py "$@"
