#!/usr/bin/env bash
# Set everything up, then run linters, the type checker, the import contract and the
# default test suite (BOOKLINE_COVERAGE=1: with branch coverage, its total printed at
# the end).
#   ./test.sh                (extra arguments go to pytest, e.g. -k fencing or -m slow)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")" && pwd)"
source "$ROOT/ops/setup.sh"
cd "$ROOT"
echo "== ruff" && "$VENV_PY" -m ruff check . && "$VENV_PY" -m ruff format --check .
echo "== mypy --strict" && "$VENV_PY" -m mypy
echo "== import contract (layers, no cycles)" && "$VENV/bin/lint-imports" --no-cache | tail -n +12
echo "== pytest"
# The default suite runs in BOOKLINE_TEST_WORKERS processes (pytest-xdist), each taking
# whole files. Most of a test waits on servers, so three share two idle cores well; on a
# machine that is already busy (one-minute load average at or above its core count) more
# processes only slow each other, so by default the suite then runs in one.
if [ $# -eq 0 ]; then
    workers="${BOOKLINE_TEST_WORKERS:-}"
    if [ -z "$workers" ]; then
        read -r load _ < /proc/loadavg
        if awk -v l="$load" -v c="$(nproc)" 'BEGIN { exit !(l < c) }'; then workers=3; else workers=1; fi
        echo "== load average $load on $(nproc) cores: $workers test worker(s)"
    fi
    set -- -m "not slow"
    if [ "$workers" -gt 1 ]; then set -- "$@" -n "$workers" --dist loadgroup --no-loadscope-reorder; fi
fi
# Coverage (BOOKLINE_COVERAGE=1) follows the processes the tests start (bookies,
# proxies: coverage's subprocess patch); their data files are combined when pytest
# ends. It is off by default: tracing every line of every bookie and proxy more than
# doubles the suite's CPU on two cores (docs/architecture.md, "The test command").
status=0
if [ "${BOOKLINE_COVERAGE:-0}" = 1 ]; then
    rm -f .coverage .coverage.*
    "$VENV_PY" -m pytest --cov --cov-report= "$@" || status=$?
    if [ -f .coverage ]; then
        echo "== branch coverage: $("$VENV_PY" -m coverage report --format=total)% of lines and branches"
    fi
else
    "$VENV_PY" -m pytest "$@" || status=$?
fi
exit $status
