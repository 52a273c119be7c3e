"""Encoding and decoding frames with the op table (ops.py): what every op shares --
the frame, the error response, the flag and payload checks -- is here, what differs
per op is in its table row. ``AddEncoder`` and ``encode_add_response`` are the
per-entry fast paths of the client and the server (same bytes as the table's)."""

from __future__ import annotations

from typing import Any, Final

import crc32c
import msgpack

from foundation.errors import BooklineError, UnknownError

from .frames import (
    CRC,
    FLAG_RECOVERY,
    HEADER,
    KIND_REQUEST,
    KIND_RESPONSE,
    MAGIC,
    OP_ADD,
    OPS,
    PROTOCOL_VERSION,
    FrameBodyError,
    Op,
    encode_frame,
)
from .messages import ErrorResponse, Request, Response
from .ops import BY_OP, BY_REQUEST, BY_RESPONSE, bad_meta, pack_meta


def op_of(req: Request) -> Op:
    """The op of a request message."""
    return BY_REQUEST[type(req)].op


# --- encoding -------------------------------------------------------------------------------


def encode_request(req: Request) -> bytes:
    """One request frame. The payload is copied once, into the frame, and never packed."""
    codec = BY_REQUEST.get(type(req))
    if codec is None:
        raise TypeError(f"not a request: {req!r}")
    flags, meta, payload = codec.encode_request(req)
    return encode_frame(codec.op, KIND_REQUEST, flags, 0, req.request_id, pack_meta(meta), payload)


def encode_response(resp: Response) -> bytes:
    """One response frame (OK or error)."""
    if type(resp) is ErrorResponse:
        if not 0 < resp.code <= 0xFFFF:
            raise ValueError(f"error response needs a non-zero u16 code, got {resp.code}")
        meta = pack_meta([resp.message])
        return encode_frame(resp.op, KIND_RESPONSE, 0, resp.code, resp.request_id, meta, b"")
    codec = BY_RESPONSE.get(type(resp))
    if codec is None:
        raise TypeError(f"not a response: {resp!r}")
    fields, payload = codec.encode_response(resp)
    meta = pack_meta(fields)
    return encode_frame(codec.op, KIND_RESPONSE, 0, 0, resp.request_id, meta, payload)


def encode_error(request_id: int, op: int, error: BooklineError) -> bytes:
    """An error response frame carrying ``error``'s stable code and message."""
    code = error.original_code if isinstance(error, UnknownError) else error.code
    op_value = Op(op) if op in OPS else Op.INFO
    return encode_response(ErrorResponse(request_id, op_value, code, error.message))


class AddEncoder:
    """ADD request frames of one ledger: ledger id, master key and the RECOVERY flag are
    bound once, so the per-entry call takes only what changes (a client's hot path).
    Same bytes as ``encode_request(AddRequest(...))``."""

    __slots__ = ("_flags", "_ledger_id", "_master_key")

    def __init__(self, ledger_id: int, master_key: bytes, recovery: bool) -> None:
        self._ledger_id = ledger_id
        self._master_key = master_key
        self._flags = FLAG_RECOVERY if recovery else 0

    def encode(self, request_id: int, entry_id: int, lac: int, payload: bytes) -> bytes:
        meta = pack_meta([self._ledger_id, entry_id, lac, self._master_key])
        return encode_frame(OP_ADD, KIND_REQUEST, self._flags, 0, request_id, meta, payload)

    def encode_parts(
        self, request_id: int, entry_id: int, lac: int, payload: bytes
    ) -> tuple[bytes, bytes]:
        """:meth:`encode` as two pieces, ``(header + CRC + meta, payload)``, whose
        concatenation is the frame: the entry is not copied into a frame of its own.
        Why: a writer sends every entry to each bookie of its write set, and that copy
        (up to 512 KiB, three times an entry) was ~6 % of a batched writer's CPU
        (issue 17); a transport's ``writelines`` sends both pieces in one system call."""
        meta = pack_meta([self._ledger_id, entry_id, lac, self._master_key])
        header = HEADER.pack(
            MAGIC,
            PROTOCOL_VERSION,
            OP_ADD,
            KIND_REQUEST,
            self._flags,
            0,
            len(meta) + len(payload),
            len(meta),
            request_id,
        )
        crc = crc32c.crc32c(meta, crc32c.crc32c(header))
        if payload:
            crc = crc32c.crc32c(payload, crc)
        return b"".join((header, CRC.pack(crc), meta)), payload


def encode_add_response(request_id: int, ledger_id: int, entry_id: int) -> bytes:
    """An OK ADD response frame without building an :class:`AddResponse` (the bookie's
    per-entry path); same bytes as ``encode_response(AddResponse(...))``."""
    meta = pack_meta([ledger_id, entry_id])
    header = HEADER.pack(
        MAGIC, PROTOCOL_VERSION, OP_ADD, KIND_RESPONSE, 0, 0, len(meta), len(meta), request_id
    )
    crc = crc32c.crc32c(meta, crc32c.crc32c(header))
    return b"".join((header, CRC.pack(crc), meta))


# --- decoding -------------------------------------------------------------------------------


def _unpack_meta(meta: bytes, rid: int, op: int) -> Any:
    try:
        return msgpack.unpackb(meta, raw=False, strict_map_key=True)
    # ValueError covers truncated data, ExtraData, FormatError and StackError.
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise FrameBodyError(f"undecodable meta: {exc}", request_id=rid, op=op) from exc


def decode_request(op: int, flags: int, rid: int, meta: bytes, payload: bytes) -> Request:
    """The request in a frame whose header and CRC checked out (``op`` is known)."""
    m = _unpack_meta(meta, rid, op)
    if type(m) is not list:
        raise bad_meta(rid, op, "meta is not an array")
    takes_payload, flags_handled, decode = _REQUEST_DECODING[op]
    if payload and not takes_payload:
        raise bad_meta(rid, op, "unexpected payload")
    stray = flags & ~flags_handled
    if stray:
        if stray & FLAG_RECOVERY:
            raise bad_meta(rid, op, "RECOVERY flag is for ADD only")
        raise bad_meta(rid, op, "flags are for ADD and READ only")
    return decode(rid, flags, m, payload)


# What decode_request needs of each op's row, as a plain tuple (it runs per request).
_REQUEST_DECODING: Final = {
    op: (c.request_payload, c.request_flags, c.decode_request) for op, c in BY_OP.items()
}


def decode_response(op: int, status: int, rid: int, meta: bytes, payload: bytes) -> Response:
    """The response in a frame whose header and CRC checked out (``op`` is known)."""
    m = _unpack_meta(meta, rid, op)
    if status != 0:
        if type(m) is not list or len(m) != 1 or type(m[0]) is not str or payload:
            raise bad_meta(rid, op, "error response must be [message]")
        return ErrorResponse(rid, Op(op), status, m[0])
    codec = BY_OP[op]
    if not codec.response_map and type(m) is not list:
        raise bad_meta(rid, op, "meta is not an array")
    return codec.decode_response(rid, m, payload)
