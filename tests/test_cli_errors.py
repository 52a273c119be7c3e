"""A newcomer's first mistakes get a message, a hint and a documented exit status --
never a traceback, never a 30 s hang."""

from __future__ import annotations

import json
import time
from pathlib import Path

from ops.cli.common import EXIT_CONFIG, EXIT_UNREACHABLE
from ops.cluster import procs
from tests.cli_support import run_cli
from tests.waiting import scaled


def test_a_missing_or_bad_cluster_file_is_a_message_with_a_hint(tmp_path: Path) -> None:
    """`BOOKLINE_CLUSTER=/tmp/nothere.json bookline stream list` printed a traceback
    (FileNotFoundError; a directory: IsADirectoryError; bad JSON: JSONDecodeError)."""
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    cases = {
        str(tmp_path / "nothere.json"): "does not exist",
        str(tmp_path): "is a directory",
        str(bad): "is not JSON",
    }
    for path, says in cases.items():
        out = run_cli("stream", "list", env={"BOOKLINE_CLUSTER": path})
        assert "Traceback" not in out.stderr, out.stderr
        assert f"bookline: error CONFIG (14): cluster file {path} {says}" in out.stderr
        assert "bookline local" in out.stderr, out.stderr  # the hint
        assert out.returncode == EXIT_CONFIG, out.stderr


def test_a_stale_cluster_file_fails_fast_with_a_hint(tmp_path: Path) -> None:
    """A cluster.json whose processes are gone: every command hung ~30 s, then
    `CONNECTION_LOST (11)` with no hint; there was no --timeout."""
    stale = tmp_path / "cluster.json"
    zk, wp, rp = procs.free_port(), procs.free_port(), procs.free_port()
    stale.write_text(
        json.dumps(
            {
                "zk": f"127.0.0.1:{zk}/local",
                "root": "/bookline",
                "write_proxies": [{"url": f"http://127.0.0.1:{wp}"}],
                "read_proxies": [{"url": f"http://127.0.0.1:{rp}"}],
            }
        )
    )
    for args in (("stream", "list"), ("stream", "list", "--timeout", "1")):
        start = time.monotonic()
        out = run_cli(*args, "--cluster", str(stale))
        took = time.monotonic() - start
        assert out.returncode == EXIT_UNREACHABLE, (out.returncode, out.stderr)
        assert "CONNECTION_LOST (11)" in out.stderr, out.stderr
        assert "is the cluster running?" in out.stderr, out.stderr
        assert took < scaled(15), f"took {took:.1f} s"
