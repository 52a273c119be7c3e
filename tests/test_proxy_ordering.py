"""Pipelined writes of one producer reach the owning proxy in any order; the stream
keeps the producer's sequence order. OwnedStream with a fake writer: no I/O."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, cast

import pytest

from foundation.errors import BadRequestError, OutOfOrderSequenceError, ProducerFencedError
from serving.write import dedup
from serving.write.batch import ProducerSeq, WriteBatch
from serving.write.dedup import DedupTable
from serving.write.owned import OwnedStream
from streams.dlsn import DLSN
from streams.records import LogRecord, RecordColumns
from tests.fake_writer import AppendsOnTaskStart
from tests.values import values
from tests.waiting import wait_for


class FakeWriter(AppendsOnTaskStart):
    """Appends at call time (as LogWriter.write_many does before it suspends) and
    acknowledges a moment later, in order."""

    def __init__(self, ack_delay_s: float = 0.01) -> None:
        self.log: list[bytes] = []
        self.handed: list[Sequence[LogRecord]] = []  # every call's argument
        self.ack_delay_s = ack_delay_s

    async def write_many_offsets(
        self, records: Sequence[LogRecord]
    ) -> tuple[list[DLSN], list[int]]:
        self.handed.append(records)
        first = len(self.log)
        self.log.extend(values(records))
        await asyncio.sleep(self.ack_delay_s)  # the simulated acknowledgement time
        n = len(records)
        return [DLSN(1, first + i, 0) for i in range(n)], list(range(first, first + n))


def stream(wait_s: float = 1.0, ack_delay_s: float = 0.01) -> tuple[OwnedStream, FakeWriter]:
    writer = FakeWriter(ack_delay_s)
    table = DedupTable(batches_per_producer=16, producers_max=100)
    return OwnedStream("s", cast(Any, writer), table, reorder_wait_s=wait_s), writer


def req(seq: int, *payloads: bytes, producer: str = "p", epoch: int = 0) -> WriteBatch:
    return WriteBatch("s", ProducerSeq(producer, seq, epoch), payloads=list(payloads))


async def test_requests_arriving_out_of_order_are_appended_in_sequence_order() -> None:
    owned, writer = stream()
    later = asyncio.ensure_future(owned.write(req(2, b"c", b"d")))
    last = asyncio.ensure_future(owned.write(req(4, b"e")))
    await asyncio.sleep(0.05)  # behaviour: nothing is appended meanwhile
    assert writer.log == []  # both wait for sequence 0
    first = await owned.write(req(0, b"a", b"b"))
    assert [d.entry_id for d in first[0]] == [0, 1]
    assert [d.entry_id for d in (await later)[0]] == [2, 3]
    assert [d.entry_id for d in (await last)[0]] == [4]
    assert writer.log == [b"a", b"b", b"c", b"d", b"e"]


async def test_a_batch_reaches_the_writer_as_the_requests_columns() -> None:
    """Issue 23: the write core hands its writer the request's payload list itself,
    the producer's marker beside it (issue 24: in the record framing, not the first
    record's headers), no record object per record; the records are those the log
    held before."""
    owned, writer = stream()
    payloads = [b"a", b"b", b"c"]
    await owned.write(WriteBatch("s", ProducerSeq("p", 0, 2), payloads=payloads))
    await owned.write(WriteBatch("s", ProducerSeq("p", 0, 2), payloads=payloads))  # retry
    [handed] = writer.handed  # the retry was answered from the table
    assert isinstance(handed, RecordColumns)
    assert handed.payloads is payloads
    assert handed.marker == dedup.Marker("p", 2, 0, 3)
    assert handed.headers is None and handed.keys is None and handed.txids is None
    assert list(handed) == [LogRecord(b"a"), LogRecord(b"b"), LogRecord(b"c")]


async def test_a_partly_retried_batch_hands_on_only_the_new_records() -> None:
    owned, writer = stream()
    await owned.write(WriteBatch("s", ProducerSeq("p", 0), payloads=[b"a"], keys=[b"k"]))
    batch = WriteBatch("s", ProducerSeq("p", 0), payloads=[b"a", b"b"], keys=[b"k", None])
    dlsns, offsets, dups = await owned.write(batch)
    assert dups == 1 and writer.log == [b"a", b"b"]
    handed = writer.handed[-1]
    assert isinstance(handed, RecordColumns) and handed.marker == dedup.Marker("p", 0, 1, 1)
    assert list(handed) == [LogRecord(b"b", key=None)]
    assert len(dlsns) == len(offsets) == 2


async def test_a_pipelined_request_follows_an_unacknowledged_one_at_once() -> None:
    owned, writer = stream()
    first = asyncio.ensure_future(owned.write(req(0, b"a")))
    await asyncio.sleep(0)  # one turn: the first is handed to the writer
    second = asyncio.ensure_future(owned.write(req(1, b"b")))
    await asyncio.sleep(0.001)  # behaviour: well within the first's 10 ms acknowledgement
    assert writer.log == [b"a", b"b"]  # the second did not wait for the first's ack
    await asyncio.gather(first, second)


async def test_a_gap_that_never_fills_is_refused_retriably() -> None:
    owned, writer = stream(wait_s=0.05)
    await owned.write(req(0, b"a"))
    with pytest.raises(OutOfOrderSequenceError) as info:
        await owned.write(req(5, b"x"))
    assert info.value.retriable
    assert writer.log == [b"a"]
    await owned.write(req(1, b"b"))  # the producer goes on in order
    assert writer.log == [b"a", b"b"]


async def test_retries_are_still_answered_with_their_dlsns() -> None:
    owned, writer = stream()
    dlsns, offsets, dups = await owned.write(req(0, b"a", b"b"))
    again, again_offsets, dups = await owned.write(req(0, b"a", b"b"))
    assert (again, again_offsets, dups) == (dlsns, offsets, 2)
    assert writer.log == [b"a", b"b"]


async def test_a_forgotten_producer_goes_on_after_the_wait() -> None:
    """After a takeover whose log scan did not reach the producer's last write, its
    next request (sequence 40) is accepted once the gap wait is over."""
    owned, writer = stream(wait_s=0.05)
    dlsns, _offsets, _dups = await owned.write(req(40, b"z"))
    assert writer.log == [b"z"]
    assert len(dlsns) == 1


async def test_a_request_later_than_the_order_it_belongs_to_is_refused() -> None:
    owned, writer = stream(wait_s=0.02, ack_delay_s=0.5)
    later = asyncio.ensure_future(owned.write(req(3, b"d")))  # accepted after the wait
    # Appended (not acknowledged yet: that takes 0.5 s).
    await wait_for(lambda: writer.log == [b"d"], "d appended after the reorder wait")
    with pytest.raises(BadRequestError, match="too late"):
        await owned.write(req(1, b"b"))
    await later
    assert writer.log == [b"d"]


async def test_producers_in_flight_only_are_tracked() -> None:
    """The per-producer sequence map does not grow with every producer ever seen."""
    owned, writer = stream()
    for i in range(50):
        await owned.write(req(0, b"x", producer=f"p{i}"))
    assert owned._next_pos == {}
    assert len(writer.log) == 50
    await owned.write(req(1, b"y", producer="p7"))  # still ordered through the table
    owned._reorder_wait_s = 0.02
    with pytest.raises(OutOfOrderSequenceError):
        await owned.write(req(5, b"z", producer="p7"))


# -- producer epochs (issue 12 defect 6) -------------------------------------------------


async def test_a_new_epoch_starts_at_zero_and_fences_the_old_one() -> None:
    """After a failed batch the producer bumps its epoch: the new epoch goes at once,
    and an old-epoch request still waiting for its gap is refused, never appended."""
    owned, writer = stream(wait_s=1.0)
    await owned.write(req(0, b"a"))
    stuck = asyncio.ensure_future(owned.write(req(2, b"c")))  # seq 1 failed for good
    await asyncio.sleep(0.05)  # behaviour: it waits for its gap when the new epoch comes
    await owned.write(req(0, b"x", epoch=1))
    with pytest.raises(ProducerFencedError):
        await stuck
    await owned.write(req(1, b"y", epoch=1))
    assert writer.log == [b"a", b"x", b"y"]


async def test_a_late_old_epoch_request_is_not_appended_after_the_new_epoch() -> None:
    owned, writer = stream(ack_delay_s=0.2)
    await owned.write(req(0, b"a"))
    newer = asyncio.ensure_future(owned.write(req(0, b"x", epoch=1)))
    await asyncio.sleep(0.01)  # handed to the writer, not acknowledged yet
    with pytest.raises(ProducerFencedError):
        await owned.write(req(1, b"b"))
    retry, _offsets, dups = await owned.write(req(0, b"a"))  # a written record: still answered
    assert dups == 1
    assert retry == [DLSN(1, 0, 0)]
    await newer
    assert writer.log == [b"a", b"x"]


async def test_a_new_epochs_requests_keep_their_order() -> None:
    owned, writer = stream()
    await owned.write(req(0, b"a"))
    later = asyncio.ensure_future(owned.write(req(1, b"y", epoch=3)))
    await asyncio.sleep(0.02)  # behaviour: nothing is appended meanwhile
    assert writer.log == [b"a"]  # waits for the new epoch's sequence 0
    await owned.write(req(0, b"x", epoch=3))
    await later
    assert writer.log == [b"a", b"x", b"y"]


class _AppendingWriter:
    """Appends as LogWriter.append_many_offsets does -- at once -- and acknowledges
    when the test says."""

    def __init__(self) -> None:
        self.log: list[bytes] = []
        self.acks: list[tuple[asyncio.Future[Any], int, int]] = []

    async def append_many_offsets(self, records: Sequence[LogRecord]) -> asyncio.Future[Any]:
        first = len(self.log)
        self.log.extend(values(records))
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.acks.append((fut, first, len(records)))
        return fut

    async def write_many_offsets(self, records: Sequence[LogRecord]) -> Any:
        return await (await self.append_many_offsets(records))

    def ack(self) -> None:
        for fut, first, n in self.acks:
            dlsns = [DLSN(1, first + i, 0) for i in range(n)]
            fut.set_result((dlsns, list(range(first, first + n))))


async def test_a_batch_is_in_the_writer_before_its_request_first_waits() -> None:
    """No task of its own between the request and the writer (issue 25): the batch is
    appended in the request's first step, and its answer follows the acknowledgement
    in the two loop turns of waiting on it (or the stream's abort) -- not three more."""
    writer = _AppendingWriter()
    owned = OwnedStream("s", cast(Any, writer), DedupTable(16, 100), reorder_wait_s=1.0)
    task = asyncio.ensure_future(owned.write(req(0, b"a", b"b")))
    await asyncio.sleep(0)  # the request's first step
    assert writer.log == [b"a", b"b"]
    assert not task.done()
    writer.ack()
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert task.done()
    assert task.result().offsets == [0, 1]
