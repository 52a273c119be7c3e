"""Kafka's framing (no I/O): every request and response is ``int32 size`` then ``size``
bytes (the header and body of ``messages.py``). There is no checksum at this level;
record batches carry their own CRC (``records.py``).

:class:`FrameReader` is fed bytes as they arrive and hands out whole frames. A size
over ``frame_bytes_max`` is refused as soon as its 4 bytes are in, before any of the
frame is buffered (Kafka's ``socket.request.max.bytes`` does the same), and a negative
size is corrupt; both errors are sticky: the connection is to be closed.
"""

from __future__ import annotations

import struct
from typing import Final

from foundation.sansio import NEED_DATA, NeedData
from kafkaapi.protocol.errors import INVALID_REQUEST, KafkaProtocolError
from kafkaapi.protocol.primitives import corrupt

__all__ = ["FRAME_BYTES_MAX", "NEED_DATA", "FrameReader", "NeedData", "frame"]

# A request bigger than this is refused: a producer's request is at most its
# max.request.size / message.max.bytes (1 MiB by default in Kafka and librdkafka), so
# 16 MiB leaves room for raised client limits while bounding a connection's buffer.
FRAME_BYTES_MAX: Final = 16 * 1024 * 1024

_SIZE = struct.Struct(">i")


def frame(payload: bytes) -> bytes:
    """``payload`` with its size prefix."""
    return _SIZE.pack(len(payload)) + payload


class FrameReader:
    """Splits a byte stream into frames; buffers at most one frame and its prefix."""

    def __init__(self, frame_bytes_max: int = FRAME_BYTES_MAX) -> None:
        self._frame_bytes_max = frame_bytes_max
        self._buf = bytearray()
        self._pos = 0
        self._error: KafkaProtocolError | None = None

    @property
    def buffered_bytes(self) -> int:
        return len(self._buf) - self._pos

    @property
    def next_frame_bytes(self) -> int:
        """Bytes the next frame takes with its prefix, once its prefix is in (0 before):
        what a server reserves before reading the rest of it."""
        size = self._check_size()
        return 0 if size is None else _SIZE.size + size

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Take bytes. A caller feeds what one read returned (bounded by its read size),
        and calls :meth:`next_frame` until NEED_DATA before feeding again."""
        if self._error is not None:
            raise self._error
        if self._pos:
            del self._buf[: self._pos]
            self._pos = 0
        self._buf += data
        self._check_size()

    def next_frame(self) -> bytes | NeedData:
        if self._error is not None:
            raise self._error
        size = self._check_size()
        if size is None or self.buffered_bytes < _SIZE.size + size:
            return NEED_DATA
        start = self._pos + _SIZE.size
        self._pos = start + size
        return bytes(self._buf[start : self._pos])

    def _check_size(self) -> int | None:
        """The size of the next frame once its prefix is in, refused if out of bounds."""
        if self.buffered_bytes < _SIZE.size:
            return None
        size: int = _SIZE.unpack_from(self._buf, self._pos)[0]
        if size < 0:
            self._error = corrupt(f"negative frame size {size}")
            raise self._error
        if size > self._frame_bytes_max:
            self._error = KafkaProtocolError(
                INVALID_REQUEST, f"frame of {size} bytes over the limit of {self._frame_bytes_max}"
            )
            raise self._error
        return size
