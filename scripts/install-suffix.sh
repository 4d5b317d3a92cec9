#!/usr/bin/env bash
# Installs the `suffix` extra (arctic-inference's suffix cache) into .venv, built against the
# venv's torch: its sdist's build imports torch, and pip's isolated build would fetch a
# multi-GB CUDA torch of its own (docs/suffix.md#install). CMAKE_ARGS points its CMake build
# at the venv's Python, whose packages hold nanobind; without it CMake finds the system's.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/python -m pip install -q setuptools wheel ninja cmake nanobind==2.9.2 grpcio-tools
CMAKE_ARGS="-DPython_EXECUTABLE=$PWD/.venv/bin/python" \
  .venv/bin/python -m pip install -q --no-build-isolation -e ".[suffix]"
