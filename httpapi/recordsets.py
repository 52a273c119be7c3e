"""Record sets handed through a read proxy, as stored (``GET
/v1/streams/{name}/recordsets``). Sans-I/O.

A catch-up read through a proxy used to cost per record on both sides: the proxy
decoded each record set into records and packed every record as a msgpack map; the
client unpacked the maps and built records again (~34,000 records/s through one read
proxy, against ~770,000 for the core library). Here the proxy sends the entries' record
sets as the bookies stored them -- no record is decoded or encoded on the way -- and
the client decodes them with the core's own codec (:mod:`streams.recordset`).

Body (media type :data:`MEDIA_TYPE`; integers big-endian)::

    offset  size  field
    0       4     magic b"BLRS"
    4       1     version (RECORDSETS_VERSION = 1)
    5       3     reserved, 0
    8       4     sets in the body
    12      8     next sequence id: where the next read starts (``seq:N``); -1: unknown
                  (no set: ask again from the same position)
    20      4     CRC32C of bytes [0, 20) then of everything after byte 24
    24      ...   the sets, each:
                  8  segment seqno
                  8  entry id
                  8  start sequence id of the segment
                  4  from slot: the first record wanted (0 but where a read began mid-set)
                  4  length n
                  n  the record set (its own version and CRC32C: streams.recordset)

The body checksum is verified before anything is decoded; each record set's own
checksum is verified again when it is decoded, so a set is checked end to end from the
bookie that stored it to the client.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Final, NamedTuple

import crc32c

from foundation.errors import BadRequestError, ChecksumError

__all__ = ["MAGIC", "MEDIA_TYPE", "RECORDSETS_VERSION", "SetFrame", "decode", "encode"]

MEDIA_TYPE: Final = "application/vnd.bookline.recordsets"
MAGIC: Final = b"BLRS"
RECORDSETS_VERSION: Final = 1
_HEAD = struct.Struct(">4sB3xIq")
_CRC = struct.Struct(">I")
_SET = struct.Struct(">QQQII")
HEADER_BYTES: Final = _HEAD.size + _CRC.size  # 24


class SetFrame(NamedTuple):
    payload: bytes
    segment_seqno: int
    entry_id: int
    start_sequence_id: int
    from_slot: int


def encode(sets: Sequence[SetFrame], next_sequence_id: int) -> bytes:
    parts: list[bytes] = []
    pack = _SET.pack
    for s in sets:
        parts.append(pack(s.segment_seqno, s.entry_id, s.start_sequence_id, s.from_slot,
                          len(s.payload)))  # fmt: skip
        parts.append(s.payload)
    body = b"".join(parts)
    head = _HEAD.pack(MAGIC, RECORDSETS_VERSION, len(sets), next_sequence_id)
    crc = crc32c.crc32c(body, crc32c.crc32c(head))
    return b"".join((head, _CRC.pack(crc), body))


def decode(data: bytes) -> tuple[list[SetFrame], int]:
    """The sets and the next sequence id; ChecksumError / BadRequestError when the body
    is damaged or malformed."""
    if len(data) < HEADER_BYTES:
        raise BadRequestError(f"record sets body of {len(data)} bytes is shorter than its header")
    magic, version, count, next_seq = _HEAD.unpack_from(data, 0)
    if magic != MAGIC or version != RECORDSETS_VERSION:
        raise BadRequestError(f"not a version-{RECORDSETS_VERSION} record sets body")
    (crc,) = _CRC.unpack_from(data, _HEAD.size)
    view = memoryview(data)
    if crc32c.crc32c(view[HEADER_BYTES:], crc32c.crc32c(view[: _HEAD.size])) != crc:
        raise ChecksumError("record sets body checksum mismatch")
    sets: list[SetFrame] = []
    pos, end, unpack, size = HEADER_BYTES, len(data), _SET.unpack_from, _SET.size
    for _ in range(count):
        if pos + size > end:
            raise BadRequestError("record sets body ends inside a set's framing")
        seqno, entry_id, start_seq, from_slot, n = unpack(data, pos)
        pos += size
        if pos + n > end:
            raise BadRequestError("record sets body ends inside a set")
        sets.append(SetFrame(data[pos : pos + n], seqno, entry_id, start_seq, from_slot))
        pos += n
    if pos != end:
        raise BadRequestError(f"{end - pos} bytes after the last record set")
    return sets, int(next_seq)
