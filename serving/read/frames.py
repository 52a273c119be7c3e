"""Read answers as bytes: records packed once, pages and tail frames. Sans-I/O.

A read page and a WebSocket tail frame are the same object,
``{"records": [...], "next": "seq:N"}`` (the read answer of :mod:`httpapi.wire`, each
record as :func:`httpapi.views.record_view` shows it). In msgpack a record's encoding
is made once (:class:`CachedRecord`) and frames are spliced together from those bytes,
so a record a feed cached costs no encoding per subscriber. In JSON, bytes follow the
body rules of :mod:`httpapi.wire` (text when UTF-8, else ``*_b64``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import msgpack

from httpapi import wire
from httpapi.views import record_view
from streams.records import ReadRecord

__all__ = ["CachedRecord", "json_frame", "msgpack_frame", "pack_record", "page_body"]

_PACKED_KEYS = (msgpack.packb("records"), msgpack.packb("next"))
_MAP_OF_TWO = b"\x82"  # msgpack fixmap header, 2 entries


@dataclass(slots=True)
class CachedRecord:
    record: ReadRecord
    packed: bytes  # msgpack of the record's view, made once for every subscriber

    @property
    def size(self) -> int:
        return len(self.packed)


def pack_record(rec: ReadRecord) -> CachedRecord:
    return CachedRecord(rec, msgpack.packb(record_view(rec), use_bin_type=True))


def msgpack_frame(items: Sequence[CachedRecord], next_pos: str) -> bytes:
    """msgpack ``{"records": [...], "next": ...}`` from records packed once each."""
    head = msgpack.Packer().pack_array_header(len(items))
    return b"".join(
        (
            _MAP_OF_TWO,
            _PACKED_KEYS[0],
            head,
            *(i.packed for i in items),
            _PACKED_KEYS[1],
            msgpack.packb(next_pos),
        )
    )


def json_frame(items: Sequence[CachedRecord], next_pos: str) -> str:
    """A WebSocket text frame (``format=json``)."""
    return json.dumps(
        wire.to_json({"records": [record_view(i.record) for i in items], "next": next_pos})
    )


def page_body(items: Sequence[CachedRecord | ReadRecord], next_pos: str, media: str) -> bytes:
    """The body of a read answer in ``media``; records from a feed keep their packing."""
    if media == wire.MSGPACK:
        packed = [i if isinstance(i, CachedRecord) else pack_record(i) for i in items]
        return msgpack_frame(packed, next_pos)
    views = [record_view(i.record if isinstance(i, CachedRecord) else i) for i in items]
    return wire.encode_body({"records": views, "next": next_pos}, media)
