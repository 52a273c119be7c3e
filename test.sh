#!/usr/bin/env bash
# Set everything up, then run linters, the type checker and the default test suite.
#   ./test.sh                (extra arguments go to pytest, e.g. -k fencing or -m slow)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")" && pwd)"
source "$ROOT/ops/setup.sh"
cd "$ROOT"
echo "== ruff" && "$VENV_PY" -m ruff check . && "$VENV_PY" -m ruff format --check .
echo "== mypy --strict" && "$VENV_PY" -m mypy
echo "== import contract (layers, no cycles)" && "$VENV/bin/lint-imports" --no-cache
echo "== pytest"
if [ $# -eq 0 ]; then set -- -m "not slow"; fi
exec "$VENV_PY" -m pytest "$@"
