"""Reads of a topic partition by offset, and subscriptions, in HTTP bodies. Pure.

Partition page (``GET /v1/topics/{t}/partitions/{p}/records?offset=N&limit=M&wait_ms=W``,
read proxy). Offsets are the partition stream's sequence ids (contiguous: a page's
records have offsets ``first, first+1, ...``)::

    msgpack: {"rows": [[offset, ts, key|nil, value, headers|nil], ...],
              "next_offset": int}
    JSON:    {"records": [{"offset": int, "ts": int, "key": bytes?, "value": bytes,
                           "headers": {...}?}, ...],
              "next_offset": int}

Rows instead of one map per record in msgpack (as the write answer has ``runs``
instead of ``dlsns``): a five-element array packs and unpacks in C without repeating
five key strings per record, which is most of a consumer's per-record cost through
the proxy. JSON keeps objects, for humans and ``curl``. ``next_offset`` is where the
next page starts (the requested offset when the page is empty). ``bl.*`` headers (the
write proxy's de-duplication markers) are never shown.

Subscriptions (``/v1/streams/{s}/subscriptions[/{name}]``, read proxy): a core
subscription's durable position, ``{"subscriber": str, "dlsn": "s:e:s" | null}``; a
commit is ``{"dlsn": "s:e:s"}`` answered ``{"advanced": bool, "dlsn": "s:e:s"}``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from foundation.errors import BadRequestError
from httpapi import wire
from streams.records import ReadRecord

__all__ = [
    "MARKER_HEADER_PREFIX",
    "PartitionRow",
    "decode_page",
    "encode_page",
    "rows_of",
    "user_headers",
]

# Headers the write proxy adds for de-duplication; not user data.
MARKER_HEADER_PREFIX: Final = "bl."

# (offset, timestamp_ms, key, value, headers): one record of a partition page.
PartitionRow = tuple[int, int, bytes | None, bytes, dict[str, bytes] | None]


def user_headers(headers: Mapping[str, bytes] | None) -> dict[str, bytes] | None:
    """``headers`` without the ``bl.*`` markers (None when nothing is left)."""
    if not headers:
        return None
    user = {k: v for k, v in headers.items() if not k.startswith(MARKER_HEADER_PREFIX)}
    return user or None


def rows_of(records: Iterable[ReadRecord]) -> list[PartitionRow]:
    """Rows of core records (ReadRecord is a tuple: [4] sequence id, [6] timestamp,
    [7] payload, [8] key, [9] headers; indexing skips the property calls)."""
    return [(r[4], r[6], r[8], r[7], user_headers(r[9]) if r[9] else None) for r in records]


def encode_page(rows: Sequence[PartitionRow], next_offset: int, media: str) -> bytes:
    if media == wire.MSGPACK:
        return wire.encode_body({"rows": rows, "next_offset": next_offset}, media)
    records = []
    for offset, ts, key, value, headers in rows:
        rec: dict[str, Any] = {"offset": offset, "ts": ts, "value": value}
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
        return rows, nxt
    records = obj.get("records")
    if not isinstance(records, list):
        raise BadRequestError("partition page without rows or records")
    out: list[PartitionRow] = []
    try:
        for rec in records:
            headers = rec.get("headers")
            if headers is not None:
                names = {k[:-4] if k.endswith("_b64") else k for k in headers}
                headers = {n: wire.get_bytes(headers, n) or b"" for n in names}
            out.append(
                (
                    int(rec["offset"]),
                    int(rec["ts"]),
                    wire.get_bytes(rec, "key"),
                    wire.get_bytes(rec, "value", required=True) or b"",
                    headers,
                )
            )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise BadRequestError(f"malformed partition record: {exc}") from exc
    return out, nxt
