#!/usr/bin/env bash
# The main job: set up .venv (the real model, SmolLM2-135M-Instruct, included), then
# `relayc demo`: compile the bundled specs, print the model's answers to a few held-out chat
# prompts, run every algorithm with a drafter for it on the same prompts, print the
# comparison table (transformers' rows too) and write relayc-demo.png. `--toy`: the
# byte-level demo models and all their drafters.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
VENV=${VENV:-.venv}
"$VENV/bin/relayc" demo "$@"
