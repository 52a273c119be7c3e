"""How core objects look in HTTP bodies (shared by both proxies and the client). Pure.

DLSNs travel as ``"seg:entry:slot"`` strings; every other field keeps its name from
``docs/core-api.md``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from foundation.errors import BadRequestError
from httpapi.positions import parse_dlsn
from httpapi.wire import get_bytes
from streams.dlsn import DLSN
from streams.records import ReadRecord


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


def record_view(rec: ReadRecord) -> dict[str, Any]:
    out: dict[str, Any] = {
        "dlsn": str(rec.dlsn),
        "seq": rec.sequence_id,
        "txid": rec.txid,
        "ts": rec.timestamp_ms,
        "payload": rec.payload,
    }
    if rec.key is not None:
        out["key"] = rec.key
    if rec.headers:
        # bl.* headers are the write proxy's de-duplication markers, not user data.
        user = {k: v for k, v in rec.headers.items() if not k.startswith("bl.")}
        if user:
            out["headers"] = user
    return out


def record_from_view(stream: str, obj: Any) -> ReadRecord:
    if not isinstance(obj, dict):
        raise BadRequestError("a record must be an object")
    try:
        headers = obj.get("headers")
        if headers is not None:
            headers = {
                k: v if isinstance(v, bytes) else str(v).encode() for k, v in headers.items()
            }
        return ReadRecord(
            stream,
            DLSN(*parse_dlsn(obj["dlsn"])),
            int(obj["seq"]),
            int(obj["txid"]),
            int(obj["ts"]),
            get_bytes(obj, "payload", required=True) or b"",
            get_bytes(obj, "key"),
            headers,
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise BadRequestError(f"malformed record: {exc}") from exc
