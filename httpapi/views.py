"""How core objects look in HTTP bodies (shared by both proxies and the client). Pure.

DLSNs travel as ``"seg:entry:slot"`` strings; every other field keeps its name from
``docs/core-api.md``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Final

from foundation.errors import BadRequestError
from httpapi.positions import parse_dlsn
from httpapi.wire import get_bytes, get_header_pairs
from streams.dlsn import DLSN
from streams.records import ReadRecord
from streams.vocabulary import SegmentInfo, StreamInfo

# A record's timestamp type by Kafka's number (0 CreateTime: the producer's time, 1
# LogAppendTime: the log's), as bodies name it (``ts_type``).
TIMESTAMP_TYPES: Final = ("CreateTime", "LogAppendTime")


def timestamp_type_name(number: int) -> str:
    return TIMESTAMP_TYPES[number]


def timestamp_type_number(name: object) -> int:
    """Kafka's number of a ``ts_type`` name (0 when absent: older proxies send none)."""
    if name is None:
        return 0
    if name not in TIMESTAMP_TYPES:
        raise BadRequestError(f"ts_type must be one of {', '.join(TIMESTAMP_TYPES)}")
    return TIMESTAMP_TYPES.index(str(name))


def headers_of(raw: Any) -> list[tuple[str, bytes | None]] | None:
    """Headers a body carried (pairs, or the object an older proxy sent) as pairs."""
    if raw is None:
        return None
    items = list(raw.items()) if isinstance(raw, dict) else raw
    if not isinstance(items, list):
        raise BadRequestError("headers must be a list of [name, value] pairs")
    out: list[tuple[str, bytes | None]] = []
    for item in items:
        if not isinstance(item, list | tuple) or len(item) != 2 or not isinstance(item[0], str):
            raise BadRequestError("each header is a [name, value] pair")
        name, value = item
        if value is not None and not isinstance(value, bytes):
            value = str(value).encode()
        out.append((name, value))
    return out or None


def _plain(value: Any) -> Any:
    if isinstance(value, DLSN):
        return str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if hasattr(value, "value") and hasattr(value, "name") and not isinstance(value, int):
        return value.value  # an enum
    return value


def info_view(info: Any) -> dict[str, Any]:
    """StreamInfo (and its SegmentInfos) as a plain dict."""
    out = _plain(info)
    if not isinstance(out, dict):
        raise TypeError(f"not a dataclass: {info!r}")
    return out


def _dlsn_or_none(raw: Any) -> DLSN | None:
    return None if raw is None else DLSN(*parse_dlsn(str(raw)))


def info_from_view(obj: Any) -> StreamInfo:
    """A stream's :func:`info_view` read back (the client's side); fields the view
    adds (a write proxy's ``owner``) are not part of a StreamInfo."""
    if not isinstance(obj, dict):
        raise BadRequestError("a stream description must be an object")
    try:
        segments = [
            SegmentInfo(**{**s, "min_active_dlsn": _dlsn_or_none(s.get("min_active_dlsn"))})
            for s in obj["segments"]
        ]
        return StreamInfo(
            name=str(obj["name"]),
            segments=segments,
            record_count=int(obj["record_count"]),
            size_bytes=int(obj["size_bytes"]),
            first_dlsn=_dlsn_or_none(obj.get("first_dlsn")),
            last_dlsn=_dlsn_or_none(obj.get("last_dlsn")),
            first_txid=obj.get("first_txid"),
            last_txid=obj.get("last_txid"),
            first_sequence_id=int(obj["first_sequence_id"]),
            next_sequence_id=int(obj["next_sequence_id"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise BadRequestError(f"malformed stream description: {exc}") from exc


def record_view(rec: ReadRecord) -> dict[str, Any]:
    out: dict[str, Any] = {
        "dlsn": str(rec.dlsn),
        "seq": rec.sequence_id,
        "txid": rec.txid,
        "ts": rec.timestamp_ms,
        "ts_type": TIMESTAMP_TYPES[rec.timestamp_type],
        "payload": rec.payload,
    }
    if rec.key is not None:
        out["key"] = rec.key
    if rec.headers:
        out["headers"] = rec.headers
    return out


def record_from_view(stream: str, obj: Any) -> ReadRecord:
    if not isinstance(obj, dict):
        raise BadRequestError("a record must be an object")
    try:
        return ReadRecord(
            stream,
            DLSN(*parse_dlsn(obj["dlsn"])),
            int(obj["seq"]),
            int(obj["txid"]),
            int(obj["ts"]),
            get_bytes(obj, "payload"),  # absent or null: a null value
            get_bytes(obj, "key"),
            headers_of(get_header_pairs(obj)),
            timestamp_type_number(obj.get("ts_type")),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise BadRequestError(f"malformed record: {exc}") from exc
