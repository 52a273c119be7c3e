"""Frames of the bookie wire protocol: the fixed header, the CRC, the op codes.

A connection is a TCP byte stream of *frames*; requests are pipelined and responses may
come back in any order, matched by request id.

Frame layout (all integers big-endian)::

    offset size  field
    0      2     magic            b"BL"
    2      1     version          PROTOCOL_VERSION (2: every request naming a ledger
                                  carries its master key); anything else is refused
    3      1     op               request op code; a response echoes its request's op
    4      1     kind             0 = request, 1 = response
    5      1     flags            requests: bit 0 RECOVERY (ADD), bit 1 FENCE (READ)
    6      2     status           responses: 0 = OK, else a foundation.errors code
    8      4     body_len  L      bytes after the header; checked against the maximum
                                  frame size as soon as the header is in, before any
                                  of the body is buffered
    12     4     meta_len  M      msgpack part of the body, M <= L
    16     8     request id       u64 chosen by the client, echoed by the response
    24     4     crc              CRC32C over header bytes 0..23, then the L body bytes
    28     M     meta             msgpack array of the op's fields (see ops.py)
    28+M   L-M   payload          raw entry bytes (ADD request, READ / READ_LAC response)

The payload travels outside msgpack so entries are neither re-packed nor re-parsed.
The CRC is verified before the meta is decoded. Because the request id sits in the
fixed header, a frame whose CRC is good but whose meta is malformed is answered with
BAD_REQUEST for that id and the stream stays in sync (:class:`FrameBodyError`); a bad
magic, version, length or CRC means frame boundaries can no longer be trusted and the
connection must be closed.
"""

from __future__ import annotations

import enum
import struct
from typing import Final

import crc32c

from foundation.errors import BadRequestError

MAGIC: Final = b"BL"
PROTOCOL_VERSION: Final = 2
# magic, version, op, kind, flags, status, body_len, meta_len, request_id
HEADER = struct.Struct(">2sBBBBHIIQ")
CRC = struct.Struct(">I")
HEADER_BYTES: Final = HEADER.size + CRC.size  # 28
# Default largest frame body; the bookie overrides it with config.frame_bytes_max.
FRAME_BYTES_MAX_DEFAULT: Final = 8 << 20

KIND_REQUEST: Final = 0
KIND_RESPONSE: Final = 1
FLAG_RECOVERY: Final = 0x01
FLAG_FENCE: Final = 0x02
FLAGS_KNOWN: Final = FLAG_RECOVERY | FLAG_FENCE


class Op(enum.IntEnum):
    ADD = 1
    READ = 2
    READ_LAC = 3
    INFO = 4
    LIST_LEDGERS = 5
    LIST_ENTRIES = 6
    WRITE_LAC = 7
    LIST_DAMAGED = 8
    ENTRY_CHECKSUMS = 9
    AUTH = 10
    HELLO = 11


OPS: Final = frozenset(int(op) for op in Op)
# A plain int for the hot path (IntEnum members are slower to pack and compare).
OP_ADD: Final = int(Op.ADD)
# Header bytes 0..7 of an OK ADD response (magic, version, op, kind, flags, status) and
# the rest of its fixed header (body_len, meta_len, request id, crc): the client's
# per-add answer is matched on these without decoding its meta.
ADD_OK_PREFIX: Final = struct.pack(">2sBBBBH", MAGIC, PROTOCOL_VERSION, OP_ADD, KIND_RESPONSE, 0, 0)
ADD_OK_TAIL = struct.Struct(">IIQI")


class FrameBodyError(BadRequestError):
    """A frame arrived whole with a good CRC but its meta is malformed.

    The stream is still in sync: answer BAD_REQUEST for ``request_id`` and go on.
    (No ``code`` of its own: on the wire it is BAD_REQUEST.)
    """

    def __init__(self, message: str, *, request_id: int, op: int) -> None:
        super().__init__(message)
        self.request_id = request_id
        self.op = op


def encode_frame(  # noqa: PLR0917 - positional on purpose: this is the hot path
    op: int, kind: int, flags: int, status: int, request_id: int, meta: bytes, payload: bytes
) -> bytes:
    """One whole frame: header, CRC, then the packed meta and the payload."""
    body_len = len(meta) + len(payload)
    header = HEADER.pack(
        MAGIC, PROTOCOL_VERSION, op, kind, flags, status, body_len, len(meta), request_id
    )
    crc = crc32c.crc32c(header)
    crc = crc32c.crc32c(meta, crc)
    if payload:
        crc = crc32c.crc32c(payload, crc)
    return b"".join((header, CRC.pack(crc), meta, payload))
