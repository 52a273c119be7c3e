"""The record-set format: many records in one ledger entry (pure, no I/O).

A writer batches records into a *record set*, which becomes the payload of one ledger
entry. Byte layout, format version 3 (all integers big-endian)::

    record set
    offset  size  field
    0       1     version (RECORD_SET_VERSION = 3; 1 and 2 are still read)
    1       1     flags: bits 0-1 compression (0 none, 1 lz4 block, 2 zstd);
                  bit 2 timestamp type (0 CreateTime, 1 LogAppendTime; v2+ only);
                  bit 3 sparse (a compacted set, v2+ only: see below)
    2       4     records in the set (user + control)
    6       4     user records in the set (sparse: the offsets the set covers)
    10      8     first index: user records of the segment before this set
    18      8     first txid of the set's user records (-1: none)
    26      8     last txid of the segment up to and including this set (-1: none)
    34      8     base timestamp, ms since the epoch: the writer's clock when the set's
                  first record was appended (never goes back within a writer)
    42      8     payload bytes of the segment's user records before this set
    50      4     stored body length (after compression)
    54      4     raw body length (before compression)
    58      4     CRC32C over bytes [0, 58) then the stored body
    62      n     body (compressed as the flags say)

    record (inside the raw body, one after the other)
    0       1     flags: 0x01 control, 0x02 end of stream, 0x04 has key, 0x08 has headers,
                  0x10 null value, 0x20 absolute timestamp, 0x40 internal extras,
                  0x80 offset gap (sparse sets only)
    1       8     txid (signed)
    9       4     timestamp delta from the set's base timestamp, ms (signed; v1 unsigned)
    13      4     payload length (0 for a null value)
    17      ...   extras, in this order, each only if its flag is set:
                  0x80  gap u32: offsets compaction removed just before this record
                  0x20  timestamp, ms (i64): the delta does not fit 32 bits
                  0x04  key length u32, key
                  0x08  header count u16, then per header: name length u16, name
                        utf-8, value length i32 (-1: null value), value
                  0x40  internal extras: kinds u8 (0x01 producer marker, 0x02 origin
                        tag; at least one, no other bit), then each one present:
                        producer marker: id length u16, id utf-8, epoch u32,
                          first sequence i64, record count u32
                        origin tag: length u16, bytes
                  then the payload

Headers are an ordered list: names may repeat, values may be null. *Internal extras*
are Bookline's own per-record metadata, never headers and never in a
:class:`~streams.records.ReadRecord`; only :func:`streams.recordset.decode_internal`
returns them (a user header named like an old internal one is just a header):

* the producer marker (:class:`~streams.records.ProducerMarker`): the write proxy's
  de-duplication record of a producer batch, on the batch's first record;
* the origin tag: opaque bytes a writer puts on every record of a write
  (``RecordColumns.tag``) -- the Spark sink's exactly-once tag (:mod:`pipeline.sink_marks`),
  which names the query, batch, run and task that wrote the record.

Format version 2 (still decoded; never written): the same as v3 but flag 0x40 is the
producer marker alone (its fields as above, no kinds byte), and the Spark sink's tag
was the header ``bookline.spark``: decoding a v2 record removes that header and makes
it the record's origin tag.

Format version 1 (still decoded; never written): the same set header (flags bit 2
zero), the timestamp delta unsigned, no null value, no absolute timestamp, header
values u32 (never null), and no internal extras -- the write proxy put its marker
in headers ``bl.producer`` (id), ``bl.seq`` (u64), ``bl.count`` (u32), ``bl.epoch``
(u32, absent means 0), the Spark sink its tag in ``bookline.spark``. Decoding a v1
record removes every ``bl.``-prefixed header (that prefix was reserved for Bookline)
and turns those four into its marker, and ``bookline.spark`` into its origin tag, so
no reader returns one, a new owner still rebuilds its de-duplication table from them
and a Spark sink still finds its earlier runs' records.

The checksum is verified before anything else is decoded, and every length is checked
against what is left, so corrupt input raises :class:`ChecksumError` (or
:class:`BadRequestError` for a well-checksummed but malformed set), never an
``IndexError``. The ledger layer checksums the entry as well; this one also covers the
decompressed body's framing and keeps a record set verifiable wherever it is copied.

Control records (which let the writer advance the LAC when idle) and the end-of-stream
marker occupy a slot but are never handed to readers. A record's sequence id is the
segment's ``start_sequence_id`` + the set's first index + its index among the set's
user records.

A *sparse* set is what compaction (:mod:`streams.compaction`) writes in place of an
entry some of whose records it removed: the original set's header fields (first index,
txids, bytes before), ``user count`` the offsets the set covers, and only the records
kept; each one after a removed one carries its *gap*, so sequence ids -- and slot ids,
which in a user set are the record's index among the set's offsets -- stay what they
were: a DLSN or an offset taken before a compaction still names the same place.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

from foundation.invariants import invariant
from streams.records import CREATE_TIME, RECORD_OVERHEAD_BYTES, Compression

__all__ = [
    "HEADER_BYTES",
    "RECORD_SET_BYTES_MAX",
    "RECORD_SET_VERSION",
    "RecordSetHeader",
]

RECORD_SET_VERSION: Final = 3
# The versions a reader decodes: v1 is what Bookline wrote before issue 24, v2 before
# the origin tag.
VERSIONS_READ: Final = (1, 2, 3)
HEADER = struct.Struct(">BBIIqqqqqII")
CRC = struct.Struct(">I")
HEADER_BYTES: Final = HEADER.size + CRC.size  # 62
REC = struct.Struct(">BqiI")  # v2: signed timestamp delta
REC_V1 = struct.Struct(">BqII")
invariant(REC.size == REC_V1.size == RECORD_OVERHEAD_BYTES, "record framing is %d bytes", REC.size)
U32 = struct.Struct(">I")
I32 = struct.Struct(">i")
U16 = struct.Struct(">H")
I64 = struct.Struct(">q")
MARKER_TAIL = struct.Struct(">IqI")  # epoch, first sequence, record count
# A raw body is never larger than this (the ledger entry limit is 4 MiB; the margin
# covers compression that did not pay off); bounds decompression of hostile input.
RECORD_SET_BYTES_MAX: Final = 16 << 20
# Headers per record and their sizes: metadata, not a second payload.
HEADERS_PER_RECORD_MAX: Final = 64
HEADER_NAME_BYTES_MAX: Final = 256
# A producer id in a marker (the write proxy refuses longer ones well before this).
PRODUCER_ID_BYTES_MAX: Final = 0xFFFF
# An origin tag (the writer refuses a longer one when the write is made).
ORIGIN_TAG_BYTES_MAX: Final = 0xFFFF
# Kinds of internal extras (the byte after flag 0x40, format v3).
I_MARKER: Final = 0x01
I_TAG: Final = 0x02
I_KNOWN: Final = I_MARKER | I_TAG
TS_DELTA_MIN: Final = -(2**31)
TS_DELTA_MAX: Final = 2**31 - 1
# encode_record_set frames records per run of equal (txid, timestamp) while runs
# average at least this many records; shorter runs are framed one by one.
FRAMING_RUN_RECORDS_MIN: Final = 8

F_CONTROL: Final = 0x01
F_END_OF_STREAM: Final = 0x02
F_KEY: Final = 0x04
F_HEADERS: Final = 0x08
F_NULL: Final = 0x10
F_TIMESTAMP: Final = 0x20
F_MARKER: Final = 0x40  # internal extras (v3); the producer marker alone (v2)
F_GAP: Final = 0x80
F_SKIP: Final = F_CONTROL | F_END_OF_STREAM
F_KNOWN_V1: Final = F_SKIP | F_KEY | F_HEADERS
F_KNOWN: Final = F_KNOWN_V1 | F_NULL | F_TIMESTAMP | F_MARKER
COMPRESSION_MASK: Final = 0x03
SET_LOG_APPEND_TIME: Final = 0x04
SET_SPARSE: Final = 0x08

# Format v1's producer marker headers (decoded, never written) and their reserved prefix.
LEGACY_PREFIX: Final = "bl."
LEGACY_PRODUCER: Final = "bl.producer"
LEGACY_SEQ: Final = "bl.seq"
LEGACY_COUNT: Final = "bl.count"
LEGACY_EPOCH: Final = "bl.epoch"
# The Spark sink's tag header in formats v1 and v2 (decoded as the origin tag).
LEGACY_SPARK_TAG: Final = "bookline.spark"


@dataclass(frozen=True, slots=True)
class RecordSetHeader:
    compression: Compression
    count: int  # every record, control ones included (slots 0..count-1)
    user_count: int
    first_index: int  # user records of the segment before this set
    first_txid: int  # -1: the set holds no user record
    last_txid: int  # the segment's last user txid so far (-1: none yet)
    base_ts_ms: int
    bytes_before: int  # payload bytes of the segment's user records before this set
    stored_bytes: int
    raw_bytes: int
    version: int = RECORD_SET_VERSION
    timestamp_type: int = CREATE_TIME  # of every record in the set (Kafka's numbering)
    sparse: bool = False  # compacted: records carry gaps, user_count is the offsets covered
