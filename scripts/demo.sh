#!/usr/bin/env bash
# The main job: set up .venv, then `relayc demo`: compile the bundled specs, run every
# algorithm on a fixed prompt set, print the comparison table and write relayc-demo.png.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
VENV=${VENV:-.venv}
"$VENV/bin/relayc" demo "$@"
