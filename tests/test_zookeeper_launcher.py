"""The ZooKeeper launcher starts a real server, answers ruok, and stops it by pid."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
from kazoo.client import KazooClient

import ops.cluster.zookeeper as zkmod
from ops.cluster import procs
from ops.cluster.zookeeper import ZooKeeperError, ZooKeeperServer, four_letter_word

pytestmark = pytest.mark.integration


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); look at its state.
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except OSError:
        return False
    return state != "Z"


def test_start_answer_and_stop(tmp_path: Path) -> None:
    with ZooKeeperServer(tmp_path / "zk") as server:
        pid = server.pid
        assert pid is not None
        assert _alive(pid)
        assert server.port is not None
        assert four_letter_word("127.0.0.1", server.port, "ruok") == "imok"
        client = KazooClient(hosts=server.connect_string, timeout=10)
        client.start(timeout=10)
        try:
            client.create("/probe", b"x")
            assert client.get("/probe")[0] == b"x"
        finally:
            client.stop()
            client.close()
        assert pid in procs.live_pids()
    assert not _alive(pid)
    assert pid not in procs.live_pids()


def test_data_survives_restart(tmp_path: Path) -> None:
    for attempt in range(2):
        with ZooKeeperServer(tmp_path / "zk") as server:
            client = KazooClient(hosts=server.connect_string, timeout=10)
            client.start(timeout=10)
            try:
                if attempt == 0:
                    client.create("/kept", b"v1")
                else:
                    assert client.get("/kept")[0] == b"v1"
            finally:
                client.stop()
                client.close()


def test_failed_start_kills_process(tmp_path: Path) -> None:
    # Occupy the port so the server cannot bind: start must fail and leave nothing behind.
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        port = blocker.getsockname()[1]
        server = ZooKeeperServer(tmp_path / "zk", port=port)
        old = zkmod.START_TIMEOUT_S
        zkmod.START_TIMEOUT_S = 15.0
        try:
            with pytest.raises(ZooKeeperError, match="ZooKeeper"):
                server.start()
        finally:
            zkmod.START_TIMEOUT_S = old
        assert server.pid is not None
        assert not _alive(server.pid)
