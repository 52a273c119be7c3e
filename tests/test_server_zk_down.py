"""Issue 22 (12): a server started while ZooKeeper is down says so in one clear line.

kazoo logs a warning per connection retry; before the fix a bookie printed 18 of them
before its one-line error. Until the session first opens they are DEBUG; the error names
the connect string and the deadline."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ops.cli.exit import EXIT_CODES
from ops.cluster import procs


def test_a_bookie_with_zookeeper_down_prints_one_error_not_the_retries(tmp_path: Path) -> None:
    zk = f"127.0.0.1:{procs.free_port()}"  # nobody listens there
    argv = [
        sys.executable, "-m", "ops.cli", "bookie", "--bookie-id", "b-zk-down",
        "--port", "0", "--zk", zk, "--root", "/zk-down",
        "--journal-dir", str(tmp_path / "j"), "--ledgers-dir", str(tmp_path / "l"),
        "--index-dir", str(tmp_path / "i"),
    ]  # fmt: skip
    out = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=180,  # the bookie's own deadline is 15 s
        check=False,
    )
    assert out.returncode != 0 and out.returncode in EXIT_CODES, (out.returncode, out.stderr)
    assert f"could not connect to ZooKeeper at {zk} within" in out.stderr, out.stderr
    warnings = [line for line in out.stderr.splitlines() if "WARNING" in line]
    assert len(warnings) <= 2, out.stderr
    assert "Traceback" not in out.stderr, out.stderr
