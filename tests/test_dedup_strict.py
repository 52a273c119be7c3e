"""Issue 25 (kafka-idem): a Kafka producer's first sequence is accepted only where its
history in the stream says it follows. librdkafka reads a later batch's success as the
acknowledgement of every earlier one ("implicitly acked"), so a batch written over a
gap loses the records of the gap (chaos seed 23: sequence 1 of a new producer was
written after sequence 0 had failed); and it reads OUT_OF_ORDER_SEQUENCE_NUMBER as
"bump the epoch of every partition and number the unacknowledged records anew", which
wrote records again that were already stored (the duplicates of seeds 21-23). The
OwnedStream rules (:mod:`serving.write.owned`, :func:`serving.write.dedup.ahead_refusal`)
and what the Kafka listener answers for them (:mod:`kafkaapi.errormap`)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import pytest

from foundation.errors import (
    OutcomeUnknownError,
    OutOfOrderSequenceError,
    OwnershipLostError,
    UnavailableError,
    WriterFailedError,
)
from kafkaapi.context import Session
from kafkaapi.errormap import kafka_code
from kafkaapi.protocol.records import Record, RecordBatch, encode_batch
from serving.write import dedup
from serving.write.batch import ProducerSeq, WriteBatch
from serving.write.dedup import DedupTable, UnknownProducerError
from serving.write.owned import OwnedStream
from streams.dlsn import DLSN
from streams.records import LogRecord, RecordColumns
from tests.fake_writer import AppendsOnTaskStart
from tests.values import values

WAIT_S = 0.05  # the reorder wait: how long a request ahead of a gap waits for it


class Log:
    """The stream's log, shared by its successive owners' writers."""

    def __init__(self) -> None:
        self.values: list[bytes] = []
        self.markers: list[dedup.Marker | None] = []


class Writer(AppendsOnTaskStart):
    """Appends at call time; ``fail_after_append`` makes the next call fail after its
    records are in the log (a writer that failed before answering)."""

    def __init__(self, log: Log) -> None:
        self.log = log
        self.fail_after_append = False

    async def write_many_offsets(
        self, records: Sequence[LogRecord]
    ) -> tuple[list[DLSN], list[int]]:
        first = len(self.log.values)
        marker = records.marker if isinstance(records, RecordColumns) else None
        self.log.values.extend(values(records))
        self.log.markers.extend([marker] + [None] * (len(records) - 1))
        await asyncio.sleep(0)
        if self.fail_after_append:
            raise WriterFailedError("bookies gone before the answer")
        n = len(records)
        return [DLSN(1, first + i, 0) for i in range(n)], list(range(first, first + n))


@dataclass
class _At:
    dlsn: tuple[int, int, int]
    sequence_id: int


def take_over(log: Log) -> OwnedStream:
    """A new owner: its table rebuilt from the whole log (as a takeover whose scan read
    the stream from its start)."""
    table = DedupTable(batches_per_producer=16, producers_max=100, complete=True)
    tail = [(_At((1, i, 0), i), m) for i, m in enumerate(log.markers)]
    dedup.rebuild(table, tail)
    return OwnedStream("s", cast(Any, Writer(log)), table, reorder_wait_s=WAIT_S)


def kafka(seq: int, *payloads: bytes, epoch: int = 0) -> WriteBatch:
    return WriteBatch("s", ProducerSeq("kafka:7", seq, epoch, strict=True), payloads=list(payloads))


def code(exc: Exception) -> str:
    return kafka_code(cast(Any, exc)).name


async def test_a_new_producers_sequence_1_is_refused_while_0_is_not_written() -> None:
    """Chaos seed 23's loss: sequence 0 failed at the old owner, sequence 1 reached the
    re-acquired stream. Refused, "not written, resend", and written once 0 is."""
    log = Log()
    owned = take_over(log)
    with pytest.raises(OutOfOrderSequenceError) as info:
        await owned.write(kafka(1, b"b"))
    assert log.values == []
    assert info.value.retriable
    assert code(info.value) == "NOT_LEADER_OR_FOLLOWER"  # not persisted: same sequence again
    await owned.write(kafka(0, b"a"))
    _dlsns, offsets, _dups = await owned.write(kafka(1, b"b"))
    assert offsets == [1] and log.values == [b"a", b"b"]


async def test_a_producer_the_table_may_have_forgotten_gets_unknown_producer_id() -> None:
    """A takeover that scanned only the log's recent tail: the producer may have written
    long ago (its state is gone) or never. Nothing written; librdkafka starts a new epoch
    at 0 when nothing else is outstanding, and fails rather than guess otherwise."""
    log = Log()
    owned = OwnedStream("s", cast(Any, Writer(log)), DedupTable(16, 100), reorder_wait_s=WAIT_S)
    with pytest.raises(UnknownProducerError) as info:
        await owned.write(kafka(40, b"z"))
    assert log.values == []
    assert code(info.value) == "UNKNOWN_PRODUCER_ID"
    await owned.write(kafka(0, b"z", epoch=1))  # the producer's new epoch
    assert log.values == [b"z"]


async def test_a_thin_client_producer_still_goes_on_where_its_history_was_forgotten() -> None:
    log = Log()
    owned = OwnedStream("s", cast(Any, Writer(log)), DedupTable(16, 100), reorder_wait_s=WAIT_S)
    batch = WriteBatch("s", ProducerSeq("p", 40), payloads=[b"z"])
    await owned.write(batch)
    assert log.values == [b"z"]


async def test_a_gap_in_an_epoch_is_refused_and_written_once_filled() -> None:
    log = Log()
    owned = take_over(log)
    await owned.write(kafka(0, b"a"))
    with pytest.raises(OutOfOrderSequenceError) as info:
        await owned.write(kafka(2, b"c"))
    assert code(info.value) == "NOT_LEADER_OR_FOLLOWER"
    assert log.values == [b"a"]
    await owned.write(kafka(1, b"b"))
    await owned.write(kafka(2, b"c"))
    assert log.values == [b"a", b"b", b"c"]


async def test_a_new_epoch_not_at_sequence_0_is_refused() -> None:
    log = Log()
    owned = take_over(log)
    await owned.write(kafka(0, b"a"))
    with pytest.raises(OutOfOrderSequenceError, match="not 0"):
        await owned.write(kafka(3, b"x", epoch=1))
    assert log.values == [b"a"]
    await owned.write(kafka(0, b"x", epoch=1))
    assert log.values == [b"a", b"x"]


async def test_a_stored_batch_whose_answer_was_lost_is_never_written_again() -> None:
    """The writer failed after the batch was in the log: answered REQUEST_TIMED_OUT
    (possibly persisted: librdkafka retries it with the same sequence). At the next
    owner the batch pipelined behind it follows it at once (no gap: no epoch bump that
    would number the stored records anew), and the retry gets the original offsets."""
    log = Log()
    first = take_over(log)
    cast(Writer, first.writer).fail_after_append = True
    with pytest.raises(OutcomeUnknownError) as info:
        await first.write(kafka(0, b"a", b"b"))
    assert code(info.value) == "REQUEST_TIMED_OUT"
    nxt = take_over(log)
    _d, behind, _dups = await nxt.write(kafka(2, b"c"))
    _d, retried, dups = await nxt.write(kafka(0, b"a", b"b"))
    assert (behind, retried, dups) == ([2], [0, 1], 2)
    assert log.values == [b"a", b"b", b"c"]


async def test_a_request_refused_before_the_writer_is_not_persisted_to_kafka() -> None:
    """Only a write known not to be stored gets an answer librdkafka reads as "not
    persisted"; a write handed to a failed writer gets REQUEST_TIMED_OUT."""
    assert code(OwnershipLostError("writer failed; retry")) == "NOT_LEADER_OR_FOLLOWER"
    assert code(UnavailableError("stopping")) == "NOT_LEADER_OR_FOLLOWER"
    assert code(OutcomeUnknownError("maybe")) == "REQUEST_TIMED_OUT"


def test_the_refusal_rules() -> None:
    """:func:`dedup.ahead_refusal`: what a request ahead of its producer's next position
    gets once the wait is over."""

    def refusal(pos: tuple[int, int], expected: tuple[int, int] | None, **kw: bool) -> Any:
        got = dedup.ahead_refusal("p", "s", pos, expected, **kw)
        return None if got is None else type(got)

    strict_whole = {"strict": True, "complete": True}
    strict_part = {"strict": True, "complete": False}
    thin = {"strict": False, "complete": False}
    assert refusal((0, 5), (0, 3), **thin) is OutOfOrderSequenceError  # a gap
    assert refusal((1, 2), (0, 3), **strict_whole) is OutOfOrderSequenceError  # new epoch
    assert refusal((0, 1), None, **strict_whole) is OutOfOrderSequenceError  # never wrote
    assert refusal((0, 1), None, **strict_part) is UnknownProducerError  # maybe forgotten
    assert refusal((0, 40), None, **thin) is None  # the thin client goes on from here


def test_a_table_that_forgets_a_producer_is_no_longer_complete() -> None:
    table = DedupTable(batches_per_producer=4, producers_max=1, complete=True)
    table.record("a", 0, 0, [(1, 0, 0)], [0])
    assert table.complete
    table.record("b", 0, 0, [(1, 1, 0)], [1])  # "a" forgotten
    assert not table.complete


async def test_a_produce_over_the_admission_limits_is_retried_not_failed() -> None:
    """A batch refused by the write core's admission limits (nothing written) gets an
    error librdkafka retries with the same sequence (NOT_ENOUGH_REPLICAS: retriable,
    not persisted), not THROTTLING_QUOTA_EXCEEDED, which it takes as a permanent
    failure: the records fail and it bumps the producer's epoch, numbering anew the
    records of its other partitions that may be stored."""
    from types import SimpleNamespace

    from foundation.errors import TooManyRequestsError
    from kafkaapi.produce import produce

    def admit(stream: str, size: int) -> Any:
        raise TooManyRequestsError(f"{stream}: {size} bytes over the pending limit")

    serving = SimpleNamespace(write=SimpleNamespace(admit=admit), allowed=lambda *a: True)
    body = {"transactional_id": None, "acks": -1, "timeout_ms": 30_000, "topic_data": [
        {"name": "t", "partition_data": [{"index": 0, "records": b"x"}]}]}  # fmt: skip
    answer = await produce(
        cast(Any, serving), Session("test"), cast(Any, SimpleNamespace(body=body))
    )
    assert answer is not None
    part = answer["responses"][0]["partition_responses"][0]
    assert part["error_code"] == 19 and part["base_offset"] == -1  # NOT_ENOUGH_REPLICAS


def test_a_takeover_knows_when_it_read_the_whole_stream() -> None:
    """Only then does "producer not in the table" mean "never wrote here"."""
    from serving.write.ownership import _whole
    from streams.vocabulary import SegmentInfo

    def seg(start: int, last: int, count: int, **kw: Any) -> SegmentInfo:
        return SegmentInfo(1, 1, "sealed", 0, 0, last, count, start, 10, 0,
                           kw.get("truncated", False), kw.get("min_active"))  # fmt: skip

    assert _whole([])
    assert _whole([seg(0, 4, 5), seg(5, -1, 0)])  # the new owner's segment is empty
    assert not _whole([seg(5, 4, 5)])  # older segments deleted by retention
    assert not _whole([seg(0, 4, 5, truncated=True), seg(5, 4, 5)])
    assert not _whole([seg(0, 4, 5, min_active=DLSN(1, 2, 0))])
    assert not _whole([seg(0, -1, 5), seg(5, -1, 0)])  # records the scan cannot read


async def test_a_produce_failed_by_the_server_is_retried_not_failed() -> None:
    """Chaos seed 21 after the first fix: taking a partition over failed (its log's
    tail unreadable: a damaged replica awaiting repair, the others down) and Produce
    answered UNKNOWN_SERVER_ERROR, a permanent failure to librdkafka, which then bumped
    the producer's epoch ("message sequence gap") and wrote its stored but
    unacknowledged records of other partitions again (38 duplicates). Now
    KAFKA_STORAGE_ERROR: nothing was written, retried with the same sequence."""
    from types import SimpleNamespace

    from foundation.errors import ChecksumError
    from kafkaapi.produce import produce

    class Write:
        def admit(self, stream: str, size: int) -> Any:
            return contextlib.nullcontext(None)

        async def write(self, admission: Any, batch: Any) -> Any:
            raise ChecksumError("read of ledger 15 entry 43: all replicas failed")

    async def partition_for_write(topic: str, index: int) -> None:
        return None

    topics = SimpleNamespace(partition_for_write=partition_for_write)
    serving = SimpleNamespace(write=Write(), allowed=lambda *a: True, topics=topics)
    raw = encode_batch(RecordBatch(0, (Record(0, 0, b"k", b"v"),), producer_id=7,
                                   producer_epoch=0, base_sequence=0))  # fmt: skip
    body = {"transactional_id": None, "acks": -1, "timeout_ms": 30_000, "topic_data": [
        {"name": "t", "partition_data": [{"index": 0, "records": raw}]}]}  # fmt: skip
    answer = await produce(
        cast(Any, serving), Session("test"), cast(Any, SimpleNamespace(body=body))
    )
    assert answer is not None
    part = answer["responses"][0]["partition_responses"][0]
    assert part["error_code"] == 56 and part["base_offset"] == -1  # KAFKA_STORAGE_ERROR


async def test_a_batch_is_reported_handed_when_it_takes_its_place_not_when_answered() -> None:
    """``WriteBatch.on_handed``: called once the batch is in the writer (a front end then
    lets the producer's next batch follow, kafkaapi.produce), before the writer's
    answer; never for a retry answered from the table."""
    log = Log()
    owned = take_over(log)
    handed: list[int] = []

    def batch(seq: int) -> WriteBatch:
        producer = ProducerSeq("kafka:7", seq, 0, strict=True)
        return WriteBatch("s", producer, payloads=[b"v%d" % seq],
                          on_handed=lambda: handed.append(len(log.values)))  # fmt: skip

    first = asyncio.ensure_future(owned.write(batch(0)))
    await asyncio.sleep(0)  # the behaviour under test: its first step, up to the writer
    assert handed == [0] and not first.done()  # handed before the record is appended
    assert (await first).offsets == [0]
    await owned.write(batch(0))  # a retry: answered from the table
    assert handed == [0]
    await owned.write(batch(1))
    assert handed == [0, 1] and log.values == [b"v0", b"v1"]
