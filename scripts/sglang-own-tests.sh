#!/usr/bin/env bash
# SGLang's own unit tests of its relay, against SGLang 0.5.23's overlap_utils and then with
# relayc's drop-in installed as docs/sglang.md says (a sitecustomize calling install()),
# with a per-test table of both runs. DIR: a folder of test files taken from SGLang's
# repository (test/registered/...; keep them outside this repository). Runs in the SGLang
# venv that scripts/test-sglang.sh builds; extra arguments go to pytest. Exit 1 if a test
# that passes on SGLang's module fails with the drop-in.
#   bash scripts/sglang-own-tests.sh /work/data/sglang-tests [-k PATTERN]
set -euo pipefail
cd "$(dirname "$0")/.."

if [ $# -lt 1 ]; then
  echo "usage: $0 DIR [pytest args...]" >&2
  exit 2
fi
VENV=${SGLANG_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/relayc/venv-sglang}
if [ ! -x "$VENV/bin/python" ]; then
  echo "no SGLang venv at $VENV: run bash scripts/test-sglang.sh first" >&2
  exit 2
fi
exec "$VENV/bin/python" scripts/sglang_own_tests.py "$@"
