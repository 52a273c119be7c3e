"""The items a :class:`~streams.reader.LogReader`'s read-ahead queue holds: one
entry's records (built late), the end-of-stream marker, or the fetch's failure; and
:class:`RawRecordSet`, a verified record set handed through as stored."""

from __future__ import annotations

from typing import NamedTuple

from streams.records import ReadRecord
from streams.recordset import RecordSetHeader, decode_verified

__all__ = ["END", "End", "Entry", "Item", "RawRecordSet"]

# Memory of one decoded record beyond its payload bytes, for the read-ahead budget.
RECORD_BYTES = 64


class End:
    """Queue item: the end-of-stream marker was read."""


class RawRecordSet(NamedTuple):
    """A verified record set as the entry held it
    (:meth:`~streams.reader.LogReader.read_record_sets`): its records are
    ``decode_verified(*verify_record_set(payload), stream, segment_seqno, entry_id,
    start_sequence_id, from_slot)``. A read proxy hands these through to a thin client
    without decoding or re-encoding a record."""

    payload: bytes  # the stored set: header, checksum, body (compressed as it says)
    segment_seqno: int
    entry_id: int
    start_sequence_id: int  # of the segment
    from_slot: int  # the first record wanted (0 but where a reader started mid-set)
    next_sequence_id: int  # of the first user record after this set
    user_count: int  # user records in the set (from_slot aside)


class Entry:
    """Queue item: one entry's records, or a verified record set whose records are
    built only when the application reaches it. Building records late keeps them
    short-lived: a read-ahead queue of hundreds of thousands of record objects made
    the cyclic GC rescan them over and over (over half the reader's CPU in py-spy).
    The stored set (``payload``) is kept too, for
    :meth:`~streams.reader.LogReader.read_record_sets`."""

    __slots__ = ("body", "entry_id", "from_slot", "header", "payload", "records", "seqno",
                 "size", "start_sequence_id")  # fmt: skip

    def __init__(  # noqa: PLR0917 - private, two call sites
        self,
        records: list[ReadRecord] | None,
        header: RecordSetHeader,
        body: bytes,
        seqno: int,
        entry_id: int,
        start_sequence_id: int,
        payload: bytes,
        from_slot: int,
    ) -> None:
        self.records = records
        self.header = header
        self.body = body
        self.seqno = seqno
        self.entry_id = entry_id
        self.start_sequence_id = start_sequence_id
        self.payload = payload
        self.from_slot = from_slot
        # The read-ahead budget counts the set's bytes (decoded and stored) plus a
        # per-record overhead.
        self.size = header.raw_bytes + len(payload) + RECORD_BYTES * header.user_count

    def raw(self) -> RawRecordSet:
        h = self.header
        next_seq = self.start_sequence_id + h.first_index + h.user_count
        return RawRecordSet(self.payload, self.seqno, self.entry_id, self.start_sequence_id,
                            self.from_slot, next_seq, h.user_count)  # fmt: skip

    def build(self, stream: str) -> list[ReadRecord]:
        if self.records is None:
            self.records, _eos = decode_verified(
                self.header, self.body, stream, self.seqno, self.entry_id,
                self.start_sequence_id,
            )  # fmt: skip
        return self.records


END = End()
Item = Entry | End | BaseException
