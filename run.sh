#!/usr/bin/env bash
# Main job: set everything up, start a local Bookline cluster and run a visible demo.
#   ./run.sh                 (extra arguments go to `bookline local`)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")" && pwd)"
source "$ROOT/ops/setup.sh"
exec "$VENV_PY" -m ops.cli demo --dir "${BOOKLINE_DIR:-$ROOT/.cluster}" "$@"
