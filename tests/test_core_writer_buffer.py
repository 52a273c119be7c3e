"""The writer's record buffer (streams.writer.buffer), pure: no cluster, one event loop.

Records of single writes and write_many slices share one buffer in order; acknowledging
the entry hands every waiter its DLSNs (slots follow from the order); failing it hands
every waiter a chained error.
"""

from __future__ import annotations

import asyncio

import pytest

from foundation.errors import WriterFailedError
from streams.dlsn import DLSN
from streams.records import RECORD_OVERHEAD_BYTES, LogRecord, RecordColumns
from streams.writer.buffer import Batch, RecordBuffer


def _size(record: LogRecord) -> int:
    return len(record.payload or b"") + RECORD_OVERHEAD_BYTES


async def test_single_writes_and_batches_get_their_slots_in_order() -> None:
    loop = asyncio.get_running_loop()
    buf = RecordBuffer(loop.create_future())
    first: asyncio.Future[DLSN] = loop.create_future()
    buf.append_one(LogRecord(b"a"), 10, 1000, first, _size(LogRecord(b"a")))
    records = [LogRecord(b"b"), LogRecord(b"c"), LogRecord(b"d")]
    batch_fut: asyncio.Future[list[DLSN]] = loop.create_future()
    batch = Batch(batch_fut, 3)
    payloads = [r.payload for r in records]
    # the batch is split around a single write, as write_many does at a buffer cut
    cols = RecordColumns.of(records)
    buf.append_many(cols, payloads, [11, 12, 13], 1001, batch, 0, 2, 2 * _size(records[0]))
    last: asyncio.Future[DLSN] = loop.create_future()
    buf.append_one(LogRecord(b"e"), 14, 1002, last, _size(LogRecord(b"e")))
    buf.append_many(cols, payloads, [11, 12, 13], 1001, batch, 2, 3, _size(records[0]))
    assert buf.payloads == [b"a", b"b", b"c", b"e", b"d"]
    assert buf.txids == [10, 11, 12, 14, 13]
    assert buf.timestamps == [1000, 1001, 1001, 1002, 1001]
    assert buf.keys is None  # no record had a key: the encoder's fast path
    assert buf.nbytes == 5 * (1 + RECORD_OVERHEAD_BYTES)
    assert len(buf.waiters) == 4  # bare futures and (batch, count) slices, no per-record tuple

    assert buf.resolve(seqno=2, entry_id=7) == 5
    assert first.result() == DLSN(2, 7, 0)
    assert last.result() == DLSN(2, 7, 3)
    assert batch_fut.result() == [DLSN(2, 7, 1), DLSN(2, 7, 2), DLSN(2, 7, 4)]


async def test_keys_and_headers_start_when_a_record_has_one() -> None:
    loop = asyncio.get_running_loop()
    buf = RecordBuffer(loop.create_future())
    plain, keyed = LogRecord(b"x"), LogRecord(b"y", key=b"k", headers={"h": b"v"})
    buf.append_one(plain, 1, 0, loop.create_future(), _size(plain))
    buf.append_one(keyed, 2, 0, loop.create_future(), _size(keyed))
    buf.append_one(plain, 3, 0, loop.create_future(), _size(plain))
    assert buf.keys == [None, b"k", None]
    assert buf.headers == [None, [("h", b"v")], None]


async def test_a_batch_whose_first_record_has_headers_is_buffered_as_slices() -> None:
    """A write proxy's producer batch (issue 23): the marker on the first record
    starts the key and header columns; the rest of the batch goes in as slices."""
    loop = asyncio.get_running_loop()
    buf = RecordBuffer(loop.create_future())
    payloads: list[bytes | None] = [b"a", b"b", b"c"]
    cols = RecordColumns(payloads, headers=[{"bl.seq": b"1"}, None, None])
    batch = Batch(loop.create_future(), 3)
    buf.append_many(cols, payloads, [5, 5, 5], 0, batch, 0, 3, 3 * (1 + RECORD_OVERHEAD_BYTES))
    assert buf.payloads == payloads
    assert buf.keys == [None, None, None]
    assert buf.headers == [{"bl.seq": b"1"}, None, None]


async def test_failing_hands_every_waiter_a_chained_error() -> None:
    loop = asyncio.get_running_loop()
    buf = RecordBuffer(loop.create_future())
    single: asyncio.Future[DLSN] = loop.create_future()
    buf.append_one(LogRecord(b"a"), 1, 0, single, _size(LogRecord(b"a")))
    batch_fut: asyncio.Future[list[DLSN]] = loop.create_future()
    records = [LogRecord(b"b")]
    cols = RecordColumns.of(records)
    buf.append_many(cols, [b"b"], [2], 0, Batch(batch_fut, 1), 0, 1, _size(records[0]))
    error = WriterFailedError("entry failed")
    buf.fail(error)
    for fut in (single, batch_fut, buf.done):
        with pytest.raises(WriterFailedError) as info:
            fut.result()
        assert info.value is not error  # each caller its own exception...
        assert info.value.__cause__ is error  # ...caused by the writer's


async def test_a_tagged_write_tags_every_record_of_each_slice_and_no_other() -> None:
    """Issue 24 (1): ``RecordColumns.tag`` (the Spark sink's origin tag) lands on every
    record of the write, whatever slices it is buffered in; a single write around it
    stays untagged, and the keys/headers columns are not started for it."""
    loop = asyncio.get_running_loop()
    buf = RecordBuffer(loop.create_future())
    payloads: list[bytes | None] = [b"a", b"b", b"c"]
    cols = RecordColumns(payloads, tag=b"q:1:r:0")
    batch = Batch(loop.create_future(), 3)
    buf.append_many(cols, payloads, [5, 5, 5], 0, batch, 0, 2, 2 * (1 + RECORD_OVERHEAD_BYTES))
    buf.append_one(LogRecord(b"x"), 6, 0, loop.create_future(), _size(LogRecord(b"x")))
    buf.append_many(cols, payloads, [5, 5, 5], 0, batch, 2, 3, 1 + RECORD_OVERHEAD_BYTES)
    assert buf.payloads == [b"a", b"b", b"x", b"c"]
    assert buf.tags == {0: b"q:1:r:0", 1: b"q:1:r:0", 3: b"q:1:r:0"}
    assert buf.keys is None and buf.markers is None
