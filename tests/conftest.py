"""Shared fixtures: one real ZooKeeper per test session, a fresh cluster root per test.

ZooKeeper is Debian's real server started by :mod:`ops.cluster.zookeeper`; it is stopped by pid
at the end of the session, also when tests fail (the fixture's finalizer and
``ops.cluster.procs``' atexit hook both do it).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest
from hypothesis import HealthCheck, settings

from ops.cluster import procs
from ops.cluster.zookeeper import ZooKeeperServer
from tests.waiting import SCALE_ENV, TIME_SCALE, scaled, time_scale, wait_until

_roots = itertools.count()

# Hypothesis's per-example deadline and its "input generation is slow" check measure the
# machine's speed, not the property: on a loaded machine they fail a correct build.
settings.register_profile("bookline", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("bookline")


def pytest_report_header(config: pytest.Config) -> str:
    return f"test time scale: {TIME_SCALE:g} (deadlines and timeouts; {SCALE_ENV})"


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _group_for_workers(items)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)  # before pytest-timeout reads the mark
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    # pytest-timeout's limit is a deadline like any other: on a loaded machine a test
    # gets the time scale's multiple of it (tests/waiting.py), whether the limit comes
    # from the test's own mark, --timeout or pyproject.toml. The scale is taken as the
    # test starts (a CPU hog started with the run shows in the load average only later).
    base = _base_timeout(item)
    if base > 0 and time_scale() > 1.0:
        mark = item.get_closest_marker("timeout")
        rest = {k: v for k, v in (mark.kwargs if mark else {}).items() if k != "timeout"}
        item.add_marker(pytest.mark.timeout(scaled(base), **rest), append=False)
    yield


_BASE_TIMEOUT = pytest.StashKey[float]()


def _base_timeout(item: pytest.Item) -> float:
    """The test's limit before scaling: its own timeout mark, --timeout or the ini's."""
    if _BASE_TIMEOUT not in item.stash:
        option = item.config.getoption("timeout", None)
        default = float(option if option is not None else item.config.getini("timeout") or 0)
        mark = item.get_closest_marker("timeout")
        base = default
        if mark is not None:
            base = float(mark.kwargs.get("timeout", mark.args[0] if mark.args else default))
        item.stash[_BASE_TIMEOUT] = base
    return item.stash[_BASE_TIMEOUT]


def _group_for_workers(items: list[pytest.Item]) -> None:
    """Under ``pytest -n N --dist loadgroup`` (./test.sh's default), a worker runs a
    whole test file, so a file's module-scoped cluster starts once; and every file with a
    test on the shared ``spark`` session runs on one worker, so one JVM serves them all (a
    local[2] session per worker would take both cores each). Files whose Spark tests start
    their own JVMs (spark-submit, killed drivers) are groups of their own.

    The Spark groups are the longest (minutes each), so they go first: ./test.sh turns
    off xdist's reordering by test count, and the workers start on the long groups while
    the short ones fill in behind them (longest first keeps the run's tail short)."""
    session_files = {item.path for item in items if "spark" in getattr(item, "fixturenames", ())}
    spark_files = {item.path for item in items if item.get_closest_marker("spark")}
    for item in items:
        group = "spark" if item.path in session_files else item.path.stem
        item.add_marker(pytest.mark.xdist_group(group))
    # A stable sort by file: each file's tests stay together and in their order.
    items.sort(key=lambda item: (item.path not in session_files, item.path not in spark_files))


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


# -- ZooKeeper + 3 real bookies, shared by the core-library tests ------------------------

BOOKIE_READY_TIMEOUT_S = 60.0
# Bookie GC of deleted ledgers runs this often in test bookies (retention tests wait on it).
TEST_BOOKIE_GC_INTERVAL_MS = 500


@dataclasses.dataclass
class BookieCluster:
    """ZooKeeper (the session one) + N bookie processes under one cluster root."""

    zk: str
    root: str
    workdir: Path
    bookies: list[tuple[subprocess.Popen[bytes], int, Path]] = dataclasses.field(
        default_factory=list
    )

    def start_bookie(self) -> None:
        port = procs.free_port()
        d = self.workdir / f"bookie-{port}"
        log = d / "bookie.log"
        argv = [
            str(Path(sys.executable).with_name("bookline")), "bookie",
            "--zk", self.zk, "--root", self.root, "--port", str(port),
            "--journal-dir", str(d / "journal"), "--ledgers-dir", str(d / "ledgers"),
            "--index-dir", str(d / "index"), "--session-timeout-ms", "4000",
        ]  # fmt: skip
        # Frequent GC, small entry logs and frequent checkpoints: deleted ledgers' space
        # becomes reclaimable (rolled logs only) within a test's patience.
        env = dict(
            os.environ,
            BOOKLINE_BOOKIE_GC_INTERVAL_MS=str(TEST_BOOKIE_GC_INTERVAL_MS),
            BOOKLINE_BOOKIE_ENTRY_LOG_BYTES_MAX=str(1 << 20),
            BOOKLINE_BOOKIE_CHECKPOINT_INTERVAL_MS="1000",
        )
        proc = procs.spawn(argv, log_path=log, env=env)
        self.bookies.append((proc, port, d))

        def ready() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"bookie exited {proc.returncode}: {log.read_text()[-2000:]}")
            return b"bookie ready" in (log.read_bytes() if log.exists() else b"")

        wait_until(ready, f"bookie on {port} to be ready", timeout_s=BOOKIE_READY_TIMEOUT_S)

    def cluster_file(self) -> Path:
        """A cluster.json other processes (subprocess writers, Spark) can open."""
        path = self.workdir / "cluster.json"
        path.write_text(json.dumps({"zk": self.zk, "root": self.root, "bookies": [
            {"address": f"127.0.0.1:{port}", "pid": proc.pid} for proc, port, _d in self.bookies
        ]}))  # fmt: skip
        return path

    def stop(self) -> None:
        for proc, _port, _d in self.bookies:
            procs.stop(proc, grace_s=5.0)
        self.bookies.clear()


@pytest.fixture(scope="session")
def bookie_cluster(
    zk_server: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BookieCluster]:
    """ZooKeeper + 3 bookies for the whole session (bookies stopped by pid at the end).
    Tests share it: give each its own namespace or stream names."""
    cluster = BookieCluster(
        zk_server.connect_string,
        f"/bookline-core-{os.getpid()}",
        tmp_path_factory.mktemp("bookies"),
    )
    try:
        for _ in range(3):
            cluster.start_bookie()
        yield cluster
    finally:
        cluster.stop()


# -- Spark: one local[2] session for every pipeline test -----------------------------------


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    """A local[2] SparkSession with ``bookline`` registered; its JVM stops at session end.
    Executors run this interpreter (PYSPARK_PYTHON), so they import the installed
    ``pipeline``/``bookline`` whatever the working directory."""
    pytest.importorskip("pyspark")
    from pipeline.session import local_session, stop_session

    session = local_session("bookline-tests", cores=2, shuffle_partitions=2)
    try:
        yield session
    finally:
        stop_session(session)


# -- proxies (issue 6): one cluster with two write proxies and a read proxy -------------


@pytest.fixture(scope="session")
def proxy_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """ZooKeeper + 3 bookies + 2 write proxies + 1 read proxy, each its own process,
    shared by the proxy tests (each test uses its own stream names). Write proxies run
    with small limits (so overload is cheap to provoke) and the test-only fault hook
    that stalls the answer of durable writes to streams named ``fault-*``."""
    from tests.cluster_support import started_cluster

    with started_cluster(
        tmp_path_factory.mktemp("proxy-cluster"),
        bookies=3,
        write_proxies=2,
        read_proxies=1,
        proxy_args={
            "writeproxy": [
                "--request-bytes-max",
                str(2 << 20),
                "--stream-inflight-bytes-max",
                str(4 << 20),
                "--proxy-inflight-bytes-max",
                str(8 << 20),
                "--fault-stall-writes",
                "1000",
                "--fault-stall-ms",
                "1500",
            ]
        },
    ) as cluster:
        yield cluster


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    """An HTTP client session for one test, closed after it."""
    async with aiohttp.ClientSession() as session:
        yield session
