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
