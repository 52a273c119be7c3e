"""Power cuts with real bookie processes (issue 12): no acknowledged record is lost.

Three bookies run with the storage fault shim in ``power-cut`` mode (bookie/storage/
faults.py): their writes stay in process memory until fsynced, so SIGKILL drops exactly
what a power cut would (a plain kill -9 keeps the page cache). Several writers append to
several streams at once through the core library; all bookies are cut at once mid-stream
and restarted on the same ports and directories; every stream is then recovered and read
in full, and every acknowledged record must be there.

The control test runs the bookies acknowledging without journal fsync: the same cut must
lose acknowledged records, or the test above could not fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from bookline import DLSN, LogRecord, Namespace, NamespaceConfig, StreamOptions
from foundation.errors import BooklineError
from ops.cluster import procs
from tests.values import values
from tests.waiting import wait_for, wait_until

pytestmark = pytest.mark.integration

SESSION_TIMEOUT_MS = 2000
CONFIG = NamespaceConfig(session_timeout_ms=SESSION_TIMEOUT_MS)
READY_TIMEOUT_S = 60.0
WINDOW = 32  # records in flight per writer


@dataclass
class ShimBookies:
    """Bookie processes on fixed ports and directories, so a restart is the same bookie."""

    zk: str
    root: str
    workdir: Path
    flags: list[str]
    env: dict[str, str]
    ports: list[int] = field(default_factory=list)
    running: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start_all(self, count: int = 3) -> None:
        if not self.ports:
            self.ports = [procs.free_port() for _ in range(count)]
        starting = [(port, *self._spawn(port)) for port in self.ports]
        for port, proc, ready_before in starting:
            self._wait_ready(port, proc, ready_before)

    def _log(self, port: int) -> Path:
        return self.workdir / f"bookie-{port}" / "bookie.log"

    def _spawn(self, port: int) -> tuple[subprocess.Popen[bytes], int]:
        d = self.workdir / f"bookie-{port}"
        log = self._log(port)
        before = log.read_bytes().count(b"bookie ready") if log.exists() else 0
        argv = [
            str(Path(sys.executable).with_name("bookline")), "bookie",
            "--zk", self.zk, "--root", self.root, "--port", str(port),
            "--journal-dir", str(d / "journal"), "--ledgers-dir", str(d / "ledgers"),
            "--index-dir", str(d / "index"),
            "--session-timeout-ms", str(SESSION_TIMEOUT_MS), *self.flags,
        ]  # fmt: skip
        proc = procs.spawn(argv, log_path=log, env=dict(os.environ, **self.env))
        self.running.append(proc)
        return proc, before

    def _wait_ready(self, port: int, proc: subprocess.Popen[bytes], before: int) -> None:
        log = self._log(port)

        def ready() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"bookie exited {proc.returncode}: {log.read_text()[-3000:]}")
            return log.read_bytes().count(b"bookie ready") > before

        wait_until(
            ready,
            lambda: f"bookie on {port} to be ready: {log.read_text()[-3000:]}",
            timeout_s=READY_TIMEOUT_S,
        )

    def power_cut(self) -> None:
        """SIGKILL every bookie at once (first all signals, then the reaping)."""
        for proc in self.running:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        for proc in self.running:
            procs.kill9(proc)
        self.running.clear()

    def stop(self) -> None:
        for proc in self.running:
            procs.stop(proc, grace_s=5.0)
        self.running.clear()

    def log_text(self) -> str:
        return "\n".join(self._log(p).read_text() for p in self.ports if self._log(p).exists())


@pytest.fixture
def shim_bookies(zk_connect: str, cluster_root: str, tmp_path: Path) -> Iterator[ShimBookies]:
    bookies = ShimBookies(zk_connect, cluster_root, tmp_path, [], {})
    try:
        yield bookies
    finally:
        bookies.stop()


def _configure(bookies: ShimBookies, *, journal_sync: bool) -> None:
    bookies.flags = ["--fault-shim", "power-cut"]
    if not journal_sync:
        bookies.flags.append("--no-journal-sync")
    bookies.env = {
        "BOOKLINE_BOOKIE_ENTRY_LOG_BYTES_MAX": str(1 << 20),
        # Checkpoints while writing: the cut finds entries in entry logs + index too.
        # The control keeps everything in the (unsynced) journal instead.
        "BOOKLINE_BOOKIE_CHECKPOINT_INTERVAL_MS": "700" if journal_sync else "600000",
        "BOOKLINE_BOOKIE_GC_INTERVAL_MS": "1000",
    }


async def _writer(ns: Namespace, stream: str, acked: list[int]) -> None:
    """Append ``<stream>-<i>`` records with WINDOW in flight until the writer fails
    (the bookies are gone) or the task is cancelled; record each acknowledged i."""
    w = await ns.open_writer(stream, "writer", lock_timeout_s=30)
    pending: list[tuple[int, asyncio.Future[DLSN]]] = []
    i = 0
    with contextlib.suppress(BooklineError):
        while True:
            while len(pending) < WINDOW:
                fut = w.write_nowait(LogRecord(f"{stream}-{i}".encode()))
                pending.append((i, fut))
                i += 1
            index, fut = pending.pop(0)
            await fut
            acked.append(index)
            if index % 64 == 0:
                await asyncio.sleep(0.002)  # a steady stream, not a flood


def _counts(acked: dict[str, list[int]]) -> dict[str, int]:
    return {name: len(indexes) for name, indexes in acked.items()}


async def _read_all(ns: Namespace, stream: str) -> list[bytes]:
    info = await ns.stream_info(stream)
    reader = await ns.open_reader(stream)
    out: list[bytes] = []
    try:
        while len(out) < info.record_count:
            batch = await reader.read_many(10_000, timeout_s=20)
            assert batch, f"{stream}: read stalled at {len(out)} of {info.record_count}"
            out.extend(values(batch))
    finally:
        await reader.close()
    return out


async def _cut_run(bookies: ShimBookies, namespace: str, streams: int, write_s: float,
                   rollover_bytes: int) -> dict[str, tuple[list[int], list[bytes]]]:  # fmt: skip
    """Write ``streams`` streams concurrently for ``write_s``, cut the power of every
    bookie, restart them, recover and read every stream. Returns stream -> (acknowledged
    indexes, payloads read)."""
    names = [f"s{n}" for n in range(streams)]
    ns = await Namespace.open(bookies.zk, bookies.root, namespace, CONFIG)
    acked: dict[str, list[int]] = {name: [] for name in names}
    try:
        for name in names:
            await ns.create_stream(name, StreamOptions(segment_rollover_bytes=rollover_bytes))
        tasks = [asyncio.create_task(_writer(ns, name, acked[name])) for name in names]
        await asyncio.sleep(write_s)  # the writers run this long before the cut
        await wait_for(
            lambda: all(acked.values()),
            lambda: f"an acknowledged write on every stream: {_counts(acked)}",
        )
        bookies.power_cut()
        await asyncio.sleep(0.5)  # answers already on their way are still counted
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        with contextlib.suppress(BooklineError, TimeoutError):
            await asyncio.wait_for(ns.close(), 10)
    bookies.start_all()
    found: dict[str, tuple[list[int], list[bytes]]] = {}
    ns = await Namespace.open(bookies.zk, bookies.root, namespace, CONFIG)
    try:
        for name in names:
            w = await ns.open_writer(name, "recovery", lock_timeout_s=30)  # recovers
            await w.close()
            found[name] = (acked[name], await _read_all(ns, name))
    finally:
        await ns.close()
    return found


def _check_nothing_lost(found: dict[str, tuple[list[int], list[bytes]]]) -> tuple[int, int]:
    """Each stream reads back as a gap-free prefix holding every acknowledged record;
    returns (records acknowledged, records found) over all streams."""
    acked_total = found_total = 0
    for name, (acked, payloads) in found.items():
        assert payloads == [f"{name}-{i}".encode() for i in range(len(payloads))], name
        lost = [i for i in acked if i >= len(payloads)]
        assert not lost, f"{name}: {len(lost)} acknowledged records lost, first {lost[0]}"
        acked_total += len(acked)
        found_total += len(payloads)
    return acked_total, found_total


async def _power_cuts(bookies: ShimBookies, runs: int, streams: int, write_s: float) -> None:
    _configure(bookies, journal_sync=True)
    bookies.start_all()
    for run in range(runs):
        found = await _cut_run(bookies, f"cut{run}", streams, write_s, rollover_bytes=40_000)
        acked, read = _check_nothing_lost(found)
        print(
            f"power cut run {run + 1}/{runs}: {streams} writers, {acked} records "
            f"acknowledged, {read} found, 0 lost"
        )
    log = bookies.log_text()
    assert "storage fault shim is ON (mode 'power-cut')" in log
    assert "JournalCorruptError" not in log
    assert "damaged entry" not in log


async def test_power_cut_of_every_bookie_loses_no_acknowledged_record(
    shim_bookies: ShimBookies,
) -> None:
    await _power_cuts(shim_bookies, runs=1, streams=3, write_s=2.0)


@pytest.mark.slow
async def test_power_cuts_three_runs_more_writers(shim_bookies: ShimBookies) -> None:
    await _power_cuts(shim_bookies, runs=3, streams=6, write_s=4.0)


async def test_control_bookies_without_journal_fsync_lose_acknowledged_records(
    shim_bookies: ShimBookies,
) -> None:
    """The shim really drops what was not fsynced: bookies acknowledging without journal
    fsync (and no checkpoint in time) lose acknowledged records in the same cut."""
    _configure(shim_bookies, journal_sync=False)
    shim_bookies.start_all()
    found = await _cut_run(shim_bookies, "control", 1, 1.5, rollover_bytes=256 << 20)
    ((acked, payloads),) = found.values()
    print(
        f"control (no journal fsync): {len(acked)} records acknowledged, "
        f"{len(payloads)} found after the power cut"
    )
    assert acked
    assert len(payloads) < max(acked) + 1


async def test_corrupt_journal_stops_the_bookie_process_with_file_and_offset(
    shim_bookies: ShimBookies,
) -> None:
    """A damaged record with untrusted ids before acknowledged ones: the restarted bookie
    exits with status 3 and says which file and offset, instead of cutting them off."""
    from bookie.client import BookieConnection
    from bookie.storage import faults, journal
    from tests.ledger_support import register_ledgers

    bookies = shim_bookies
    bookies.env = {"BOOKLINE_BOOKIE_CHECKPOINT_INTERVAL_MS": "600000"}  # journal only
    bookies.start_all(count=1)
    await register_ledgers(bookies.zk, bookies.root, b"key", 7)
    conn = BookieConnection(f"127.0.0.1:{bookies.ports[0]}")
    await conn.connect()
    try:
        for start in range(0, 200, 10):  # separate group commits
            await asyncio.gather(*(conn.add_future(7, e, e - 1, b"key", b"payload-%d" % e)
                                   for e in range(start, start + 10)))  # fmt: skip
    finally:
        await conn.close()
    procs.kill9(bookies.running.pop())
    directory = bookies.workdir / f"bookie-{bookies.ports[0]}" / "journal"
    (file_id,) = journal.list_files(directory)
    offset = journal.FILE_HEADER_BYTES
    for rec, end in journal.replay(directory, journal.JournalMark(file_id, 0)).records:
        if rec.type == journal.ADD and rec.entry_id == 100:
            break
        offset = end
    path = directory / journal.file_name(file_id)
    faults.flip_bit(path, offset + 12)  # the record's ledger id
    proc, _ready = bookies._spawn(bookies.ports[0])
    assert proc.wait(timeout=60) == 3
    log = bookies.log_text()
    assert f"journal {path} is corrupt at offset {offset}" in log
    assert "cannot start" in log
    assert "torn tail" not in log
