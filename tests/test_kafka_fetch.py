"""The Kafka Fetch path over the read core, against a fake namespace (issue 25's
consume-side targets): what made a librdkafka consumer read 3,500 records/s.

* A page cut short by its bytes keeps the records read past it with its reader, so the
  consumer's next fetch continues with the same reader instead of opening another (which
  began its read-ahead from nothing: every 1 MiB fetch did).
* The asked partitions are read at once: one whose bookies are slow does not hold the
  others' reads back.
* A partition's high watermark and log start offset come from the offsets last looked
  up; a fetch does not wait for a new look-up (a stream's LAC read, up to the read
  timeout while an idle writer's last LAC lags), which runs in the background.
* A partition at its end answers at once: the fetch long-polls on the feeds, so the
  HTTP read's end-of-stream grace only delayed every tailing fetch.
* The fetch answer's batch, encoded from the records' columns, is the batch
  ``encode_batch`` makes of the same records.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from types import SimpleNamespace
from typing import Any, TypeVar

import pytest

from kafkaapi.context import KafkaServing, Session
from kafkaapi.fetch import fetch
from kafkaapi.hosting import UncountedReads
from kafkaapi.protocol.apis_data import FETCH
from kafkaapi.protocol.messages import Request
from kafkaapi.protocol.records import (
    Record,
    RecordBatch,
    decode_batches,
    encode_batch,
    encode_columns,
)
from serving.read.config import ReadConfig
from serving.read.feeds import FeedRegistry
from serving.read.pages import Pages
from serving.read.partitions import fetch_partition, read_partition
from serving.read.readers import ReaderPool
from streams.dlsn import DLSN, StartPosition
from streams.reader_items import RawRecordSet
from streams.records import ReadRecord
from streams.recordset import encode_record_set
from tests.waiting import WAIT_S, scaled, wait_for

T = TypeVar("T")
TOPIC = "t"


SET_RECORDS = 10  # records per entry of the fake partitions


def _records(partition: int, count: int, size: int = 100) -> list[ReadRecord]:
    name = f"{TOPIC}~{partition}"
    return [
        ReadRecord(name, DLSN(1, i // SET_RECORDS, i % SET_RECORDS), i, i, 1_000 + i,
                   b"v" * size, b"k%d" % i)
        for i in range(count)
    ]  # fmt: skip


class _Reader:
    """A core reader over a list of records (streams.reader.LogReader as the pool uses
    it); ``gate``: its reads wait for it to be set."""

    def __init__(self, recs: list[ReadRecord], start: int, gate: asyncio.Event | None) -> None:
        self.recs, self.pos, self.gate = recs, start, gate
        self.reads_started = asyncio.Event()
        self.waits: list[float] = []  # the timeout_s of every read
        self.caught_up = False  # between two LAC polls, as a tailing reader often is
        self.settle_gate: asyncio.Event | None = None

    async def read_many(self, records_max: int, timeout_s: float | None = None) -> list[Any]:
        self.reads_started.set()
        self.waits.append(timeout_s or 0.0)
        if self.gate is not None:
            await self.gate.wait()
        if self.pos >= len(self.recs) and timeout_s:
            await asyncio.Event().wait()  # the end: a read waits out its timeout
        out = self.recs[self.pos : self.pos + records_max]
        self.pos += len(out)
        return out

    async def read_record_sets(self, bytes_max: int, timeout_s: float | None = None) -> list[Any]:
        """The records as stored sets of SET_RECORDS (entry i holds offsets 10i..),
        the first one from where the reader is; as :meth:`read_many` at the end."""
        self.reads_started.set()
        self.waits.append(timeout_s or 0.0)
        if self.gate is not None:
            await self.gate.wait()
        if self.pos >= len(self.recs) and timeout_s:
            await asyncio.Event().wait()
        out: list[RawRecordSet] = []
        while self.pos < len(self.recs) and sum(len(s.payload) for s in out) < bytes_max:
            entry = self.pos // SET_RECORDS
            recs = self.recs[entry * SET_RECORDS : (entry + 1) * SET_RECORDS]
            payload = encode_record_set(
                [r.payload for r in recs], [r.txid for r in recs], [r.timestamp_ms for r in recs],
                first_index=entry * SET_RECORDS, bytes_before=0, last_txid=recs[-1].txid,
                keys=[r.key for r in recs],
            )  # fmt: skip
            next_seq = entry * SET_RECORDS + len(recs)
            out.append(RawRecordSet(payload, 1, entry, 0, self.pos % SET_RECORDS, next_seq,
                                    len(recs)))  # fmt: skip
            self.pos = next_seq
        return out

    async def settle(self, timeout_s: float) -> None:
        if self.settle_gate is not None:  # still reading towards the tail
            await self.settle_gate.wait()

    async def close(self) -> None:
        return None


class _Namespace:
    """Partition streams of records; counts readers opened and offsets looked up."""

    def __init__(self, partitions: dict[int, list[ReadRecord]]) -> None:
        self.streams = {f"{TOPIC}~{p}": recs for p, recs in partitions.items()}
        self.opened: list[tuple[str, int]] = []
        self.readers: dict[str, _Reader] = {}  # the last opened of each stream
        self.every_reader: list[_Reader] = []
        self.gates: dict[str, asyncio.Event] = {}
        self.info_gate: asyncio.Event | None = None
        self.infos = 0

    async def exists(self, name: str) -> bool:
        return name in self.streams

    async def stream_info(self, name: str) -> Any:
        self.infos += 1
        if self.info_gate is not None:
            await self.info_gate.wait()
        return SimpleNamespace(next_sequence_id=len(self.streams[name]), first_sequence_id=0)

    async def open_reader(self, name: str, start: StartPosition, **_kw: Any) -> _Reader:
        self.opened.append((name, start.value))
        reader = _Reader(self.streams[name], start.value, self.gates.get(name))
        self.readers[name] = reader
        self.every_reader.append(reader)
        return reader


def _pages(ns: _Namespace, config: ReadConfig | None = None) -> Pages:
    config, metrics = config or ReadConfig(), UncountedReads()
    fake: Any = ns
    return Pages(fake, FeedRegistry(fake, config, metrics), ReaderPool(fake, config, metrics),
                 config, metrics)  # fmt: skip


def _serving(pages: Pages) -> KafkaServing:
    return KafkaServing("r", 1, ns=lambda: pages.ns, pages=lambda: pages, write=None,
                        authority=None)  # fmt: skip


def _fetch_request(offsets: dict[int, int], partition_bytes: int, wait_ms: int = 0) -> Request:
    parts = [{"partition": p, "fetch_offset": o, "partition_max_bytes": partition_bytes}
             for p, o in offsets.items()]  # fmt: skip
    body = {"max_wait_ms": wait_ms, "max_bytes": 50 << 20, "rack_id": "",
            "topics": [{"topic": TOPIC, "partitions": parts}]}  # fmt: skip
    return Request(FETCH, 12, 1, "test", body)


def _answered(answer: dict[str, Any]) -> dict[int, list[Record]]:
    parts = answer["responses"][0]["partitions"]
    return {p["partition_index"]: [r for b in decode_batches(p["records"]) for r in b.records]
            for p in parts}  # fmt: skip


async def _within_deadline(what: Awaitable[T]) -> T:
    """``what``, or a failure when it hangs (the deadline only bounds a broken build)."""
    return await asyncio.wait_for(what, scaled(WAIT_S))


async def test_a_page_cut_by_its_bytes_keeps_its_reader_for_the_next_page() -> None:
    """Before the fix the second page opened a second reader: the first one was kept
    at the offset after everything it had read, not where the page ended."""
    ns = _Namespace({0: _records(0, 500)})
    pages = _pages(ns, ReadConfig(read_bytes_max=10_000))
    first = await read_partition(pages, TOPIC, 0, 0, limit=300, wait_s=0.0)
    assert 0 < len(first) < 300  # cut by the bytes
    second = await read_partition(pages, TOPIC, 0, len(first), limit=300, wait_s=0.0)
    assert [r.sequence_id for r in first + second] == list(range(len(first) + len(second)))
    assert ns.opened == [(f"{TOPIC}~0", 0)]


async def test_consecutive_fetches_read_a_partition_with_one_reader() -> None:
    ns = _Namespace({0: _records(0, 3_000)})
    pages = _pages(ns)
    offset, got = 0, list[int]()
    while offset < 3_000:
        recs, sets = await fetch_partition(pages, TOPIC, 0, offset, limit=10_000, bytes_max=50_000)
        assert sets and not recs, f"no record sets from offset {offset}"
        got += range(offset, sets[-1].next_sequence_id)
        offset = sets[-1].next_sequence_id
    assert got == list(range(3_000))
    assert len(ns.opened) == 1


async def test_a_fetch_reads_its_partitions_at_once() -> None:
    """Partition 0's bookies answer only once partition 1's read has started: read one
    after the other (before the fix), the fetch never answered."""
    ns = _Namespace({0: _records(0, 50), 1: _records(1, 50)})
    pages = _pages(ns)
    ns.gates[f"{TOPIC}~0"] = slow = asyncio.Event()

    async def release_when_partition_1_reads() -> None:
        while f"{TOPIC}~1" not in ns.readers:
            await asyncio.sleep(0)  # a scheduling point, not a wait on time
        await ns.readers[f"{TOPIC}~1"].reads_started.wait()
        slow.set()

    releaser = asyncio.ensure_future(release_when_partition_1_reads())
    try:
        answer = await _within_deadline(
            fetch(_serving(pages), Session("test"), _fetch_request({0: 0, 1: 0}, 1 << 20))
        )
    finally:
        releaser.cancel()
    got = _answered(answer)
    assert [r.offset for r in got[0]] == list(range(50))
    assert [r.offset for r in got[1]] == list(range(50))


async def test_a_fetch_does_not_wait_for_offsets_it_already_knows() -> None:
    """After a partition's first fetch its end offsets are known: a look-up that hangs
    (the LAC read of an idle writer's stream) no longer holds the next fetch back."""
    ns = _Namespace({0: _records(0, 100)})
    pages = _pages(ns)
    serving = _serving(pages)
    first = _answered(await fetch(serving, Session("test"), _fetch_request({0: 0}, 5_000)))
    after = first[0][-1].offset + 1  # the consumer's next fetch: its reader is kept there
    assert after < 100
    ns.info_gate = asyncio.Event()  # every look-up from now on hangs
    answer = await _within_deadline(
        fetch(serving, Session("test"), _fetch_request({0: after}, 1 << 20))
    )
    part = answer["responses"][0]["partitions"][0]
    assert part["high_watermark"] == 100
    assert part["log_start_offset"] == 0
    assert [r.offset for r in _answered(answer)[0]] == list(range(after, 100))
    ns.info_gate.set()


async def test_the_offsets_a_fetch_answers_follow_the_partition() -> None:
    """The known offsets are looked up again in the background: records written after
    the first fetch show in a later fetch's high watermark."""
    ns = _Namespace({0: _records(0, 100)})
    pages = _pages(ns)
    serving = _serving(pages)
    await fetch(serving, Session("test"), _fetch_request({0: 0}, 0))
    ns.streams[f"{TOPIC}~0"] += _records(0, 150)[100:]

    async def high_watermark() -> int | None:
        answer = await fetch(serving, Session("test"), _fetch_request({0: 0}, 0))
        high = answer["responses"][0]["partitions"][0]["high_watermark"]
        return high if high == 150 else None

    assert await wait_for(high_watermark, "the high watermark of the 50 records added") == 150


async def test_a_partition_at_its_end_answers_without_the_readers_grace() -> None:
    """At the end, the private read gave the reader another 0.3 s (the HTTP read's
    grace, for a record acknowledged a moment ago) on every fetch, one partition after
    another; a Kafka fetch long-polls on the feeds instead."""
    ns = _Namespace({0: _records(0, 10)})
    pages, session = _pages(ns), Session("test")
    serving = _serving(pages)
    await fetch(serving, session, _fetch_request({0: 0}, 1 << 20))
    answer = await _within_deadline(fetch(serving, session, _fetch_request({0: 10}, 1 << 20)))
    assert _answered(answer) == {0: []}
    assert ns.readers[f"{TOPIC}~0"].waits[-1] == 0.0


async def test_a_consumer_at_a_feeds_head_is_answered_from_the_feed() -> None:
    """Once a long poll opened the partition's feed, a fetch at its head is answered
    from it (empty until the feed's pump reads more) even while the pump's reader is
    between two LAC polls; before the fix the fetch went to its private reader, which
    waited to reach the tail itself (1-2 s a fetch while tailing, loaded)."""
    ns = _Namespace({0: _records(0, 10)})
    pages, session = _pages(ns), Session("test")
    serving = _serving(pages)
    await fetch(serving, session, _fetch_request({0: 0}, 1 << 20))
    await fetch(serving, session, _fetch_request({0: 10}, 1 << 20, wait_ms=1))  # opens the feed
    assert pages.feeds.get(f"{TOPIC}~0") is not None
    for reader in ns.every_reader:
        reader.settle_gate = asyncio.Event()  # a private read would wait for the tail
    try:
        answer = await _within_deadline(fetch(serving, session, _fetch_request({0: 10}, 1 << 20)))
    finally:
        await pages.feeds.close()
    assert _answered(answer) == {0: []}


async def test_the_high_watermark_is_never_below_the_fetch_offset() -> None:
    """The end last looked up may trail a consumer that read the records after it: an
    empty answer at the consumer's offset says the log ends there, not before."""
    ns = _Namespace({0: _records(0, 10)})
    pages, session = _pages(ns), Session("test")
    serving = _serving(pages)
    await fetch(serving, session, _fetch_request({0: 0}, 1 << 20))
    ns.streams[f"{TOPIC}~0"] += _records(0, 20)[10:]
    read = await fetch(serving, session, _fetch_request({0: 10}, 1 << 20))
    assert [r.offset for r in _answered(read)[0]] == list(range(10, 20))
    answer = await fetch(serving, session, _fetch_request({0: 20}, 1 << 20))
    assert answer["responses"][0]["partitions"][0]["high_watermark"] >= 20


@pytest.mark.parametrize("headers", [(), (("h", b"x"), ("n", None))])
def test_a_batch_of_columns_is_the_batch_of_its_records(headers: tuple[Any, ...]) -> None:
    records = tuple(
        Record(1_000 + i, 5_000 + (i * 7919) % 40_000 - 20_000, None if i % 5 == 0 else b"k" * i,
               None if i % 7 == 0 else b"v" * (i * 97), headers)
        for i in range(200)
    )  # fmt: skip
    for log_append in (False, True):
        want = encode_batch(RecordBatch(1_000, records, log_append_time=log_append))
        got = encode_columns(
            [r.offset for r in records], [r.timestamp for r in records],
            [r.key for r in records], [r.value for r in records],
            [r.headers for r in records], log_append_time=log_append,
        )  # fmt: skip
        assert got == want
        assert decode_batches(got)[0].records == records
