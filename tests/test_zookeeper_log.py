"""ZooKeeper's own log is written to its directory (before: SLF4J's no-op logger, so
zookeeper.log held three SLF4J warnings and nothing else)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ops.cluster.zookeeper import ZooKeeperServer


@pytest.mark.integration
def test_zookeeper_writes_its_log(tmp_path: Path) -> None:
    server = ZooKeeperServer(tmp_path / "zk")
    server.start()
    try:
        text = server.log_path.read_text(errors="replace")
    finally:
        server.stop()
    assert "NOP" not in text, text[:2000]
    assert "INFO" in text and "binding to port" in text, text[:2000]
