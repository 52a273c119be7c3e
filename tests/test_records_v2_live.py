"""Issue 24 (1-4) through real processes: headers (ordered, repeated names, null
values), null values and timestamps (the producer's, or the log's on a LogAppendTime
stream) round-trip through the core writer and reader on real bookies, compressed sets
included; and a consumer-producer copy of a stream written through the write proxy
carries nothing internal, so a later write of the same producer to the copy is written,
not answered as a retry (the proxy's markers were ``bl.*`` headers that core readers
returned and copies carried, and a new owner rebuilt its table from them).
"""

from __future__ import annotations

import itertools
import os
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from bookline import LogRecord, Namespace, NamespaceConfig, StreamOptions
from ops.cluster.local import CLUSTER_ROOT, LocalCluster
from streams.records import CREATE_TIME, LOG_APPEND_TIME, ReadRecord
from tests.conftest import BookieCluster
from tests.test_proxy_integration import _wurls
from thinclient.routing import rendezvous

pytestmark = pytest.mark.integration

_names = itertools.count()
HEADERS = [("a", b"1"), ("a", b"2"), ("n", None), ("a", b"")]
PRODUCER_TS = 1_500_000_000_000  # long before the writer's clock: stored whole


@pytest.fixture(params=["none", "zstd"])
async def ns(
    bookie_cluster: BookieCluster, request: pytest.FixtureRequest
) -> AsyncIterator[Namespace]:
    config = NamespaceConfig(session_timeout_ms=4000, compression=request.param)
    name = f"rv2-{os.getpid()}-{next(_names)}"
    n = await Namespace.open(bookie_cluster.zk, bookie_cluster.root, name, config)
    try:
        yield n
    finally:
        await n.close()


async def _read_all(ns: Namespace, stream: str, count: int) -> list[ReadRecord]:
    reader = await ns.open_reader(stream)
    out: list[ReadRecord] = []
    try:
        while len(out) < count:
            batch = await reader.read_many(1000, timeout_s=20)
            assert batch, f"no record within 20 s after {len(out)} of {count}"
            out.extend(batch)
    finally:
        await reader.close()
    return out


def _records() -> list[LogRecord]:
    return [
        LogRecord(b"plain"),
        LogRecord(b"headed", key=b"k", headers=HEADERS),
        LogRecord(None, key=b"k"),  # a tombstone
        LogRecord(b"stamped", timestamp_ms=PRODUCER_TS),
        LogRecord(b"mapped", headers={"x": b"y"}),  # a mapping: kept as its pairs
    ]


async def test_headers_nulls_and_producer_timestamps_round_trip(ns: Namespace) -> None:
    await ns.create_stream("s")
    w = await ns.open_writer("s")
    before = await w.write_many(_records())  # one set, records with and without extras
    singles = [await w.write(r) for r in _records()]  # a set per record
    await w.close()
    recs = await _read_all(ns, "s", 10)
    assert [r.dlsn for r in recs] == [*before, *singles]
    for got in (recs[:5], recs[5:]):
        assert [(r.payload, r.key, r.headers) for r in got] == [
            (b"plain", None, None),
            (b"headed", b"k", HEADERS),
            (None, b"k", None),
            (b"stamped", None, None),
            (b"mapped", None, [("x", b"y")]),
        ]
        assert got[3].timestamp_ms == PRODUCER_TS
        assert all(r.timestamp_ms > PRODUCER_TS for r in got if r.payload != b"stamped")
        assert {r.timestamp_type for r in got} == {CREATE_TIME}
    # The unlocked entry read (what a write proxy's takeover scan uses) agrees.
    info = await ns.stream_info("s")
    seg = info.segments[0]
    assert await ns.read_entries("s", seg.seqno, 0, seg.last_entry_id) == recs


async def test_a_log_append_time_stream_stamps_every_record_itself(ns: Namespace) -> None:
    await ns.create_stream("lat", StreamOptions(timestamp_type="LogAppendTime"))
    w = await ns.open_writer("lat")
    await w.write_many([LogRecord(b"a", timestamp_ms=PRODUCER_TS), LogRecord(b"b")])
    await w.write(LogRecord(b"c", timestamp_ms=PRODUCER_TS))
    await w.close()
    recs = await _read_all(ns, "lat", 3)
    assert [r.payload for r in recs] == [b"a", b"b", b"c"]
    assert {r.timestamp_type for r in recs} == {LOG_APPEND_TIME}
    assert all(r.timestamp_ms > PRODUCER_TS for r in recs), "the producer's was overwritten"


async def test_a_record_with_a_reserved_header_is_refused_before_anything_is_written(
    ns: Namespace,
) -> None:
    from foundation.errors import BadRequestError

    await ns.create_stream("res")
    w = await ns.open_writer("res")
    with pytest.raises(BadRequestError, match="reserved"):
        await w.write_many([LogRecord(b"a"), LogRecord(b"b", headers=[("bl.seq", b"1")])])
    with pytest.raises(BadRequestError):
        await w.write(LogRecord(b"c", timestamp_ms=-5))
    await w.write(LogRecord(b"d"))  # the writer still works
    await w.close()
    assert [r.payload for r in await _read_all(ns, "res", 1)] == [b"d"]


# -- a consumer-producer copy through the write proxy --------------------------------


@pytest.fixture
async def core(proxy_cluster: LocalCluster) -> AsyncIterator[Namespace]:
    ns = await Namespace.open(
        proxy_cluster.zk_connect, CLUSTER_ROOT, "default", NamespaceConfig(session_timeout_ms=4000)
    )
    try:
        yield ns
    finally:
        await ns.close()


async def _produce(cluster: LocalCluster, stream: str, body: dict[str, Any]) -> dict[str, Any]:
    owner = rendezvous(stream, _wurls(cluster))
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{owner}/v1/streams/{stream}/records", json=body) as resp,
    ):
        answer: dict[str, Any] = await resp.json()
        assert resp.status == 200, answer
        return answer


async def test_a_copied_stream_carries_no_markers_and_its_producer_writes_are_not_retries(
    proxy_cluster: LocalCluster, core: Namespace
) -> None:
    uid = uuid.uuid4().hex[:8]
    src, dst, producer = f"copy-src-{uid}", f"copy-dst-{uid}", f"p-{uid}"
    first = {"producer": producer, "seq": 0, "payloads": ["a", "b", "c"]}
    await _produce(proxy_cluster, src, first)
    copied = await _read_all(core, src, 3)
    assert [(r.payload, r.headers) for r in copied] == [(b"a", None), (b"b", None), (b"c", None)]
    # The consumer-producer loop (what a Spark copy does): records as read, written again.
    await core.create_stream(dst)
    w = await core.open_writer(dst)
    await w.write_many([LogRecord(r.payload, key=r.key, headers=r.headers) for r in copied])
    await w.close()
    # The same producer now writes to the copy: the proxy that takes the stream over
    # rebuilds its table from the copy's tail, which must hold no marker of it.
    answer = await _produce(proxy_cluster, dst, {"producer": producer, "seq": 0, "payloads": ["d"]})
    assert not answer.get("duplicates"), f"a new write was answered as a retry: {answer}"
    got = await _read_all(core, dst, 4)
    assert [r.payload for r in got] == [b"a", b"b", b"c", b"d"]
    assert all(r.headers is None for r in got)
    # And a real retry of that write is still one (the marker is in the framing).
    again = await _produce(proxy_cluster, dst, {"producer": producer, "seq": 0, "payloads": ["d"]})
    assert again.get("duplicates") == 1
