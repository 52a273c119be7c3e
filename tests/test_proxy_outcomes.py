"""What a write proxy answers when it cannot know whether records are in the log.

Issue 12 defect 7: a retry whose first attempt was handed to a writer that then failed
was answered 400 "arrived too late for the producer's order to be kept" -- a definite
failure -- although ten of its eleven records were in the log. The rule: the answer
to a retry is the records' original positions once known, or a retriable
OUTCOME_UNKNOWN until then; never a definite failure for a record that may be in the
log. OwnedStream with a fake writer (no I/O); the "next owner" rebuilds its table from
what the fake log holds, as a real takeover does from the stream's tail.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import pytest

from foundation.errors import BooklineError, WriterFailedError
from serving.write import dedup
from serving.write.batch import ProducerSeq, WriteBatch
from serving.write.owned import OwnedStream
from streams.dlsn import DLSN
from streams.records import LogRecord, RecordColumns
from tests.fake_writer import AppendsOnTaskStart
from tests.waiting import wait_for


@dataclass
class _Logged:
    dlsn: tuple[int, int, int]
    marker: dedup.Marker | None  # the producer marker the record carries
    payload: bytes | None
    sequence_id: int = 0


class PartlyDurableWriter(AppendsOnTaskStart):
    """Appends a batch at call time; ``durable`` of its records reach the log (one
    entry), then the writer fails before answering -- a bookie ensemble lost mid-batch."""

    def __init__(self, durable: int, segment: int = 1) -> None:
        self.log: list[_Logged] = []
        self.durable = durable
        self.segment = segment
        self.failure: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def write_many_offsets(
        self, records: Sequence[LogRecord]
    ) -> tuple[list[DLSN], list[int]]:
        entry = len(self.log)
        for slot, r in enumerate(records[: self.durable]):
            self.log.append(
                _Logged(
                    (self.segment, entry, slot), _marker(records, slot), r.payload, len(self.log)
                )
            )
        await self.failure
        raise AssertionError("unreachable: the writer fails")

    def fail(self) -> None:
        self.failure.set_exception(WriterFailedError("ensemble lost"))


class HealthyWriter(AppendsOnTaskStart):
    def __init__(self, log: list[_Logged], segment: int) -> None:
        self.log = log
        self.segment = segment

    async def write_many_offsets(
        self, records: Sequence[LogRecord]
    ) -> tuple[list[DLSN], list[int]]:
        entry = len({d.dlsn[1] for d in self.log if d.dlsn[0] == self.segment})
        out, offsets = [], []
        for slot, r in enumerate(records):
            offsets.append(len(self.log))
            self.log.append(
                _Logged(
                    (self.segment, entry, slot), _marker(records, slot), r.payload, len(self.log)
                )
            )
            out.append(DLSN(self.segment, entry, slot))
        return out, offsets


def _table(log: list[_Logged] | None = None) -> dedup.DedupTable:
    table = dedup.DedupTable(batches_per_producer=16, producers_max=100)
    if log is not None:
        dedup.rebuild(table, [(r, r.marker) for r in log])
    return table


def _marker(records: Sequence[LogRecord], slot: int) -> dedup.Marker | None:
    """The marker the write core put on a batch's first record."""
    return records.marker if slot == 0 and isinstance(records, RecordColumns) else None


def _req(seq: int, payloads: list[bytes]) -> WriteBatch:
    return WriteBatch("s", ProducerSeq("p", seq), payloads=list(payloads))


async def test_a_retry_racing_a_failed_write_is_outcome_unknown_then_answered_from_the_log() -> (
    None
):
    payloads = [b"r%d" % i for i in range(11)]
    writer = PartlyDurableWriter(durable=10)
    owned = OwnedStream("s", cast(Any, writer), _table(), reorder_wait_s=0.5)
    first = asyncio.ensure_future(owned.write(_req(0, payloads)))
    # Handed to the writer, ten of them durable.
    await wait_for(lambda: len(writer.log) == 10, "the first write's ten durable records")
    retry = asyncio.ensure_future(owned.write(_req(0, payloads)))  # the client timed out
    await asyncio.sleep(0.01)  # behaviour: the retry waits behind the first when it fails
    writer.fail()
    for attempt in (retry, first):
        with pytest.raises(BooklineError) as info:
            await attempt
        assert info.value.retriable, (
            f"definite failure for records that are in the log: {info.value}"
        )
        assert info.value.name == "OUTCOME_UNKNOWN", info.value
    # The next owner recovers the log and rebuilds its table from the stream's tail: the
    # retry is answered with the ten original positions and writes only the eleventh.
    log = writer.log
    owned2 = OwnedStream("s", cast(Any, HealthyWriter(log, 2)), _table(log), reorder_wait_s=0.5)
    dlsns, offsets, dups = await owned2.write(_req(0, payloads))
    assert dups == 10
    assert dlsns == [DLSN(1, 0, i) for i in range(10)] + [DLSN(2, 0, 0)]
    assert offsets == list(range(11))  # the ten originals' offsets, then the new one
    assert [r.payload for r in log] == payloads


async def test_a_forgotten_sequence_is_not_a_definite_failure() -> None:
    """A retry older than the batches remembered per producer may or may not be in
    the log: not a definite 400."""
    table = dedup.DedupTable(batches_per_producer=2, producers_max=10)
    for b in range(5):
        table.record("p", 0, b, [(1, b, 0)], [b])
    with pytest.raises(BooklineError) as info:
        table.plan("p", 0, 0, 1)
    assert info.value.retriable and info.value.name == "OUTCOME_UNKNOWN", info.value
