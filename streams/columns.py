"""Record sets read as columns: where each user record lies in a set's body (pure
codec, plus one raw entry read), for readers that build column batches (the Spark
source's Arrow path, :mod:`pipeline.columns`) instead of a :class:`ReadRecord` each.

:func:`scan_entry` verifies a stored set exactly as :func:`streams.recordset.
decode_read_records` does (checksum, decompression, every length, the end of the
body, the user count) but keeps only the offsets of the user records' framing (the
fixed :data:`FRAMING_FIELDS`) in an ``array``; a record's txid, timestamp delta and
payload are then read from the body by offset, column at a time. Only records with
extras (a key, headers, a null value, a timestamp stored whole, a producer marker)
take a Python object each (their extras are decoded as the record decoder does;
internal extras -- a producer marker, an origin tag -- are dropped, as are a format
v1 record's ``bl.*`` headers and a v1/v2 record's ``bookline.spark`` one).
:func:`read_raw_entries` is :meth:`Namespace.read_entries` without the decoding: the
stored payloads, for the caller to scan (or to decode with their internal extras).
"""

from __future__ import annotations

import struct
from array import array
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, NamedTuple, Protocol

from foundation.errors import BadRequestError
from streams.records import RECORD_OVERHEAD_BYTES, Headers
from streams.recordset import (
    RecordSetHeader,
    _gap,
    extras_parser,  # the record decoder's own extras parsers: one definition of the layout
    verify_record_set,
)
from streams.recordset_layout import F_END_OF_STREAM, F_GAP, F_KEY, F_NULL, F_SKIP, REC, REC_V1

if TYPE_CHECKING:
    from streams.context import CoreContext


class _Namespace(Protocol):
    """What :func:`read_raw_entries` uses of a :class:`~streams.namespace.Namespace`
    (named structurally: the namespace itself uses this module)."""

    @property
    def name(self) -> str: ...

    @property
    def context(self) -> CoreContext: ...


__all__ = [
    "FRAMING_FIELDS",
    "EntryLayout",
    "RecordExtras",
    "payload_bytes",
    "read_raw_entries",
    "scan_entry",
]

#: A record's framing (big-endian, :mod:`streams.recordset`): name, numpy-style
#: type, offset from the record's start. The payload follows at
#: ``RECORD_OVERHEAD_BYTES`` unless the record has extras. The delta is signed in
#: format v2 (unsigned in v1, where a set's deltas never reach 2**31).
FRAMING_FIELDS: Final = (("flags", ">u1", 0), ("txid", ">i8", 1), ("ts_delta", ">i4", 9),
                         ("length", ">u4", 13))  # fmt: skip
_LEN_AT: Final = 13
_U32 = struct.Struct(">I")
_LENGTHS = struct.Struct(">II")  # a keyed record's payload length, then its key's
_KEYED_BYTES: Final = RECORD_OVERHEAD_BYTES + 4


class RecordExtras(NamedTuple):
    """A user record with extras: where its payload starts and what its framing alone
    does not say (``timestamp_ms`` is its timestamp, wherever it is stored)."""

    record: int  # the record's index among the entry's user records
    payload_start: int
    key: bytes | None
    headers: Headers | None
    timestamp_ms: int
    null: bool  # a null value (its length is 0)


@dataclass(frozen=True, slots=True)
class EntryLayout:
    """Where one entry's user records lie in its (decompressed) body.

    ``starts[i]``: offset of user record ``i``'s framing; its sequence id is
    ``first_sequence_id + i``. A record's payload starts at ``starts[i] +
    RECORD_OVERHEAD_BYTES`` but for the records listed in ``extras`` (index, payload
    start, key, headers). ``slots`` is None when slot ``i`` is record ``i`` (no control
    record in the set); ``skipped`` holds the byte ranges of control records. Every
    record's timestamp type is ``header.timestamp_type``. ``offsets`` is None when
    record ``i``'s sequence id is ``first_sequence_id + i``; a compacted (sparse) set
    lists them, and its ``slots`` too, and covers the offsets up to ``span_end``."""

    entry_id: int
    header: RecordSetHeader
    body: bytes
    first_sequence_id: int
    starts: array[int]
    slots: array[int] | None
    extras: list[RecordExtras]
    skipped: list[tuple[int, int]]
    end_of_stream: bool
    offsets: array[int] | None = None
    # With ``keys_inline``: the user records whose only extra is a key (not in
    # ``extras``): the key's u32 length at ``starts[i] + RECORD_OVERHEAD_BYTES``, the
    # key after it, then the payload.
    keyed: array[int] | None = None

    @property
    def count(self) -> int:
        return len(self.starts)

    @property
    def span_end(self) -> int:
        """The offset after the last one the set covers (kept or compacted away)."""
        return self.first_sequence_id + self.header.user_count


def scan_entry(
    payload: bytes, entry_id: int, start_sequence_id: int, *, keys_inline: bool = False
) -> EntryLayout:
    """Verify the stored set ``payload`` (entry ``entry_id`` of a segment starting at
    ``start_sequence_id``) and locate its user records. Corrupt or malformed input
    raises ChecksumError / BadRequestError as the record decoder does. ``keys_inline``:
    a record whose only extra is a key is listed in ``keyed``, not ``extras`` (no
    object for it: the Kafka fetch's columns, where most records are keyed)."""
    header, body = verify_record_set(payload)
    starts: array[int] = array("q")
    slots: array[int] | None = None
    extras: list[RecordExtras] = []
    parse = extras_parser(header.version)
    skipped: list[tuple[int, int]] = []
    unpack_len = _U32.unpack_from
    unpack_lengths = _LENGTHS.unpack_from
    append = starts.append
    eos = False
    pos = 0
    first = start_sequence_id + header.first_index
    # A compacted (sparse) set lists its records' sequence ids and slots.
    offsets: array[int] | None = array("q") if header.sparse else None
    slots = array("q") if header.sparse else None
    shift = 0  # offsets compaction removed so far (sparse sets)
    keyed: array[int] | None = array("q") if keys_inline else None
    try:
        for slot in range(header.count):
            flags = body[pos]
            if flags == F_KEY and keyed is not None:  # the same layout in every version
                keyed.append(len(starts))
                append(pos)
                plen, klen = unpack_lengths(body, pos + _LEN_AT)
                pos += _KEYED_BYTES + klen + plen
            elif flags:
                if flags & F_SKIP:
                    eos = eos or bool(flags & F_END_OF_STREAM)
                    if slots is None:
                        slots = array("q", range(len(starts)))
                    end = pos + RECORD_OVERHEAD_BYTES + unpack_len(body, pos + _LEN_AT)[0]
                    skipped.append((pos, end))
                    pos = end
                    continue
                _f, _t, dts, plen = _framing(body, pos, header.version)
                at = pos + RECORD_OVERHEAD_BYTES
                if flags & F_GAP:
                    gap, at = _gap(body, at, header)  # refused unless the set is sparse
                    shift += gap
                key, hdrs, ts, _marker, _tag, pstart = parse(body, at, flags & ~F_GAP,
                                                             header.base_ts_ms + dts)  # fmt: skip
                null = bool(flags & F_NULL)
                if null and plen:
                    raise BadRequestError(f"a null value with a payload length of {plen}")
                extras.append(RecordExtras(len(starts), pstart, key, hdrs, ts, null))
                append(pos)
                pos = pstart + plen
            else:
                append(pos)
                pos += RECORD_OVERHEAD_BYTES + unpack_len(body, pos + _LEN_AT)[0]
            if slots is not None:
                slots.append(slot + shift)
            if offsets is not None:
                offsets.append(first + len(starts) - 1 + shift)
    except (struct.error, IndexError) as exc:
        raise BadRequestError("record set body is truncated") from exc
    _check_end(header, body, pos, len(starts) + shift)
    return EntryLayout(entry_id, header, body, first, starts, slots, extras, skipped, eos,
                       offsets, keyed)  # fmt: skip


def payload_bytes(layout: EntryLayout) -> int:
    """The bytes of the entry's user records' payloads (a null value has none)."""
    unpack_len, body = _U32.unpack_from, layout.body
    return sum(unpack_len(body, start + _LEN_AT)[0] for start in layout.starts)


def _framing(body: bytes, pos: int, version: int) -> tuple[int, int, int, int]:
    return (REC if version >= 2 else REC_V1).unpack_from(body, pos)


def _check_end(header: RecordSetHeader, body: bytes, pos: int, users: int) -> None:
    """The checks :func:`streams.recordset.decode_verified` makes after its loop."""
    if pos != len(body):
        raise BadRequestError("record set body is truncated or has trailing bytes")
    if users != header.user_count and not (header.sparse and users <= header.user_count):
        raise BadRequestError("record set user count does not match its records")


async def read_raw_entries(
    ns: _Namespace, name: str, segment_seqno: int, first_entry_id: int, last_entry_id: int
) -> tuple[int, list[tuple[int, bytes]]]:
    """The segment's start sequence id and its entries ``first..last`` as stored
    ((entry id, payload), in order): :meth:`Namespace.read_entries` without decoding
    (no lock, no reader state; reads only up to the segment's LAC)."""
    ctx = ns.context
    seg, _v = await ctx.md.segments.get_segment(ns.name, name, segment_seqno)
    reader = await ctx.open_segment_reader(seg)
    if not seg.is_sealed and last_entry_id > reader.last_add_confirmed:
        await reader.read_lac()
    out = [
        (e.entry_id, e.payload) async for e in reader.iter_entries(first_entry_id, last_entry_id)
    ]
    return seg.start_sequence_id, out
