"""The bookie server and client in one process, over real TCP on a free port."""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import os
import struct
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any

import crc32c
import msgpack
import pytest

from bookie import protocol as p
from bookie import server_requests as server_module
from bookie.client import BookieConnection, ClientOptions
from bookie.config import BookieConfig
from bookie.server import BookieServer
from bookie.storage import entrylog, faults
from bookie.storage.api import Storage
from bookie.storage.engine import BookieStorage
from foundation.errors import (
    BadRequestError,
    ClosedError,
    ConnectionLostError,
    FencedError,
    IOFailureError,
    NoEntryError,
    NoLedgerError,
    ProtocolVersionError,
    ReadOnlyError,
    TimeoutError_,
    TooManyRequestsError,
    UnauthorizedError,
)
from tests.waiting import wait_for

KEY = b"master-key"


def make_storage(config: BookieConfig, fsync: Callable[[int], None] = os.fdatasync) -> Storage:
    return BookieStorage(config, fsync=fsync)


def bookie_config(tmp_path: Path, **overrides: object) -> BookieConfig:
    base = BookieConfig(
        port=0,
        journal_dir=str(tmp_path / "journal"),
        ledgers_dir=str(tmp_path / "ledgers"),
        index_dir=str(tmp_path / "index"),
        disk_check_interval_ms=50,
    )
    return dataclasses.replace(base, **overrides)  # type: ignore[arg-type]


class Bookie:
    def __init__(self, server: BookieServer, storage: Storage) -> None:
        self.server = server
        self.storage = storage
        self.address = server.address


async def start_bookie(config: BookieConfig, fsync: Callable[[int], None] = os.fdatasync) -> Bookie:
    storage = make_storage(config, fsync)
    await storage.start()
    server = BookieServer(config, storage, bookie_id="test-bookie")
    try:
        await server.start()
    except BaseException:
        await storage.close()
        raise
    return Bookie(server, storage)


async def stop_bookie(bookie: Bookie) -> None:
    try:
        await bookie.server.stop(drain_timeout_s=5.0)
    finally:
        await bookie.storage.close()


@pytest.fixture
async def bookie(tmp_path: Path) -> AsyncIterator[Bookie]:
    b = await start_bookie(bookie_config(tmp_path))
    try:
        yield b
    finally:
        await stop_bookie(b)


@pytest.fixture
async def conn(bookie: Bookie) -> AsyncIterator[BookieConnection]:
    c = BookieConnection(bookie.address)
    try:
        yield c
    finally:
        await c.close()


async def parked(bookie: Bookie, ledger_id: int, polls: int = 1) -> None:
    """Wait until ``polls`` long polls of ``ledger_id`` are waiting in the bookie."""
    storage = bookie.storage
    assert isinstance(storage, BookieStorage)

    def waiting() -> bool:
        state = storage._ledgers.get(ledger_id)
        return state is not None and len(state.waiters or ()) >= polls

    await wait_for(waiting, f"{polls} long polls of ledger {ledger_id} waiting in the bookie")


def payload(ledger_id: int, entry_id: int) -> bytes:
    return f"ledger {ledger_id} entry {entry_id} ".encode() * 3


async def test_pipelined_adds_then_reads(conn: BookieConnection) -> None:
    n = 2_000
    await asyncio.gather(
        *(conn.add(1, e, e - 1, KEY, payload(1, e)) for e in range(n)),
        *(conn.add(2, e, e - 1, KEY, payload(2, e)) for e in range(10)),
    )
    reads = await asyncio.gather(*(conn.read(1, e, master_key=KEY) for e in range(n)))
    assert [r.payload for r in reads] == [payload(1, e) for e in range(n)]
    assert all(r.entry_id == e for e, r in enumerate(reads))
    last = await conn.read(1, -1, master_key=KEY)
    assert last.entry_id == n - 1
    assert last.payload == payload(1, n - 1)
    assert await conn.list_ledgers() == (1, 2)
    assert await conn.list_entries(2, master_key=KEY) == tuple(range(10))
    info = await conn.info()
    assert info.bookie_id == "test-bookie"
    assert info.state == "writable"


async def test_errors_carry_their_codes(conn: BookieConnection) -> None:
    with pytest.raises(NoLedgerError):
        await conn.read(77, 0, master_key=KEY)
    await conn.add(3, 0, -1, KEY, b"a")
    with pytest.raises(NoEntryError):
        await conn.read(3, 5, master_key=KEY)
    with pytest.raises(UnauthorizedError):
        await conn.add(3, 1, 0, b"wrong key", b"b")


async def test_fencing_read(conn: BookieConnection) -> None:
    await conn.add(4, 0, -1, KEY, b"e0")
    await conn.add(4, 1, 0, KEY, b"e1")
    with pytest.raises(UnauthorizedError):
        await conn.read(4, -1, fence=True, master_key=b"other")
    resp = await conn.read(4, -1, fence=True, master_key=KEY)
    assert resp.entry_id == 1
    assert resp.payload == b"e1"
    assert resp.lac == 0
    with pytest.raises(FencedError):
        await conn.add(4, 2, 1, KEY, b"e2")
    await conn.add(4, 2, 1, KEY, b"e2", recovery=True)
    assert (await conn.read(4, 2, master_key=KEY)).payload == b"e2"


async def test_long_poll_returns_when_lac_passes(bookie: Bookie, conn: BookieConnection) -> None:
    await conn.add(5, 0, -1, KEY, b"e0")
    await conn.add(5, 1, 0, KEY, b"e1")  # LAC is now 0
    loop = asyncio.get_running_loop()
    started = loop.time()
    poll = asyncio.ensure_future(conn.read_lac(5, 0, timeout_ms=20_000, master_key=KEY))
    await parked(bookie, 5)
    assert not poll.done()
    await conn.add(5, 2, 1, KEY, b"e2")  # LAC 1 rides on entry 2
    resp = await asyncio.wait_for(poll, 15.0)
    assert resp.lac == 1
    assert resp.next_entry_id == 1
    assert resp.next_entry == b"e1"
    # Answered at the add, not at the end of its 20 s wait (a loaded machine gets room).
    assert loop.time() - started < 15.0


async def test_write_lac_wakes_a_long_poll_without_a_later_entry(
    bookie: Bookie, conn: BookieConnection
) -> None:
    """Explicit LAC over the wire: advertised in INFO, wakes the long poll with the
    entry piggybacked, and leaves the connection healthy for later requests."""
    assert p.FEATURE_WRITE_LAC in await conn.features()
    await conn.add(6, 0, -1, KEY, b"e0")
    await conn.add(6, 1, 0, KEY, b"e1")
    poll = asyncio.ensure_future(conn.read_lac(6, 0, timeout_ms=20_000, master_key=KEY))
    await parked(bookie, 6)
    assert not poll.done()
    assert await conn.write_lac(6, 1, KEY) == 1
    resp = await asyncio.wait_for(poll, 5.0)
    assert (resp.lac, resp.next_entry_id, resp.next_entry) == (1, 1, b"e1")
    assert await conn.write_lac(6, 9, KEY) == 1  # never past the entries held
    await conn.add(6, 2, 0, KEY, b"e2")
    assert (await conn.read_lac(6, 1, master_key=KEY)).lac == 2


async def test_write_lac_is_answered_at_once_and_refused_as_before(
    bookie: Bookie, conn: BookieConnection
) -> None:
    """WRITE_LAC takes the connection's task-free path (issue 26: a writer pushes one per
    acknowledgement): no task is spawned for it, and a wrong key, an unknown or a fenced
    ledger still get their errors, counted per status, on a connection that stays up."""
    spawned: list[p.Request] = []
    conn_spawn = bookie.server.handle

    def counting(req: p.Request) -> Coroutine[Any, Any, bytes]:
        spawned.append(req)
        return conn_spawn(req)

    bookie.server.handle = counting  # type: ignore[method-assign]
    await conn.add(9, 0, -1, KEY, b"e0")
    assert await conn.write_lac(9, 0, KEY) == 0
    with pytest.raises(UnauthorizedError):
        await conn.write_lac(9, 0, b"other")
    with pytest.raises(NoLedgerError):
        await conn.write_lac(99, 0, KEY)
    await conn.read(9, -1, fence=True, master_key=KEY)
    with pytest.raises(FencedError):
        await conn.write_lac(9, 0, KEY)
    assert not [r for r in spawned if isinstance(r, p.WriteLacRequest)]
    statuses = bookie.server.metrics._requests.statuses  # the counts /metrics exports
    assert statuses[("WRITE_LAC", "OK")] == 1
    assert statuses[("WRITE_LAC", "UNAUTHORIZED")] == 1
    assert statuses[("WRITE_LAC", "FENCED")] == 1
    assert (await conn.read_lac(9, -1, master_key=KEY)).lac == 0  # the connection is fine


async def test_long_poll_carries_a_run_of_entries(conn: BookieConnection) -> None:
    """LAC_ENTRIES: one answer brings every entry after the reader's LAC up to the
    bookie's LAC (bounded by bytes), so a tailing reader needs no read per entry."""
    assert p.FEATURE_LAC_ENTRIES in await conn.features()
    for i in range(6):
        await conn.add(8, i, i - 1, KEY, b"e%d" % i)
    await conn.write_lac(8, 4, KEY)  # entry 5 is held but not confirmed
    resp = await conn.read_lac(8, 0, timeout_ms=1_000, piggyback_bytes_max=1 << 20, master_key=KEY)
    assert (resp.lac, resp.next_entry_id, resp.next_entry) == (4, 1, b"e1")
    assert resp.more_entries == (b"e2", b"e3", b"e4")  # never past the LAC
    small = await conn.read_lac(8, 0, timeout_ms=1_000, piggyback_bytes_max=4, master_key=KEY)
    assert (small.next_entry, small.more_entries) == (b"e1", (b"e2",))  # ~4 bytes
    plain = await conn.read_lac(
        8, 0, timeout_ms=1_000, master_key=KEY
    )  # the original form: one entry
    assert (plain.next_entry, plain.more_entries) == (b"e1", ())
    caught_up = await conn.read_lac(8, 4, timeout_ms=0, piggyback_bytes_max=1 << 20, master_key=KEY)
    assert (caught_up.lac, caught_up.next_entry_id, caught_up.more_entries) == (4, None, ())


async def test_long_poll_of_a_closed_connection_leaves_nothing_behind(bookie: Bookie) -> None:
    """Long polls wait without a task: when their client goes away, storage forgets
    them at once, and the bookie goes on answering others."""
    storage = bookie.storage
    assert isinstance(storage, BookieStorage)
    c = BookieConnection(bookie.address)
    await c.add(3, 0, -1, KEY, b"e0")
    polls = [
        asyncio.ensure_future(c.read_lac(3, 0, timeout_ms=60_000, master_key=KEY)) for _ in range(5)
    ]
    await parked(bookie, 3, polls=5)
    assert len(storage._ledgers[3].waiters or ()) == 5
    await c.close()
    await asyncio.gather(*polls, return_exceptions=True)
    await wait_for(lambda: not storage._ledgers[3].waiters, "the closed client's polls forgotten")
    other = BookieConnection(bookie.address)
    try:
        await other.add(3, 1, 0, KEY, b"e1")
        assert (await other.read_lac(3, -1, timeout_ms=1_000, master_key=KEY)).lac == 0
    finally:
        await other.close()


async def test_long_poll_brings_the_next_entry_from_disk(
    bookie: Bookie, conn: BookieConnection
) -> None:
    """An entry no longer in memory (checkpointed) still rides on the answer."""
    storage = bookie.storage
    assert isinstance(storage, BookieStorage)
    for i in range(4):
        await conn.add(4, i, i - 1, KEY, b"e%d" % i)
    await storage.checkpoint()
    assert storage._memory_get(4, 1) is None
    resp = await conn.read_lac(4, 0, timeout_ms=5_000, piggyback_bytes_max=1 << 20, master_key=KEY)
    assert (resp.lac, resp.next_entry_id, resp.next_entry) == (2, 1, b"e1")
    poll = asyncio.ensure_future(conn.read_lac(4, 2, timeout_ms=5_000, master_key=KEY))
    await parked(bookie, 4)
    assert not poll.done()
    await conn.write_lac(4, 3, KEY)
    resp = await asyncio.wait_for(poll, 5.0)
    assert (resp.lac, resp.next_entry_id, resp.next_entry) == (3, 3, b"e3")


async def test_long_poll_times_out_with_the_current_lac(conn: BookieConnection) -> None:
    await conn.add(6, 0, -1, KEY, b"e0")
    await conn.add(6, 1, 0, KEY, b"e1")
    loop = asyncio.get_running_loop()
    started = loop.time()
    resp = await conn.read_lac(6, 0, timeout_ms=300, master_key=KEY)
    assert resp.lac == 0
    assert loop.time() - started >= 0.25
    # previous_lac below the LAC answers at once
    resp = await conn.read_lac(6, -1, timeout_ms=10_000, master_key=KEY)
    assert resp.lac == 0
    assert resp.next_entry == b"e0"


async def test_long_poll_capped_by_the_server(tmp_path: Path) -> None:
    b = await start_bookie(bookie_config(tmp_path, long_poll_timeout_ms_max=200))
    c = BookieConnection(b.address, ClientOptions(request_timeout_s=5.0))
    try:
        await c.add(1, 0, -1, KEY, b"x")
        resp = await asyncio.wait_for(c.read_lac(1, 5, timeout_ms=60_000, master_key=KEY), 3.0)
        assert resp.lac == -1
    finally:
        await c.close()
        await stop_bookie(b)


async def test_too_many_requests_beyond_the_inflight_bound(tmp_path: Path) -> None:
    b = await start_bookie(bookie_config(tmp_path, inflight_requests_per_connection_max=4))
    c = BookieConnection(b.address)
    try:
        await c.add(1, 0, -1, KEY, b"x")
        polls = [c.read_lac(1, 10, timeout_ms=1_000, master_key=KEY) for _ in range(10)]
        results = await asyncio.gather(*polls, return_exceptions=True)
        rejected = [r for r in results if isinstance(r, TooManyRequestsError)]
        answered = [r for r in results if isinstance(r, p.ReadLacResponse)]
        assert len(rejected) == 6 and len(answered) == 4, results
        counted = b.server.metrics.registry.get_sample_value(
            "bookline_bookie_rejected_requests_total"
        )
        assert counted == 6  # docs/metrics.md names this test as moving the family
        await c.add(1, 1, 0, KEY, b"y")  # the connection is still fine
    finally:
        await c.close()
        await stop_bookie(b)


async def test_client_bounds_its_own_inflight(bookie: Bookie) -> None:
    c = BookieConnection(bookie.address, ClientOptions(inflight_max=3))
    try:
        await c.add(1, 0, -1, KEY, b"x")
        polls = [
            asyncio.ensure_future(c.read_lac(1, 10, timeout_ms=500, master_key=KEY))
            for _ in range(6)
        ]
        await wait_for(lambda: c.inflight >= 3, "three reads in flight")
        assert c.inflight == 3  # the other three wait for room
        assert all(isinstance(r, p.ReadLacResponse) for r in await asyncio.gather(*polls))
    finally:
        await c.close()


def raw_frame(op: int, rid: int, meta: bytes, *, version: int = p.PROTOCOL_VERSION) -> bytes:
    import crc32c

    header = struct.pack(">2sBBBBHIIQ", p.MAGIC, version, op, 0, 0, 0, len(meta), len(meta), rid)
    return header + struct.pack(">I", crc32c.crc32c(meta, crc32c.crc32c(header))) + meta


async def read_response(reader: asyncio.StreamReader) -> p.Response:
    d = p.Decoder(responses=True)
    while True:
        frame = d.next_frame()
        if not isinstance(frame, p.NeedData):
            return frame  # type: ignore[return-value]
        data = await asyncio.wait_for(reader.read(65536), 5.0)
        assert data, "connection closed"
        d.feed(data)


async def test_malformed_frames_leave_other_connections_healthy(
    bookie: Bookie, conn: BookieConnection
) -> None:
    await conn.add(1, 0, -1, KEY, b"x")
    host, port = bookie.address.split(":")
    # 1. A frame with a good CRC but a bad body: BAD_REQUEST for its id, stream goes on.
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(raw_frame(p.Op.ADD, 99, msgpack.packb(["x"])))
        writer.write(p.encode_request(p.InfoRequest(100)))
        resp = await read_response(reader)
        assert isinstance(resp, p.ErrorResponse)
        assert resp.request_id == 99
        assert isinstance(resp.error(), BadRequestError)
        info = await read_response(reader)
        assert isinstance(info, p.InfoResponse)
        assert info.request_id == 100
    finally:
        writer.close()
    # 2. Garbage, a wrong version, an oversized frame: that connection is closed.
    wrong_version = raw_frame(p.Op.INFO, 1, b"\x90", version=9)
    garbage = [
        b"GET / HTTP/1.1\r\n\r\n" + b"\0" * 32,
        wrong_version,
        struct.pack(">2sBBBBHIIQI", p.MAGIC, p.PROTOCOL_VERSION, 1, 0, 0, 0, 1 << 30, 0, 1, 0),
    ]
    for bad in garbage:
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            writer.write(bad)
            answer = await asyncio.wait_for(reader.read(), 5.0)
            if bad is wrong_version:  # told why, in the bookie's version, then closed
                decoder = p.Decoder(responses=True)
                decoder.feed(answer)
                error = decoder.next_frame()
                assert isinstance(error, p.ErrorResponse)
                assert error.code == ProtocolVersionError.code
            else:
                assert answer == b""
        finally:
            writer.close()
    # 3. The well-behaved connection never noticed.
    await conn.add(1, 1, 0, KEY, b"y")
    assert (await conn.read(1, 1, master_key=KEY)).payload == b"y"


async def test_read_only_transition_both_ways(bookie: Bookie, conn: BookieConnection) -> None:
    states: list[bool] = []

    async def on_change(read_only: bool) -> None:
        states.append(read_only)

    bookie.server._on_read_only_change = on_change
    await conn.add(1, 0, -1, KEY, b"x")
    bookie.server.set_disk_thresholds(1e-9, 1e-10)  # any usage is "too full"

    async def state(want: str) -> None:
        async def reached() -> bool:
            return (await conn.info()).state == want

        await wait_for(reached, f"the bookie {want}")

    await state("read_only")
    with pytest.raises(ReadOnlyError):
        await conn.add(1, 1, 0, KEY, b"y")
    assert (await conn.read(1, 0, master_key=KEY)).payload == b"x"  # reads still served
    bookie.server.set_disk_thresholds(0.9999, 0.9998)
    await state("writable")
    await conn.add(1, 1, 0, KEY, b"y")
    assert states[-2:] == [True, False]


async def test_connection_loss_and_close(tmp_path: Path) -> None:
    b = await start_bookie(bookie_config(tmp_path))
    c = BookieConnection(b.address, ClientOptions(request_timeout_s=2.0))
    try:
        await c.add(1, 0, -1, KEY, b"x")
        poll = asyncio.ensure_future(c.read_lac(1, 0, timeout_ms=10_000, master_key=KEY))
        await parked(b, 1)
        await b.server.stop(drain_timeout_s=1.0)  # long polls are cut at shutdown
        with pytest.raises(ConnectionLostError):
            await poll
        with pytest.raises((ConnectionLostError, TimeoutError_)):
            await c.info()  # nobody listens any more
    finally:
        await b.storage.close()
        await c.close()
    with pytest.raises(ClosedError):
        await c.info()


async def test_request_timeout() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # read everything, answer nothing
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    c = BookieConnection(f"127.0.0.1:{port}", ClientOptions(request_timeout_s=0.2))
    try:
        with pytest.raises(TimeoutError_):
            await c.add(1, 0, -1, KEY, b"x")
        with pytest.raises(TimeoutError_):
            await c.info(timeout_s=0.05)
        assert c.inflight == 0
    finally:
        await c.close()
        server.close()
        await server.wait_closed()


async def test_fsync_failure_is_fatal(tmp_path: Path) -> None:
    failing = False

    def fsync(fd: int) -> None:
        if failing:
            raise OSError(errno.EIO, "injected fsync failure")
        os.fdatasync(fd)

    b = await start_bookie(bookie_config(tmp_path), fsync)
    c = BookieConnection(b.address, ClientOptions(request_timeout_s=5.0))
    try:
        await c.add(1, 0, -1, KEY, b"durable")
        failing = True
        with pytest.raises((IOFailureError, ConnectionLostError)):
            await c.add(1, 1, 0, KEY, b"never acknowledged")
        await asyncio.wait_for(b.server.failed.wait(), 5.0)
        assert b.server.fatal_error is not None
        with pytest.raises((ConnectionLostError, IOFailureError, TimeoutError_)):
            await c.add(1, 2, 0, KEY, b"after the failure")
    finally:
        await c.close()
        await b.server.stop(drain_timeout_s=1.0)
        await b.storage.close()


# --- fast paths, last entry, recovery on read-only, metrics ---------------------------------


async def test_add_future_keeps_call_order_and_reports_errors(bookie: Bookie) -> None:
    # inflight_max 8: most calls find no room and take the queued path behind the others.
    c = BookieConnection(bookie.address, ClientOptions(inflight_max=8))
    try:
        await c.connect()
        futs = [c.add_future(5, e, e - 1, KEY, payload(5, e)) for e in range(200)]
        assert c.inflight <= 8
        await asyncio.gather(*futs)
        assert await c.list_entries(5, master_key=KEY) == tuple(range(200))
        bad = c.add_future(5, 200, 199, b"wrong key", b"x")
        with pytest.raises(UnauthorizedError):
            await bad
        assert c.inflight == 0
        await c.close()
        with pytest.raises(ClosedError):
            await c.add_future(5, 201, 200, KEY, b"x")
    finally:
        await c.close()


async def test_ledger_adder_binds_ledger_key_and_recovery(bookie: Bookie) -> None:
    # inflight_max 8: most adds find no room and take the queued path behind the others.
    c = BookieConnection(bookie.address, ClientOptions(inflight_max=8))
    try:
        adder = c.adder(12, KEY)
        assert (adder.ledger_id, adder.master_key, adder.recovery) == (12, KEY, False)
        assert adder.timeout_s == c.options.request_timeout_s
        futs = [adder.add(e, e - 1, payload(12, e)) for e in range(100)]
        outcomes: list[BaseException | None] = []
        tasks = [adder.add_callback(e, e - 1, payload(12, e), outcomes.append)
                 for e in range(100, 150)]  # fmt: skip
        await asyncio.gather(*futs)
        await wait_for(lambda: len(outcomes) >= 50, "50 callbacks")
        assert outcomes == [None] * 50
        assert any(t is not None for t in tasks)  # some waited for room
        assert await c.list_entries(12, master_key=KEY) == tuple(range(150))
        (await c.read(12, 0, fence=True, master_key=KEY)).lac  # noqa: B018 - fence it
        with pytest.raises(FencedError):
            await adder.add(150, 149, b"x")
        recovery = c.adder(12, KEY, recovery=True, timeout_s=2.0)
        assert recovery.timeout_s == 2.0
        await recovery.add(150, 149, payload(12, 150))
        errors: list[BaseException | None] = []
        assert c.adder(12, b"wrong key").add_callback(151, 150, b"x", errors.append) is None
        await wait_for(lambda: errors, "the wrong key's callback")
        assert isinstance(errors[0], UnauthorizedError)
        await c.close()
        with pytest.raises(ClosedError):
            await adder.add(152, 151, b"x")
    finally:
        await c.close()


async def test_read_last_entry_does_not_list_entries(
    bookie: Bookie, conn: BookieConnection, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def no_listing(_ledger_id: int) -> list[int]:
        raise AssertionError("READ of entry -1 must not list the ledger's entries")

    monkeypatch.setattr(bookie.storage, "entries", no_listing)
    await asyncio.gather(*(conn.add(9, e, e - 1, KEY, payload(9, e)) for e in range(30)))
    await bookie.storage.checkpoint()
    await conn.add(9, 30, 29, KEY, payload(9, 30))
    last = await conn.read(9, -1, master_key=KEY)
    assert (last.entry_id, last.payload) == (30, payload(9, 30))
    await conn.add(10, 0, -1, KEY, b"only")
    assert (await conn.read(10, -1, master_key=KEY)).entry_id == 0


async def test_recovery_adds_go_through_on_a_read_only_bookie(
    bookie: Bookie, conn: BookieConnection
) -> None:
    await conn.add(4, 0, -1, KEY, b"a")
    bookie.storage.set_read_only(True)
    with pytest.raises(ReadOnlyError):
        await conn.add(4, 1, 0, KEY, b"b")
    await conn.add(4, 1, 0, KEY, b"b", recovery=True)
    assert (await conn.read(4, 1, master_key=KEY)).payload == b"b"


async def test_metrics_endpoint_exposes_the_bookie_figures(tmp_path: Path) -> None:
    b = await start_bookie(bookie_config(tmp_path, metrics_port=0))
    c = BookieConnection(b.address)
    try:
        await asyncio.gather(*(c.add(1, e, e - 1, KEY, payload(1, e)) for e in range(100)))
        for e in range(10):
            await c.read(1, e, master_key=KEY)
        await b.storage.checkpoint()
        await c.read(
            1, 50, master_key=KEY
        )  # from the entry log: a cache miss, read-ahead fills the cache
        await c.read(1, 51, master_key=KEY)  # a read-cache hit
        url = b.server.metrics_address
        wanted = (
            'bookline_bookie_requests_total{op="ADD",status="OK"} 100.0',
            'bookline_bookie_requests_total{op="READ",status="OK"} 12.0',
            'bookline_bookie_request_seconds_count{op="ADD"} 100.0',
            'bookline_bookie_request_seconds_bucket{le="0.005",op="READ"}',
            "bookline_bookie_journal_fsync_seconds_count",
            "bookline_bookie_journal_group_records_bucket",
            "bookline_bookie_memtable_bytes ",
            "bookline_bookie_read_cache_hit_ratio ",
            "bookline_bookie_disk_used_ratio ",
            'bookline_bookie_storage_read_lookups_total{result="read_cache_hit"} 1.0',
            "bookline_bookie_storage_adds_total 100.0",
        )

        def hit_ratio(text: str) -> float:
            line = next(
                ln for ln in text.splitlines() if ln.startswith("bookline_bookie_read_cache_hit")
            )
            return float(line.split()[-1])

        async def exported() -> str | None:  # the health loop refreshes gauges every second
            text = await asyncio.to_thread(_scrape, url)
            # The ratio gauge too: a refresh just before the hit still shows 0.
            ready = all(w in text for w in wanted) and hit_ratio(text) > 0.0
            return text if ready else None

        text = await wait_for(
            exported, "every wanted sample exported", timeout_s=10, interval_s=0.2
        )
        assert 0.0 < hit_ratio(text) < 1.0, text
        ahead = [
            ln for ln in text.splitlines() if ln.startswith("bookline_bookie_storage_read_ahead")
        ]
        assert float(ahead[0].split()[-1]) > 0, ahead  # docs/metrics.md names this test
    finally:
        await c.close()
        await stop_bookie(b)


def _scrape(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as resp:
        return bytes(resp.read()).decode()


# -- replica check ops (LIST_DAMAGED, ENTRY_CHECKSUMS) ----------------------------------


async def test_entry_checksums_fingerprint_the_stored_blobs(conn: BookieConnection) -> None:
    held = [e for e in range(10) if e != 4]
    for e in held:
        await conn.add(3, e, -1, KEY, payload(3, e))
    assert p.FEATURE_REPLICA_CHECK in await conn.features()
    resp = await conn.entry_checksums(3, 0, 20)
    assert resp.last_entry_id == 20
    assert resp.damaged == ()
    assert resp.checksums == tuple(
        p.EntryChecksum(e, crc32c.crc32c(payload(3, e)), len(payload(3, e))) for e in held
    )
    assert (await conn.entry_checksums(3, 4, 4)).checksums == ()  # not held: in no list
    with pytest.raises(NoLedgerError):
        await conn.entry_checksums(99, 0, 5)
    page = await conn.list_damaged()
    assert page.damaged == ()
    assert page.next_from is None


async def test_entry_checksums_answer_in_bounded_parts(
    conn: BookieConnection, monkeypatch: pytest.MonkeyPatch
) -> None:
    for e in range(5):
        await conn.add(6, e, -1, KEY, payload(6, e))
    monkeypatch.setattr(server_module, "CHECKSUM_READ_BYTES_MAX", 1)  # one entry per answer
    resp = await conn.entry_checksums(6, 1, 4)
    assert resp.last_entry_id == 1
    assert [c.entry_id for c in resp.checksums] == [1]
    wide = await conn.entry_checksums(6, 0, p.CHECKSUM_RANGE_ENTRIES_MAX * 3)
    assert wide.last_entry_id == 0  # the read budget ends it after the first entry
    monkeypatch.undo()
    wide = await conn.entry_checksums(6, 0, p.CHECKSUM_RANGE_ENTRIES_MAX * 3)
    assert wide.last_entry_id == p.CHECKSUM_RANGE_ENTRIES_MAX - 1  # the entry bound
    assert len(wide.checksums) == 5


def test_damaged_pages_follow_on_from_each_other() -> None:
    damaged = [(lid, e) for lid in (1, 2, 3) for e in range(p.DAMAGED_PAGE_ENTRIES_MAX // 2)]
    pages = []
    start = (0, 0)
    while True:
        page = server_module.damaged_page(p.ListDamagedRequest(1, *start), damaged)
        assert len(page.damaged) <= p.DAMAGED_PAGE_ENTRIES_MAX
        pages.append(page)
        if page.next_from is None:
            break
        start = page.next_from
    assert [pair for page in pages for pair in page.damaged] == damaged
    assert len(pages) == 2
    assert server_module.damaged_page(p.ListDamagedRequest(1, 2, 5), damaged).damaged[0] == (2, 5)


async def test_damaged_entry_is_listed_reported_and_repaired(tmp_path: Path) -> None:
    config = bookie_config(tmp_path)
    storage = BookieStorage(config)
    await storage.start()
    try:
        for e in range(6):
            await storage.add_entry(8, e, e - 1, KEY, payload(8, e))
        await storage.checkpoint()
        loc = storage._index.get(8, 3)
        assert loc is not None
    finally:
        await storage.close()
    faults.flip_bit(
        Path(config.ledgers_dir) / entrylog.file_name(loc.log_id),
        loc.offset + entrylog.RECORD_HEADER_BYTES + 5,
    )
    b = await start_bookie(config)
    c = BookieConnection(b.address)
    try:
        resp = await c.entry_checksums(8, 0, 5)  # the read finds the damage
        assert resp.damaged == (3,)
        assert [x.entry_id for x in resp.checksums] == [0, 1, 2, 4, 5]
        assert (await c.list_damaged()).damaged == ((8, 3),)
        assert (await c.list_damaged(8, 4)).damaged == ()
        await c.add(8, 3, 2, KEY, payload(8, 3), recovery=True)
        # Served intact at once (from memory), though marked until the checkpoint.
        fixed = await c.entry_checksums(8, 3, 3)
        assert fixed.damaged == ()
        assert fixed.checksums[0].crc32c == crc32c.crc32c(payload(8, 3))
        await b.storage.checkpoint()
        assert (await c.list_damaged()).damaged == ()
    finally:
        await c.close()
        await stop_bookie(b)
