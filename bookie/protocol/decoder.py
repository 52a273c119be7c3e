"""The incremental, sans-I/O frame decoder: ``feed(bytes)``, ``next_frame()``.

Checks each frame's header (frames.py) as soon as it is in and its CRC once the body
is, then decodes the meta with the op table (ops.py). The client's add path has
:meth:`Decoder.next_frame_or_add_ack`, which answers an OK ADD response with its bare
request id.
"""

from __future__ import annotations

from typing import Any, Final, NoReturn

import crc32c

from foundation.errors import BadRequestError, BooklineError, ProtocolVersionError, TooLargeError
from foundation.sansio import NEED_DATA, NeedData

from .codec import decode_request, decode_response
from .frames import (
    ADD_OK_PREFIX,
    ADD_OK_TAIL,
    CRC,
    FLAGS_KNOWN,
    FRAME_BYTES_MAX_DEFAULT,
    HEADER,
    HEADER_BYTES,
    KIND_REQUEST,
    KIND_RESPONSE,
    MAGIC,
    OPS,
    PROTOCOL_VERSION,
)
from .messages import Request, Response

# One read of the transport that feeds a decoder: asyncio and uvloop hand over at most
# 256 KiB per data_received; 1 MiB leaves room for any other transport.
FEED_BYTES_MAX: Final = 1 << 20


class Decoder:
    """Incremental frame decoder for one direction of one connection.

    ``feed(data)`` appends received bytes; ``next_frame()`` returns one decoded message,
    or ``NEED_DATA``. Errors:

    * :class:`FrameBodyError` (a BadRequestError) -- one frame was malformed but
      consumed whole; answer BAD_REQUEST for its request id and keep decoding.
    * :class:`BadRequestError` (bad magic, bad CRC, wrong kind, unknown op/flags),
      :class:`ProtocolVersionError`, :class:`TooLargeError` -- the stream is broken;
      the decoder stays failed and raises the same error again. Close the connection.

    ``frame_bytes_max`` bounds the body of one frame; a larger length is refused as soon
    as the header has arrived, so the body is never buffered. The bytes held at once
    are bounded too: one unfinished frame plus one read (:data:`FEED_BYTES_MAX`); a
    ``feed`` past that fails the stream with :class:`TooLargeError`, so a caller that
    feeds without draining frames cannot grow the buffer without bound.
    """

    __slots__ = (
        "_buf",
        "_buffered_bytes_max",
        "_error",
        "_expect_kind",
        "_frame_bytes_max",
        "_pos",
    )

    def __init__(self, *, responses: bool, frame_bytes_max: int = FRAME_BYTES_MAX_DEFAULT):
        if frame_bytes_max <= 0:
            raise ValueError("frame_bytes_max must be positive")
        self._expect_kind = KIND_RESPONSE if responses else KIND_REQUEST
        self._frame_bytes_max = frame_bytes_max
        self._buffered_bytes_max = HEADER_BYTES + frame_bytes_max + FEED_BYTES_MAX
        self._buf = bytearray()
        self._pos = 0  # start of the unconsumed bytes in _buf
        self._error: BooklineError | None = None

    @property
    def buffered_bytes(self) -> int:
        return len(self._buf) - self._pos

    @property
    def buffered_bytes_max(self) -> int:
        return self._buffered_bytes_max

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        if self._error is not None:
            raise self._error
        if self._pos and self._pos == len(self._buf):
            self._buf.clear()
            self._pos = 0
        if self.buffered_bytes + len(data) > self._buffered_bytes_max:
            self._fail(
                TooLargeError(
                    f"{self.buffered_bytes + len(data)} bytes buffered without a whole "
                    f"frame to decode, over {self._buffered_bytes_max}"
                )
            )
        self._buf += data

    def next_frame(self) -> Request | Response | NeedData:
        if self._error is not None:
            raise self._error
        buf = self._buf
        pos = self._pos
        if len(buf) - pos < HEADER_BYTES:
            self._compact()
            return NEED_DATA
        header = HEADER.unpack_from(buf, pos)
        self._check_header(header)
        _magic, _version, op, kind, flags, status, body_len, meta_len, rid = header
        end = pos + HEADER_BYTES + body_len
        if len(buf) < end:
            self._compact()
            return NEED_DATA
        (crc_wire,) = CRC.unpack_from(buf, pos + HEADER.size)
        view = memoryview(buf)
        try:
            crc = crc32c.crc32c(view[pos : pos + HEADER.size])
            body = view[pos + HEADER_BYTES : end]
            crc = crc32c.crc32c(body, crc)
            if crc != crc_wire:
                self._fail(BadRequestError(f"frame CRC mismatch for request id {rid}"))
            meta_end = pos + HEADER_BYTES + meta_len
            meta = bytes(view[pos + HEADER_BYTES : meta_end])
            payload = bytes(view[meta_end:end])
        finally:
            view.release()
        self._pos = end
        if kind == KIND_REQUEST:
            return decode_request(op, flags, rid, meta, payload)
        return decode_response(op, status, rid, meta, payload)

    def next_frame_or_add_ack(self) -> int | Request | Response | NeedData:
        """:meth:`next_frame` for a client's add path: an OK ADD response comes back as
        its bare request id (an ``int``) once its header and CRC are checked, without
        decoding its meta (``[ledger_id, entry_id]`` echo the request; the client keeps
        nothing to compare them with). Every other frame, and any error, is exactly
        :meth:`next_frame`'s."""
        if self._error is not None:
            raise self._error
        buf = self._buf
        pos = self._pos
        start = pos + HEADER_BYTES
        if len(buf) < start or not buf.startswith(ADD_OK_PREFIX, pos):
            return self.next_frame()
        body_len, meta_len, rid, crc_wire = ADD_OK_TAIL.unpack_from(buf, pos + 8)
        end = start + body_len
        if body_len > self._frame_bytes_max or meta_len > body_len or len(buf) < end:
            return self.next_frame()  # refuses the frame or waits for the rest of it
        crc = crc32c.crc32c(buf[start:end], crc32c.crc32c(buf[pos : pos + HEADER.size]))
        if crc != crc_wire:
            return self.next_frame()  # fails the stream with the CRC error
        self._pos = end
        request_id: int = rid
        return request_id

    def _check_header(self, header: tuple[Any, ...]) -> None:
        magic, version, op, kind, flags, status, body_len, meta_len, _rid = header
        if magic != MAGIC:
            self._fail(BadRequestError(f"bad frame magic {magic!r}"))
        if version != PROTOCOL_VERSION:
            self._fail(
                ProtocolVersionError(
                    f"protocol version {version} not supported (this side speaks "
                    f"{PROTOCOL_VERSION})"
                )
            )
        if body_len > self._frame_bytes_max:
            self._fail(TooLargeError(f"frame of {body_len} bytes exceeds {self._frame_bytes_max}"))
        if meta_len > body_len:
            self._fail(BadRequestError(f"meta length {meta_len} exceeds body {body_len}"))
        if kind != self._expect_kind:
            self._fail(BadRequestError(f"unexpected frame kind {kind}"))
        if op not in OPS:
            self._fail(BadRequestError(f"unknown op {op}"))
        if flags & ~FLAGS_KNOWN:
            self._fail(BadRequestError(f"unknown flags {flags:#x}"))
        if kind == KIND_REQUEST and status != 0:
            self._fail(BadRequestError("a request carries no status"))

    def _fail(self, error: BooklineError) -> NoReturn:
        self._error = error
        self._buf = bytearray()
        self._pos = 0
        raise error

    def _compact(self) -> None:
        # Drop consumed bytes once they dominate, so the buffer never keeps a history.
        if self._pos and self._pos * 2 >= len(self._buf):
            del self._buf[: self._pos]
            self._pos = 0
