"""The proxies' HTTP bodies: paths, media types, the body codec and error bodies. Sans-I/O.

Shared by the write proxy, the read proxy and the thin client; imports no asyncio,
socket or aiohttp, so the fuzz/unit tests hit it directly. What the bodies carry is
coded next door: writes and their answers in :mod:`httpapi.writes`, read positions and
DLSN text in :mod:`httpapi.positions`, records and stream infos in :mod:`httpapi.views`;
each error code's status in :mod:`httpapi.status`.

Bodies
------
Two media types carry the same objects:

* ``application/msgpack`` for clients (bytes stay bytes, fast to decode);
* ``application/json`` for humans (bytes as UTF-8 text when they decode, otherwise
  base64 under a ``*_b64`` key).

The server answers in the type the ``Accept`` header prefers (msgpack only when asked
for), reads the type ``Content-Type`` names (JSON when absent). Versioning is in the
path (``/v1/...``); an incompatible change gets ``/v2``.

Read answer (``GET /v1/streams/{name}/records``)::

    {"records": [{"dlsn": "s:e:s", "seq": int, "txid": int, "ts": int,
                  "ts_type": "CreateTime" | "LogAppendTime",
                  "payload": bytes | null, "key": bytes?,
                  "headers": [[str, bytes | null], ...]?}, ...],
     "next": "seq:N"}          # where to continue

Headers are Kafka's ordered ``[name, value]`` pairs (names may repeat, a value may be
null). In JSON their values are text when every one is UTF-8, else all of them are
base64 under ``headers_b64`` (a null stays null).

Every error is ``{"code": int, "name": str, "message": str}`` (plus ``"owner"`` for
OWNER_MOVED) with the stable codes of :mod:`foundation.errors`.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from typing import Any, Final

import msgpack

from foundation.errors import BadRequestError, BooklineError, OwnerMovedError, for_code
from httpapi import recordsets

__all__ = [
    "API_PREFIX",
    "JSON",
    "MSGPACK",
    "MSGPACK_ALIASES",
    "decode_body",
    "decode_error",
    "encode_body",
    "encode_error",
    "error_body",
    "get_bytes",
    "get_header_pairs",
    "get_int",
    "is_msgpack",
    "negotiate",
    "to_json",
]

API_PREFIX: Final = "/v1"
MSGPACK: Final = "application/msgpack"
JSON: Final = "application/json"
MSGPACK_ALIASES: Final = frozenset({MSGPACK, "application/x-msgpack", "application/vnd.msgpack"})


# -- content negotiation -------------------------------------------------------------


def _media(value: str) -> str:
    return value.split(";", 1)[0].strip().lower()


def is_msgpack(content_type: str | None) -> bool:
    return content_type is not None and _media(content_type) in MSGPACK_ALIASES


def negotiate(accept: str | None) -> str:
    """The answer's media type: msgpack when Accept prefers it, else JSON."""
    if not accept:
        return JSON
    best, best_q = JSON, -1.0
    for part in accept.split(","):
        media, *params = part.split(";")
        media = media.strip().lower()
        q = 1.0
        for p in params:
            k, _, v = p.strip().partition("=")
            if k == "q":
                try:
                    q = float(v)
                except ValueError:
                    q = 0.0
        kind = (
            MSGPACK
            if media in MSGPACK_ALIASES
            else JSON
            if media in (JSON, "*/*", "application/*", "text/json")
            else None
        )
        if kind is not None and q > best_q:
            best, best_q = kind, q
    return best


def encode_body(obj: Mapping[str, Any], media: str) -> bytes:
    """Encode ``obj`` (bytes values allowed) in ``media``."""
    if media == MSGPACK:
        return bytes(msgpack.packb(obj, use_bin_type=True))
    return json.dumps(to_json(obj), separators=(",", ":")).encode()


def decode_body(body: bytes, content_type: str | None) -> dict[str, Any]:
    """Decode a request/answer body; BadRequestError when it is not an object."""
    if not body:
        return {}
    if content_type is not None and _media(content_type) == recordsets.MEDIA_TYPE:
        return {"recordsets": body}  # binary, decoded by httpapi.recordsets
    try:
        if is_msgpack(content_type):
            obj = msgpack.unpackb(body, raw=False, strict_map_key=True)
        else:
            obj = json.loads(body)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise BadRequestError(f"malformed body: {exc}") from exc
    except RecursionError as exc:  # JSON nested deeper than the interpreter's stack
        raise BadRequestError("malformed body: nested too deeply") from exc
    if not isinstance(obj, dict):
        raise BadRequestError(f"body must be an object, got {type(obj).__name__}")
    return obj


# Fields holding Kafka headers (lists of [name, value] pairs) in every body.
HEADER_FIELDS: Final = frozenset({"headers"})


def to_json(value: Any) -> Any:
    """A body as JSON sees it: bytes become text when they are UTF-8, else base64 under a
    ``*_b64`` key; headers likewise, all of a record's values at once."""
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for k, v in value.items():
            if k in HEADER_FIELDS and isinstance(v, list | tuple):
                name, pairs = _headers_json(k, v)
                out[name] = pairs
            elif isinstance(v, bytes | bytearray | memoryview):
                text = _utf8(bytes(v))
                if text is None:
                    out[f"{k}_b64"] = base64.b64encode(bytes(v)).decode()
                else:
                    out[k] = text
            else:
                out[k] = to_json(v)
        return out
    if isinstance(value, list | tuple):
        return [to_json(v) for v in value]
    if isinstance(value, bytes):
        return _utf8(value) or base64.b64encode(value).decode()
    return value


def _headers_json(field: str, pairs: Any) -> tuple[str, list[list[Any]]]:
    """``(field, pairs)`` with text values, or ``(field_b64, pairs)`` with base64 values
    when one is not UTF-8 (null values stay null either way)."""
    texts = [[n, None if v is None else _utf8(bytes(v))] for n, v in pairs]
    if all(t is not None or v is None for (_n, t), (_, v) in zip(texts, pairs, strict=True)):
        return field, texts
    b64 = [[n, None if v is None else base64.b64encode(bytes(v)).decode()] for n, v in pairs]
    return f"{field}_b64", b64


def _utf8(data: bytes) -> str | None:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


# -- bytes fields (JSON text or base64, msgpack bin) ------------------------------------


def get_bytes(obj: Mapping[str, Any], key: str, *, required: bool = False) -> bytes | None:
    """Field ``key`` as bytes: msgpack bin, JSON text (UTF-8) or ``key_b64`` base64."""
    value = obj.get(key)
    if value is None:
        b64 = obj.get(f"{key}_b64")
        if b64 is None:
            if required:
                raise BadRequestError(f"missing field {key!r}")
            return None
        if not isinstance(b64, str):
            raise BadRequestError(f"field {key}_b64 must be a base64 string")
        try:
            return base64.b64decode(b64, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise BadRequestError(f"field {key}_b64 is not valid base64") from exc
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    raise BadRequestError(f"field {key!r} must be bytes or text, got {type(value).__name__}")


def get_header_pairs(obj: Mapping[str, Any], key: str = "headers") -> Any:
    """Field ``key`` as headers sent them: pairs (or an object) from ``key``, or from
    ``key_b64`` with their values base64-decoded. Unchecked beyond the base64:
    :func:`httpapi.writes.checked_headers` checks names and values."""
    b64 = obj.get(f"{key}_b64")
    if b64 is None:
        return obj.get(key)
    if obj.get(key) is not None:
        raise BadRequestError(f"give {key} or {key}_b64, not both")
    items = list(b64.items()) if isinstance(b64, Mapping) else b64
    if not isinstance(items, list):
        raise BadRequestError(f"field {key}_b64 must be a list of [name, base64] pairs")
    out: list[tuple[Any, bytes | None]] = []
    for item in items:
        if not isinstance(item, list | tuple) or len(item) != 2:
            raise BadRequestError(f"each of {key}_b64 is a [name, base64 | null] pair")
        name, value = item
        if value is not None and not isinstance(value, str):
            raise BadRequestError(f"header {str(name)[:100]!r}: a base64 string or null")
        out.append((name, None if value is None else _b64decode(value, f"{key}_b64")))
    return out


def _b64decode(text: str, field: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise BadRequestError(f"field {field} is not valid base64") from exc


def get_int(obj: Mapping[str, Any], key: str, lo: int, hi: int) -> int | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise BadRequestError(f"field {key!r} must be an integer within {lo}..{hi}")
    return value


# -- errors ----------------------------------------------------------------------------


def error_body(exc: BooklineError) -> dict[str, Any]:
    body = exc.to_dict()
    owner = getattr(exc, "owner", None)
    if owner is not None:
        body["owner"] = owner
    return body


def encode_error(exc: BooklineError, media: str) -> bytes:
    return encode_body(error_body(exc), media)


def decode_error(obj: Mapping[str, Any], http_status: int) -> BooklineError:
    """Rebuild the error an answer carries (unknown codes keep their number)."""
    code = obj.get("code")
    message = str(obj.get("message", ""))
    if isinstance(code, bool) or not isinstance(code, int):
        return for_code(1, f"HTTP {http_status} without an error body: {message or obj!r}")
    exc = for_code(code, message)
    owner = obj.get("owner")
    if isinstance(exc, OwnerMovedError) and isinstance(owner, str):
        exc.owner = owner
    return exc
