"""Issue 22 (12): a server started while ZooKeeper is down says so in one clear line.

kazoo logs a warning per connection retry; before the fix a bookie printed 18 of them
before its one-line error. Until the session first opens they are DEBUG; the error names
the connect string and the deadline."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from ops.cli.exit import EXIT_CODES
from ops.cluster import procs
from tests.waiting import wait_until


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


def test_every_server_stops_on_sigterm_while_zookeeper_is_down(tmp_path: Path) -> None:
    """SIGTERM during a ZooKeeper outage: bookies, proxies and autorecovery stop cleanly
    (exit 0), none waiting forever on a clean-up in ZooKeeper (kazoo holds a request
    until it reconnects): a bookie's registration and the auditor's election node go
    with their sessions. Before the fix the bookies and autorecovery never exited."""
    from ops.cluster.local import LocalCluster

    cluster = LocalCluster(
        tmp_path / "cluster", bookies=3, write_proxies=1, read_proxies=1,
        autorecovery=True, service_session_timeout_ms=4000,
    )  # fmt: skip
    cluster.start()
    try:
        servers = cluster.children()
        assert cluster.zk is not None
        cluster.zk.stop()
        for info in servers:
            if info.proc.poll() is None:
                info.proc.send_signal(signal.SIGTERM)
        # Their own bound is the 4 s session timeout.
        wait_until(
            lambda: all(info.proc.poll() is not None for info in servers),
            "every server to exit",
            timeout_s=60.0,
        )
        statuses = {info.name: info.proc.returncode for info in servers}
        assert all(code == 0 for name, code in statuses.items() if name != "zookeeper"), statuses
        for name in ("bookie-1", "autorecovery-1"):
            assert "ZooKeeper did not answer within" in _log_of(cluster, name), name
    finally:
        cluster.stop()


def _log_of(cluster: Any, name: str) -> str:
    return "".join(p.read_text() for p in (cluster.dir / name).glob("*.log"))
