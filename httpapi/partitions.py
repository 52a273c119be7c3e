"""Reads of a topic partition by offset, and subscriptions, in HTTP bodies. Pure.

Partition page (``GET /v1/topics/{t}/partitions/{p}/records?offset=N&limit=M&wait_ms=W``,
read proxy). Offsets are the partition stream's sequence ids (contiguous: a page's
records have offsets ``first, first+1, ...``)::

    msgpack: {"rows": [[offset, ts, key|nil, value|nil, headers|nil, ts_type], ...],
              "next_offset": int}
    JSON:    {"records": [{"offset": int, "ts": int, "ts_type": "CreateTime" |
                           "LogAppendTime", "key": bytes?, "value": bytes | null,
                           "headers": [[str, bytes | null], ...]?}, ...],
              "next_offset": int}

Rows instead of one map per record in msgpack (as the write answer has ``runs``
instead of ``dlsns``): a six-element array packs and unpacks in C without repeating
six key strings per record, which is most of a consumer's per-record cost through
the proxy. JSON keeps objects, for humans and ``curl``. ``next_offset`` is where the
next page starts (the requested offset when the page is empty). A row's ``ts_type`` is
Kafka's number (0 CreateTime, 1 LogAppendTime); headers are Kafka's ordered pairs
(:mod:`httpapi.wire`), a value is null for Kafka's null value.

Subscriptions (``/v1/streams/{s}/subscriptions[/{name}]``, read proxy): a core
subscription's durable position, ``{"subscriber": str, "dlsn": "s:e:s" | null}``; a
commit is ``{"dlsn": "s:e:s"}`` answered ``{"advanced": bool, "dlsn": "s:e:s"}``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from operator import itemgetter
from typing import Any

from foundation.errors import BadRequestError
from httpapi import wire
from httpapi.views import TIMESTAMP_TYPES, headers_of, timestamp_type_number
from streams.records import ReadRecord

__all__ = ["PartitionRow", "decode_page", "encode_page", "rows_of"]

# (offset, timestamp_ms, key, value, headers, timestamp_type): one record of a page.
PartitionRow = tuple[
    int, int, bytes | None, bytes | None, list[tuple[str, bytes | None]] | None, int
]
_headers_of_row = itemgetter(4)


def rows_of(records: Iterable[ReadRecord]) -> list[PartitionRow]:
    """Rows of core records (ReadRecord is a tuple: [4] sequence id, [6] timestamp,
    [7] payload, [8] key, [9] headers, [10] timestamp type; indexing skips the
    property calls)."""
    return [(r[4], r[6], r[8], r[7], r[9] or None, r[10]) for r in records]


def encode_page(rows: Sequence[PartitionRow], next_offset: int, media: str) -> bytes:
    if media == wire.MSGPACK:
        return wire.encode_body({"rows": rows, "next_offset": next_offset}, media)
    records = []
    for offset, ts, key, value, headers, ts_type in rows:
        rec: dict[str, Any] = {
            "offset": offset, "ts": ts, "ts_type": TIMESTAMP_TYPES[ts_type], "value": value
        }  # fmt: skip
        if key is not None:
            rec["key"] = key
        if headers:
            rec["headers"] = headers
        records.append(rec)
    return wire.encode_body({"records": records, "next_offset": next_offset}, media)


def decode_page(obj: Mapping[str, Any]) -> tuple[list[PartitionRow], int]:
    """Rows and the next offset of a decoded page (either media type)."""
    nxt = obj.get("next_offset")
    if isinstance(nxt, bool) or not isinstance(nxt, int) or nxt < 0:
        raise BadRequestError("partition page without a valid next_offset")
    rows = obj.get("rows")
    if isinstance(rows, list):
        if any(map(_headers_of_row, rows)):  # rare: pairs arrive as msgpack arrays
            return [(*r[:4], headers_of(r[4]), *r[5:]) for r in rows], nxt
        return rows, nxt
    records = obj.get("records")
    if not isinstance(records, list):
        raise BadRequestError("partition page without rows or records")
    out: list[PartitionRow] = []
    try:
        for rec in records:
            out.append(
                (
                    int(rec["offset"]),
                    int(rec["ts"]),
                    wire.get_bytes(rec, "key"),
                    wire.get_bytes(rec, "value"),  # null: Kafka's null value
                    headers_of(wire.get_header_pairs(rec)),
                    timestamp_type_number(rec.get("ts_type")),
                )
            )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise BadRequestError(f"malformed partition record: {exc}") from exc
    return out, nxt
