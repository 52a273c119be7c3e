"""Namespaces, streams, segment transitions and subscriptions against real ZooKeeper."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from foundation.errors import AlreadyExistsError, BadRequestError, BadVersionError, NotFoundError
from metadata import MetadataClient
from metadata.segments import SegmentMetadata, SegmentState, TruncationState
from metadata.streams import NO_TXID, StreamOptions
from tests.metadata_support import Clients, metadata_clients

pytestmark = pytest.mark.integration

NS, S = "ns1", "events"


@pytest.fixture
async def clients(zk_connect: str, cluster_root: str) -> AsyncIterator[Clients]:
    async with metadata_clients(zk_connect, cluster_root) as c:
        yield c


@pytest.fixture
async def md(clients: Clients) -> MetadataClient:
    client = await clients.new()
    await client.streams.create_namespace(NS)
    await client.streams.create_stream(NS, S, StreamOptions(retention_ms=60_000))
    for ledger_id in (1, 2, 3, 10, 11, 77):  # segments name only ledgers that exist
        await client.zk.create(client.layout.ledger(ledger_id), b"", makepath=True)
    return client


async def snapshot(md: MetadataClient) -> tuple[object, ...]:
    return (
        await md.segments.list_segments(NS, S),
        await md.streams.get_max_txid(NS, S),
    )


async def test_namespaces_and_streams(md: MetadataClient) -> None:
    st = md.streams
    assert await st.list_namespaces() == [NS]
    with pytest.raises(AlreadyExistsError):
        await st.create_namespace(NS)
    with pytest.raises(AlreadyExistsError):
        await st.create_stream(NS, S)
    with pytest.raises(NotFoundError, match="namespace"):
        await st.create_stream("nope", "s")
    await st.create_stream(NS, "other")
    assert await st.list_streams(NS) == [S, "other"]
    record, version = await st.get_stream(NS, S)
    assert record.options.retention_ms == 60_000
    await st.update_options(NS, S, StreamOptions(retention_bytes=10), version)
    with pytest.raises(BadVersionError):
        await st.update_options(NS, S, StreamOptions(), version)
    assert await st.get_max_txid(NS, S) == (NO_TXID, 0)
    with pytest.raises(BadRequestError, match="still has 2 stream"):
        await st.delete_namespace(NS)
    await st.delete_stream(NS, "other")
    await st.delete_stream(NS, S)
    assert not await st.stream_exists(NS, S)
    await st.delete_namespace(NS)
    assert await st.list_namespaces() == []


async def test_open_seal_open_next(md: MetadataClient) -> None:
    seg = md.segments
    _txid, tv = await md.streams.get_max_txid(NS, S)
    first = SegmentMetadata(seqno=1, ledger_id=10, first_txid=0, ctime_ms=1)
    await seg.open_segment(NS, S, first, max_txid=0, max_txid_version=tv)
    ((stored, sv),) = await seg.list_segments(NS, S)
    assert stored == first
    assert stored.state is SegmentState.IN_PROGRESS
    sealed = first.sealed(
        last_txid=99,
        last_entry_id=4,
        last_slot_id=9,
        record_count=100,
        size_bytes=1000,
        sealed_ms=2,
    )
    nxt = SegmentMetadata(seqno=2, ledger_id=11, first_txid=100, start_sequence_id=100)
    await seg.seal_and_open(NS, S, sealed, sv, nxt, max_txid=99, max_txid_version=tv + 1)
    listed = await seg.list_segments(NS, S)
    assert [s for s, _ in listed] == [sealed, nxt]
    assert await md.streams.get_max_txid(NS, S) == (99, tv + 2)


async def test_transition_failing_halfway_changes_nothing(md: MetadataClient) -> None:
    seg = md.segments
    _txid, tv = await md.streams.get_max_txid(NS, S)
    first = SegmentMetadata(seqno=1, ledger_id=10, first_txid=0)
    await seg.open_segment(NS, S, first, max_txid=0, max_txid_version=tv)
    ((_, sv),) = await seg.list_segments(NS, S)
    # Another writer already created segment 2: the create step fails after the seal
    # step was queued, so the seal and the max txid bump must be rolled back too.
    await seg.open_segment(
        NS, S, SegmentMetadata(seqno=2, ledger_id=77), max_txid=5, max_txid_version=tv + 1
    )
    before = await snapshot(md)
    sealed = first.sealed(
        last_txid=9, last_entry_id=0, last_slot_id=9, record_count=10, size_bytes=10, sealed_ms=1
    )
    nxt = SegmentMetadata(seqno=2, ledger_id=11, first_txid=10)
    with pytest.raises(AlreadyExistsError):
        await seg.seal_and_open(NS, S, sealed, sv, nxt, max_txid=9, max_txid_version=tv + 2)
    assert await snapshot(md) == before
    # A stale max txid version (a fenced-out writer) also aborts the seal.
    with pytest.raises(BadVersionError):
        await seg.seal_and_open(NS, S, sealed, sv, None, max_txid=9, max_txid_version=tv)
    assert await snapshot(md) == before
    (seg1, _), _seg2 = await seg.list_segments(NS, S)
    assert seg1.state is SegmentState.IN_PROGRESS


async def test_a_segment_never_names_a_collected_ledger(md: MetadataClient) -> None:
    """Issue 22 (3): a writer's spare ledger may be collected as an orphan while the
    writer turns it into a segment; ZooKeeper decides which one wins, never both."""
    seg = md.segments
    _txid, tv = await md.streams.get_max_txid(NS, S)
    spare = SegmentMetadata(seqno=1, ledger_id=20)
    await md.zk.create(md.layout.ledger(20), b"", makepath=True)
    # The collector deletes the spare first: the segment can't be opened on it.
    await md.ledgers.delete(20)
    with pytest.raises(NotFoundError):
        await seg.open_segment(NS, S, spare, max_txid=0, max_txid_version=tv)
    assert await snapshot(md) == ([], (NO_TXID, tv))
    # The writer opens first: the collector's delete, decided on the max-txid version it
    # read before listing the segments, fails and the ledger stays.
    await md.zk.create(md.layout.ledger(21), b"", makepath=True)
    await seg.open_segment(
        NS, S, SegmentMetadata(seqno=1, ledger_id=21), max_txid=0, max_txid_version=tv
    )
    with pytest.raises(BadVersionError):
        await seg.delete_unreferenced_ledger(NS, S, 21, 0, tv)
    assert await md.ledgers.exists(21)
    # Nothing opened since it looked: an unreferenced ledger goes.
    await md.zk.create(md.layout.ledger(22), b"", makepath=True)
    await seg.delete_unreferenced_ledger(NS, S, 22, 0, (await md.streams.get_max_txid(NS, S))[1])
    assert not await md.ledgers.exists(22)


async def test_truncate_and_delete_segments_atomically(md: MetadataClient) -> None:
    seg = md.segments
    _txid, tv = await md.streams.get_max_txid(NS, S)
    for n in (1, 2, 3):
        await seg.open_segment(
            NS, S, SegmentMetadata(seqno=n, ledger_id=n), max_txid=n, max_txid_version=tv + n - 1
        )
    listed = await seg.list_segments(NS, S)
    updates = [
        (listed[0][0].with_truncation(TruncationState.TRUNCATED, (1, 0, 0)), listed[0][1]),
        (listed[1][0].with_truncation(TruncationState.PARTIALLY_TRUNCATED, (2, 5, 0)), 99),
    ]
    with pytest.raises(BadVersionError):
        await seg.mark_truncated(NS, S, updates)
    assert await seg.list_segments(NS, S) == listed
    updates[1] = (updates[1][0], listed[1][1])
    await seg.mark_truncated(NS, S, updates)
    after = await seg.list_segments(NS, S)
    assert after[0][0].truncation is TruncationState.TRUNCATED
    assert after[1][0].min_active_dlsn == (2, 5, 0)
    with pytest.raises(NotFoundError):
        await seg.delete_segments(NS, S, [(1, after[0][1]), (9, 0)])
    assert len(await seg.list_segments(NS, S)) == 3
    await seg.delete_segments(NS, S, [(1, after[0][1]), (2, after[1][1])])
    assert [s.seqno for s, _ in await seg.list_segments(NS, S)] == [3]


async def test_subscriptions_only_move_forward(clients: Clients, md: MetadataClient) -> None:
    subs = md.subscriptions
    assert await subs.read(NS, S, "reader") is None
    first = await subs.advance(NS, S, "reader", (1, 5, 0))
    assert first.advanced
    assert first.position == (1, 5, 0)
    back = await subs.advance(NS, S, "reader", (1, 2, 7))
    assert not back.advanced
    assert back.position == (1, 5, 0)
    assert not (await subs.advance(NS, S, "reader", (1, 5, 0))).advanced
    assert (await subs.advance(NS, S, "reader", (2, 0, 0))).advanced

    other = await clients.new()
    positions = [(3, e, 0) for e in range(20)]
    await asyncio.gather(
        *(
            (md if i % 2 else other).subscriptions.advance(NS, S, "reader", p)
            for i, p in enumerate(positions)
        )
    )
    assert await subs.read(NS, S, "reader") == (3, 19, 0)
    await subs.advance(NS, S, "audit", (0, 0, 0))
    assert await subs.list(NS, S) == {"audit": (0, 0, 0), "reader": (3, 19, 0)}
    await subs.delete(NS, S, "audit")
    assert list(await subs.list(NS, S)) == ["reader"]
    with pytest.raises(NotFoundError):
        await subs.advance(NS, "missing", "r", (1, 0, 0))
