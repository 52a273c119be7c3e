"""Real bookie processes (``bookline bookie``) with the session's real ZooKeeper.

Every process is started through :mod:`ops.cluster.procs` and stopped by pid in a ``finally``.
Read-only thresholds are moved at runtime by rewriting the config file and sending
SIGHUP (the bookie re-reads ``disk_usage_threshold`` / ``disk_usage_lwm``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from bookie.client import BookieConnection, ClientOptions
from foundation.config import MetadataConfig
from foundation.errors import NotFoundError, ReadOnlyError
from metadata.client import MetadataClient
from metadata.ledger_metadata import LedgerMetadata, Segment, master_key_check
from ops.cluster import procs
from tests.cluster_support import bytes_on_disk
from tests.ledger_support import register_ledgers
from tests.waiting import wait_for, wait_until

pytestmark = pytest.mark.integration

KEY = b"integration-key"
READY_TIMEOUT_S = 60.0


class BookieProcess:
    def __init__(
        self, workdir: Path, zk: str, root: str, *, name: str = "b1", extra_config: str = ""
    ) -> None:
        self.workdir = workdir
        self.extra_config = extra_config
        self.port = procs.free_port()
        self.config_path = workdir / f"{name}.toml"
        self.log_path = workdir / f"{name}.log"
        self.zk = zk
        self.root = root
        self.dirs = {d: workdir / name / d for d in ("journal", "ledgers", "index")}
        self.proc: subprocess.Popen[bytes] | None = None
        self.write_config()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def write_config(self, threshold: float = 0.999, lwm: float = 0.998) -> None:
        self.config_path.write_text(
            "[bookie]\n"
            f"port = {self.port}\n"
            f'zk = "{self.zk}"\n'
            f'root = "{self.root}"\n'
            "session_timeout_ms = 2000\n"
            "metrics_port = 0\n"
            "disk_check_interval_ms = 100\n"
            f"disk_usage_threshold = {threshold}\n"
            f"disk_usage_lwm = {lwm}\n"
            f'journal_dir = "{self.dirs["journal"]}"\n'
            f'ledgers_dir = "{self.dirs["ledgers"]}"\n'
            f'index_dir = "{self.dirs["index"]}"\n' + self.extra_config
        )

    def start(self, *extra: str) -> subprocess.Popen[bytes]:
        argv = [sys.executable, "-m", "ops.cli", "bookie", "--config", str(self.config_path)]
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        self.proc = procs.spawn([*argv, *extra], log_path=self.log_path, cwd=self.workdir)
        return self._wait_ready(offset)

    def _wait_ready(self, offset: int) -> subprocess.Popen[bytes]:
        proc = self.proc
        assert proc is not None

        def ready() -> bool:
            text = self.log_path.read_bytes()[offset:].decode(errors="replace")
            if proc.poll() is not None and "bookie ready id=" not in text:
                raise AssertionError(f"bookie exited {proc.returncode}:\n{text}")
            return "bookie ready id=" in text

        wait_until(ready, "the bookie to be ready", timeout_s=READY_TIMEOUT_S)
        return proc

    def metrics_url(self) -> str:
        ready = [ln for ln in self.log_path.read_text().splitlines() if "bookie ready" in ln]
        return ready[-1].rsplit("metrics=", 1)[1].strip()

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        proc, self.proc = self.proc, None
        return procs.stop(proc)

    def kill9(self) -> None:
        assert self.proc is not None
        procs.kill9(self.proc)
        self.proc = None


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return bytes(resp.read()).decode()


def entry(i: int) -> bytes:
    return (f"entry-{i:06d}-".encode() * 8)[:100]


async def test_acknowledged_adds_survive_kill9(
    workdir: Path, zk_connect: str, cluster_root: str
) -> None:
    bookie = BookieProcess(workdir, zk_connect, cluster_root)
    n = 10_000
    try:
        await register_ledgers(zk_connect, cluster_root, KEY, 9)
        bookie.start()
        conn = BookieConnection(bookie.address, ClientOptions(inflight_max=2_000))
        try:
            await asyncio.gather(*(conn.add(9, i, i - 1, KEY, entry(i)) for i in range(n)))
        finally:
            await conn.close()
        bookie.kill9()  # some of these are only in the journal now
        bookie.start()  # same dirs; waits out the old ZK session
        conn = BookieConnection(bookie.address)
        try:
            got = await asyncio.gather(*(conn.read(9, i, master_key=KEY) for i in range(n)))
            assert [r.payload for r in got] == [entry(i) for i in range(n)]
            assert await conn.list_entries(9, master_key=KEY) == tuple(range(n))
        finally:
            await conn.close()
        assert bookie.stop() == 0
    finally:
        bookie.stop()


async def test_cookie_mismatch_refuses_to_start(
    workdir: Path, zk_connect: str, cluster_root: str
) -> None:
    bookie = BookieProcess(workdir, zk_connect, cluster_root)
    try:
        bookie.start()
        assert bookie.stop() == 0
        argv = [sys.executable, "-m", "ops.cli", "bookie", "--config", str(bookie.config_path)]
        # Same disks, another cluster (a fresh root gets a new instance id): refused.
        out = subprocess.run(
            [*argv, "--root", cluster_root + "-other"],
            capture_output=True,
            timeout=60,
            cwd=workdir,
            check=False,
        )
        assert out.returncode == 1, out.stderr
        assert b"COOKIE_MISMATCH" in out.stderr and b"instance_id" in out.stderr, out.stderr
        # One disk wiped (its cookie gone, the others still carry theirs): refused.
        (bookie.dirs["index"] / "COOKIE").unlink()
        out = subprocess.run(argv, capture_output=True, timeout=60, cwd=workdir, check=False)
        assert out.returncode == 1, out.stderr
        assert b"COOKIE_MISMATCH" in out.stderr and b"wiped" in out.stderr, out.stderr
    finally:
        bookie.stop()


async def _registered_state(md: MetadataClient, bookie_id: str) -> str:
    return (await md.bookies.get(bookie_id)).state


async def _wait_state(md: MetadataClient, bookie_id: str, state: str) -> None:
    async def reached() -> bool:
        return await _registered_state(md, bookie_id) == state

    await wait_for(reached, f"bookie {bookie_id} {state}", interval_s=0.1)


async def test_read_only_transition_both_ways(
    workdir: Path, zk_connect: str, cluster_root: str
) -> None:
    bookie = BookieProcess(workdir, zk_connect, cluster_root)
    md = MetadataClient(MetadataConfig(zk=zk_connect, root=cluster_root))
    conn = BookieConnection(bookie.address)
    try:
        proc = bookie.start()
        await md.connect()
        assert await _registered_state(md, bookie.address) == "writable"
        await md.ledgers.create(_metadata(1, bookie.address))
        await conn.add(1, 0, -1, KEY, b"before")
        # Any disk is fuller than 0.01 %: read-only.
        bookie.write_config(threshold=0.0001, lwm=0.00005)
        os.kill(proc.pid, signal.SIGHUP)
        await _wait_state(md, bookie.address, "readonly")
        assert (await conn.info()).state == "read_only"
        with pytest.raises(ReadOnlyError):
            await conn.add(1, 1, 0, KEY, b"refused")
        assert (await conn.read(1, 0, master_key=KEY)).payload == b"before"  # reads still served
        # Thresholds back up: writable again.
        bookie.write_config(threshold=0.9999, lwm=0.9998)
        os.kill(proc.pid, signal.SIGHUP)
        await _wait_state(md, bookie.address, "writable")
        await conn.add(1, 1, 0, KEY, b"after")
        metrics = await asyncio.to_thread(_scrape, bookie.metrics_url())
        assert 'bookline_bookie_requests_total{op="ADD",status="READ_ONLY"} 1.0' in metrics
        assert "bookline_bookie_journal_fsync_seconds_count" in metrics
        assert bookie.stop() == 0
    finally:
        await conn.close()
        await md.close()
        bookie.stop()


def _entry_log_bytes(bookie: BookieProcess) -> int:
    return bytes_on_disk(bookie.dirs["ledgers"].glob("*.log"))


def _metadata(ledger_id: int, bookie_id: str) -> LedgerMetadata:
    return LedgerMetadata(
        ledger_id=ledger_id,
        ensemble_size=1,
        write_quorum=1,
        ack_quorum=1,
        segments=(Segment(0, (bookie_id,)),),
        key_check=master_key_check(KEY),
    )


async def test_gc_drops_ledgers_deleted_from_metadata(
    workdir: Path, zk_connect: str, cluster_root: str
) -> None:
    # Small entry logs so the data spans several (compaction never touches the active one),
    # frequent checkpoints and GC rounds.
    bookie = BookieProcess(
        workdir,
        zk_connect,
        cluster_root,
        extra_config=(
            "entry_log_bytes_max = 262144\n"
            "checkpoint_interval_ms = 100\n"
            "gc_interval_ms = 300\n"
            "compaction_threshold = 0.5\n"
        ),
    )
    md = MetadataClient(MetadataConfig(zk=zk_connect, root=cluster_root))
    conn = BookieConnection(bookie.address)
    ledgers = range(1, 11)
    survivors = {3, 8}
    body = 2000

    def data(ledger_id: int, entry_id: int) -> bytes:
        return (f"{ledger_id}/{entry_id}/".encode() * body)[:body]

    try:
        await md.connect()
        await md.init_cluster()
        for ledger_id in ledgers:
            await md.ledgers.create(_metadata(ledger_id, bookie.address))
        bookie.start()
        # Interleaved, as real traffic is: every entry log holds every ledger.
        for e in range(100):
            await asyncio.gather(*(conn.add(lid, e, e - 1, KEY, data(lid, e)) for lid in ledgers))
        # Every entry checkpointed before the size is taken: a size taken part-way
        # through makes the "reclaimed" bar below depend on the checkpoints' timing.
        written = len(ledgers) * 100 * body
        await _wait_until(lambda: _entry_log_bytes(bookie) >= written, "entries checkpointed")
        before = _entry_log_bytes(bookie)
        assert await conn.list_ledgers() == tuple(ledgers)
        for ledger_id in set(ledgers) - survivors:
            await md.ledgers.delete(ledger_id)

        async def only_survivors() -> bool:
            if await conn.list_ledgers() == tuple(sorted(survivors)):
                return True
            # Survivors read correctly all along, also while logs are being compacted.
            for lid in survivors:
                e = int(time.monotonic() * 1000) % 100
                assert (await conn.read(lid, e, master_key=KEY)).payload == data(lid, e)
            return False

        await wait_for(only_survivors, "only the surviving ledgers listed", timeout_s=30.0)
        # 80 % of the data is deleted; a log stays while at least half of it is live
        # (compaction_threshold) and the log being written is never compacted, so at
        # most 2 x 20 % plus one log remains: well under 60 % of the size before.
        await _wait_until(lambda: _entry_log_bytes(bookie) < before * 0.6, "space reclaimed")
        for lid in survivors:
            for e in range(100):
                assert (await conn.read(lid, e, master_key=KEY)).payload == data(lid, e)
        assert bookie.stop() == 0
    finally:
        await conn.close()
        await md.close()
        bookie.stop()


async def _wait_until(predicate: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    await wait_for(predicate, what, timeout_s=timeout_s)


async def test_reregisters_after_session_expiry(
    workdir: Path, zk_connect: str, cluster_root: str
) -> None:
    """SIGSTOP the bookie past its session timeout (a long GC pause or a partition): ZooKeeper
    expires the session and drops the registration; once resumed the bookie gets a new
    session and registers again, in the state it is in (read-only here)."""
    bookie = BookieProcess(workdir, zk_connect, cluster_root)
    md = MetadataClient(MetadataConfig(zk=zk_connect, root=cluster_root))
    conn = BookieConnection(bookie.address)
    try:
        proc = bookie.start()
        await md.connect()
        await md.ledgers.create(_metadata(1, bookie.address))
        await conn.add(1, 0, -1, KEY, b"before")
        bookie.write_config(threshold=0.0001, lwm=0.00005)
        os.kill(proc.pid, signal.SIGHUP)
        await _wait_state(md, bookie.address, "readonly")
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            # session_timeout_ms is 2000: the registration goes with the session.

            async def expired() -> bool:
                return bookie.address not in (await md.bookies.list_all()).all

            await wait_for(expired, "the stopped bookie's session to expire", interval_s=0.1)
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        await _wait_state_after_loss(md, bookie.address, "readonly")
        assert (await conn.read(1, 0, master_key=KEY)).payload == b"before"
        # And the state keeps following the disk after the new registration.
        bookie.write_config(threshold=0.9999, lwm=0.9998)
        os.kill(proc.pid, signal.SIGHUP)
        await _wait_state(md, bookie.address, "writable")
        assert bookie.stop() == 0
    finally:
        await conn.close()
        await md.close()
        bookie.stop()


async def _wait_state_after_loss(md: MetadataClient, bookie_id: str, state: str) -> None:
    async def current() -> str:
        try:
            return await _registered_state(md, bookie_id)
        except NotFoundError:
            return "unregistered"

    async def reached() -> bool:
        return await current() == state

    await wait_for(reached, f"bookie {bookie_id} {state}", interval_s=0.1)
