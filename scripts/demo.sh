#!/usr/bin/env bash
# The main job: set up .venv, validate the bundled specs and explain the EAGLE one.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
VENV=${VENV:-.venv}
"$VENV/bin/relayc" validate relayc/specs/*.yaml
echo
"$VENV/bin/relayc" explain relayc/specs/eagle.yaml
