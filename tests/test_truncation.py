"""Truncation never reaches past what is durable, and never hides later records.

Issue 12 defect 1: a truncate position past the end used to be accepted, marked the
in-progress segment truncated at that point, and hid every record written after it for
good (reads from earliest returned nothing; describing the stream failed with
NO_ENTRY). Both the core library and the write proxy's HTTP route are checked, with
real bookies and proxies.
"""

from __future__ import annotations

import itertools
import os
import uuid
from collections.abc import AsyncIterator

import pytest

from bookline import DLSN, LogRecord, Namespace, NamespaceConfig, ProxyClient
from foundation.errors import OutOfRangeError
from tests.conftest import BookieCluster
from tests.values import values
from tests.waiting import wait_for
from thinclient.client import ClientConfig

pytestmark = pytest.mark.integration

_names = itertools.count()
CONFIG = NamespaceConfig(session_timeout_ms=4000, long_poll_timeout_ms=1000)


@pytest.fixture
async def ns(bookie_cluster: BookieCluster) -> AsyncIterator[Namespace]:
    n = await Namespace.open(
        bookie_cluster.zk, bookie_cluster.root, f"tr{os.getpid()}-{next(_names)}", CONFIG
    )
    try:
        yield n
    finally:
        await n.close()


async def _read_all(ns: Namespace, name: str) -> list[bytes]:
    reader = await ns.open_reader(name, "earliest")
    try:
        out: list[bytes] = []
        while batch := await reader.read_many(1000, timeout_s=0.5):
            out.extend(values(batch))
        return out
    finally:
        await reader.close()


async def test_core_truncate_past_the_end_is_refused_and_hides_nothing(ns: Namespace) -> None:
    await ns.create_stream("s")
    w = await ns.open_writer("s")
    try:
        first = [await w.write(LogRecord(b"a%d" % i)) for i in range(5)]
        beyond = DLSN(first[-1].segment_seqno, 1_000_000, 0)
        with pytest.raises(OutOfRangeError, match="beyond the durable end"):
            await w.truncate(beyond)
        with pytest.raises(OutOfRangeError):
            await w.truncate(DLSN(first[-1].segment_seqno + 1, 0, 0))
        later = [await w.write(LogRecord(b"b%d" % i)) for i in range(5)]
        assert later[0] > first[-1]
    finally:
        await w.close()
    assert await _read_all(ns, "s") == [b"a%d" % i for i in range(5)] + [
        b"b%d" % i for i in range(5)
    ]
    info = await ns.stream_info("s")
    assert info.record_count == 10


async def test_core_truncate_up_to_the_end_keeps_what_comes_after(ns: Namespace) -> None:
    """The largest accepted point is just after the last durable record: it drops
    everything written so far and nothing written later."""
    await ns.create_stream("s")
    w = await ns.open_writer("s")
    try:
        first = [await w.write(LogRecord(b"a%d" % i)) for i in range(5)]
        end = DLSN(first[-1].segment_seqno, first[-1].entry_id + 1, 0)
        assert await w.truncate(end)
        later = [await w.write(LogRecord(b"b%d" % i)) for i in range(3)]
        assert later[0] >= end
    finally:
        await w.close()
    assert await _read_all(ns, "s") == [b"b0", b"b1", b"b2"]
    info = await ns.stream_info("s")
    assert info.record_count == 3


async def test_core_truncate_of_a_fresh_writer_counts_sealed_segments(ns: Namespace) -> None:
    """A writer that has written nothing yet knows its durable end from the segments
    sealed before it: points inside them are fine, past its own segment's start not."""
    await ns.create_stream("s")
    w = await ns.open_writer("s")
    try:
        first = [await w.write(LogRecord(b"a%d" % i)) for i in range(4)]
    finally:
        await w.close()
    w = await ns.open_writer("s")
    try:
        assert w.segment_seqno > first[-1].segment_seqno
        with pytest.raises(OutOfRangeError):
            await w.truncate(DLSN(w.segment_seqno, 1, 0))
        assert await w.truncate(first[2])
        await w.write(LogRecord(b"c"))
    finally:
        await w.close()
    assert await _read_all(ns, "s") == [b"a2", b"a3", b"c"]


async def test_proxy_truncate_past_the_end_is_a_clear_error(proxy_cluster: object) -> None:
    from ops.cluster.local import LocalCluster

    assert isinstance(proxy_cluster, LocalCluster)
    client = ProxyClient(
        write_urls=[p.extra["url"] for p in proxy_cluster.write_proxies],
        read_urls=[p.extra["url"] for p in proxy_cluster.read_proxies],
        config=ClientConfig(retry_deadline_ms=20_000),
    )
    await client.start()
    stream = f"trunc-{uuid.uuid4().hex[:8]}"
    try:
        await client.create_stream(stream)
        first = [await client.write(stream, b"a%d" % i) for i in range(5)]
        with pytest.raises(OutOfRangeError):
            await client.truncate(stream, DLSN(first[-1].segment_seqno, 1_000_000, 0))
        for i in range(5):
            await client.write(stream, b"b%d" % i)
        want = [b"a%d" % i for i in range(5)] + [b"b%d" % i for i in range(5)]
        got: list[bytes] = []
        pos: object = "earliest"

        async def read_all() -> bool:  # one turn: read the next page
            nonlocal pos
            page = await client.read(stream, pos, limit=100)  # type: ignore[arg-type]
            got.extend(values(page.records))
            pos = page.next
            return len(got) >= len(want)

        await wait_for(read_all, lambda: f"{len(want)} records, got {got}", timeout_s=20)
        assert got == want
        described = await client.stream_info(stream)
        assert described.name == stream
    finally:
        await client.close()
