#!/usr/bin/env bash
# Idempotent set-up shared by ./run.sh and ./test.sh:
#   1. a JRE, Debian's ZooKeeper, redis-server, chromium, prometheus and stress-ng
#      (apt-get, only when missing; Redis is a peer of `bookline bench compare`, never
#      started as a service here; chromium is the headless browser of the dashboard
#      test, driven by Playwright; prometheus only for its promtool, which tests the
#      alert rules; stress-ng is the CPU hog the tests are run beside, README);
#   2. a venv in .venv with the project (editable) and its dependencies,
#      reinstalled only when pyproject.toml changed (stamp file).
# Source it; it leaves VENV_PY pointing at the venv's python.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${BOOKLINE_VENV:-$ROOT/.venv}"
PYTHON_BIN="${BOOKLINE_PYTHON:-$(command -v python3.11 || command -v python3)}"

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

need_apt=()
command -v java >/dev/null 2>&1 || need_apt+=(default-jre-headless)
[ -f /usr/share/java/zookeeper.jar ] || need_apt+=(zookeeper)
command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)
# nft: the chaos nemesis's partitions (nftables rules inside the hosts' namespaces).
command -v nft >/dev/null 2>&1 || need_apt+=(nftables)
[ -x /usr/bin/chromium ] || need_apt+=(chromium)
# promtool (in Debian's prometheus package): the alert rules' tests; the prometheus
# service itself is never started.
command -v promtool >/dev/null 2>&1 || need_apt+=(prometheus)
# stress-ng: the CPU hog the test suite is run beside (README, "Commands").
command -v stress-ng >/dev/null 2>&1 || need_apt+=(stress-ng)
# kcat: a Kafka client of its own (librdkafka) in the Kafka listener's tests.
command -v kcat >/dev/null 2>&1 || need_apt+=(kcat)
if [ ${#need_apt[@]} -gt 0 ]; then
    echo "setup: installing ${need_apt[*]} with apt-get" >&2
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

stamp="$VENV/.bookline-stamp"
want="$(cat "$ROOT/pyproject.toml" | sha256sum | cut -c1-16)-$("$PYTHON_BIN" -c 'import sys;print(sys.version_info[:2])' | tr -d ' ()')"
if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "setup: creating/updating venv at $VENV" >&2
    [ -x "$VENV/bin/python" ] || "$PYTHON_BIN" -m venv "$VENV"
    # pip's own output goes to a log, shown only when the install fails.
    if ! "$VENV/bin/python" -m pip install -e "$ROOT[dev,spark,bench]" > "$VENV/pip.log" 2>&1; then
        cat "$VENV/pip.log" >&2
        echo "setup: pip install failed (log above, also in $VENV/pip.log)" >&2
        exit 1
    fi
    echo "$want" > "$stamp"
fi
VENV_PY="$VENV/bin/python"
export VENV_PY
export PATH="$VENV/bin:$PATH"
