"""``bookline`` run as its own process, as a user runs it: this interpreter's
``-m ops.cli``, text in and out captured, the exit code left to the test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from ops.cli.common import EXIT_FOUND
from tests.waiting import scaled

# A command against a local cluster answers within seconds; the deadline only bounds how
# long a hung one takes to fail (scaled with the machine's load).
CLI_TIMEOUT_S = 120.0


def run_cli(
    *args: str,
    cluster: Path | None = None,
    stdin: str | None = None,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    timeout_s: float = CLI_TIMEOUT_S,
) -> subprocess.CompletedProcess[str]:
    """``bookline ARGS [--cluster CLUSTER]``. Its environment is this process's with
    ``env`` over it, less a ``BOOKLINE_CLUSTER`` of the shell that runs the tests (a
    test names its cluster itself, in ``env`` or ``cluster``)."""
    inherited = {k: v for k, v in os.environ.items() if k != "BOOKLINE_CLUSTER"}
    argv = [sys.executable, "-m", "ops.cli", *args]
    if cluster is not None:
        argv += ["--cluster", str(cluster)]
    return subprocess.run(
        argv,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=scaled(timeout_s),
        env={**inherited, **(env or {})},
        cwd=cwd,
        check=False,
    )


def cli_json(
    *args: str,
    cluster: Path | None = None,
    codes: Collection[int] = (0, EXIT_FOUND),
    timeout_s: float = CLI_TIMEOUT_S,
) -> Any:
    """The document ``bookline ARGS --json`` prints; its exit code one of ``codes`` (by
    default success or "found problems", which still prints the document)."""
    out = run_cli(*args, "--json", cluster=cluster, timeout_s=timeout_s)
    assert out.returncode in codes, (out.returncode, out.stderr)
    return json.loads(out.stdout)
