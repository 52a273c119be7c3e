"""Shared fixtures: one real ZooKeeper per test session, a fresh cluster root per test.

ZooKeeper is Debian's real server started by :mod:`ops.zookeeper`; it is stopped by pid
at the end of the session, also when tests fail (the fixture's finalizer and
``ops.procs``' atexit hook both do it).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from ops import procs
from ops.zookeeper import ZooKeeperServer

_roots = itertools.count()


@pytest.fixture(scope="session")
def zk_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServer]:
    server = ZooKeeperServer(tmp_path_factory.mktemp("zookeeper"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def zk_connect(zk_server: ZooKeeperServer) -> str:
    return zk_server.connect_string


@pytest.fixture
def cluster_root() -> str:
    """A cluster root no other test uses, so tests share one ZooKeeper safely."""
    return f"/bookline-test-{os.getpid()}-{next(_roots)}"


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # Whatever a test left behind is stopped by pid here, never leaked; and a leak
    # fails the run, because the test that leaked would leak in production code too.
    leaked = procs.live_pids()
    procs.stop_all()
    if leaked and session.exitstatus == 0:
        print(f"\nERROR: processes still running after the test session: {leaked}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return tmp_path
