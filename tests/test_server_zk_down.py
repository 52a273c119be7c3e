"""Issue 22 (12): a server started while ZooKeeper is down says so in one clear line.

kazoo logs a warning per connection retry; before the fix a bookie printed 18 of them
before its one-line error. Until the session first opens they are DEBUG; the error names
the connect string and the deadline."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from ops.cli.exit import EXIT_CODES
from ops.cluster import procs
from tests.waiting import wait_for


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


async def test_a_bookie_stops_on_sigterm_while_zookeeper_is_down(tmp_path: Path) -> None:
    """SIGTERM during a ZooKeeper outage: the bookie stops cleanly (exit 0, storage
    closed), not waiting forever to remove its registration (kazoo holds a request
    until it reconnects); the registration goes with the session."""
    from foundation.config import MetadataConfig
    from metadata.client import MetadataClient
    from ops.cluster.zookeeper import ZooKeeperServer
    from tests.test_bookie_integration import BookieProcess

    zk = ZooKeeperServer(tmp_path / "zk")
    zk.start()
    bookie = BookieProcess(tmp_path, zk.connect_string, "/zk-outage")
    try:
        md = MetadataClient(MetadataConfig(zk=zk.connect_string, root="/zk-outage"))
        await md.connect()
        try:
            await md.init_cluster()
        finally:
            await md.close()
        proc = bookie.start()
        zk.stop()
        await wait_for(
            lambda: "CONNECTED -> SUSPENDED" in bookie.log_path.read_text(),
            "the bookie to see ZooKeeper gone",
        )
        proc.send_signal(signal.SIGTERM)
        # Its own bound is the 2 s session timeout; before the fix it never exited.
        await wait_for(lambda: proc.poll() is not None, "the bookie to exit", timeout_s=30.0)
        log = bookie.log_path.read_text()
        assert proc.returncode == 0, log[-3000:]
        assert "ZooKeeper did not answer within" in log, log[-3000:]
    finally:
        bookie.stop()
        zk.stop()
