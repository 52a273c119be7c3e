"""The bookie wire protocol: a sans-I/O codec (no asyncio, no sockets).

Server, clients, the CLI and the fuzz tests all use this package, through the names
below. A connection is a TCP byte stream of pipelined, checksummed frames; each carries
one request or response of one op.

* ``frames.py``   -- the frame: fixed header (magic, version, op, kind, flags, status,
  lengths, request id), CRC32C, op codes; what is refused and what closes a connection;
* ``messages.py`` -- one dataclass per request and response;
* ``ops.py``      -- the table of ops: each op's meta layout, checks and codecs, the
  optional features (WRITE_LAC, LAC_ENTRIES, REPLICA_CHECK);
* ``codec.py``    -- frames encoded and decoded through that table (``encode_*``);
* ``decoder.py``  -- the incremental :class:`Decoder` (``feed``, ``next_frame``).
"""

from __future__ import annotations

from foundation.sansio import NEED_DATA, NeedData

from .codec import (
    AddEncoder,
    encode_add_response,
    encode_error,
    encode_request,
    encode_response,
    op_of,
)
from .decoder import Decoder
from .frames import (
    FLAG_FENCE,
    FLAG_RECOVERY,
    FRAME_BYTES_MAX_DEFAULT,
    HEADER_BYTES,
    KIND_REQUEST,
    KIND_RESPONSE,
    MAGIC,
    PROTOCOL_VERSION,
    FrameBodyError,
    Op,
    encode_frame,
)
from .messages import (
    AddRequest,
    AddResponse,
    AuthRequest,
    AuthResponse,
    BookieInfo,
    EntryChecksum,
    EntryChecksumsRequest,
    EntryChecksumsResponse,
    ErrorResponse,
    HelloRequest,
    HelloResponse,
    InfoRequest,
    InfoResponse,
    ListDamagedRequest,
    ListDamagedResponse,
    ListEntriesRequest,
    ListEntriesResponse,
    ListLedgersRequest,
    ListLedgersResponse,
    ReadLacRequest,
    ReadLacResponse,
    ReadRequest,
    ReadResponse,
    Request,
    Response,
    WriteLacRequest,
    WriteLacResponse,
)
from .ops import (
    CHECKSUM_RANGE_ENTRIES_MAX,
    DAMAGED_PAGE_ENTRIES_MAX,
    FEATURE_LAC_ENTRIES,
    FEATURE_REPLICA_CHECK,
    FEATURE_WRITE_LAC,
    MASTER_KEY_BYTES_MAX,
    TOKEN_CHARS_MAX,
)

# The frame encoder's name before the package split (the protocol tests build frames
# with it).
_frame = encode_frame

__all__ = [
    "CHECKSUM_RANGE_ENTRIES_MAX",
    "DAMAGED_PAGE_ENTRIES_MAX",
    "FEATURE_LAC_ENTRIES",
    "FEATURE_REPLICA_CHECK",
    "FEATURE_WRITE_LAC",
    "FLAG_FENCE",
    "FLAG_RECOVERY",
    "FRAME_BYTES_MAX_DEFAULT",
    "HEADER_BYTES",
    "KIND_REQUEST",
    "KIND_RESPONSE",
    "MAGIC",
    "MASTER_KEY_BYTES_MAX",
    "NEED_DATA",
    "PROTOCOL_VERSION",
    "TOKEN_CHARS_MAX",
    "AddEncoder",
    "AddRequest",
    "AddResponse",
    "AuthRequest",
    "AuthResponse",
    "BookieInfo",
    "Decoder",
    "EntryChecksum",
    "EntryChecksumsRequest",
    "EntryChecksumsResponse",
    "ErrorResponse",
    "FrameBodyError",
    "HelloRequest",
    "HelloResponse",
    "InfoRequest",
    "InfoResponse",
    "ListDamagedRequest",
    "ListDamagedResponse",
    "ListEntriesRequest",
    "ListEntriesResponse",
    "ListLedgersRequest",
    "ListLedgersResponse",
    "NeedData",
    "Op",
    "ReadLacRequest",
    "ReadLacResponse",
    "ReadRequest",
    "ReadResponse",
    "Request",
    "Response",
    "WriteLacRequest",
    "WriteLacResponse",
    "encode_add_response",
    "encode_error",
    "encode_frame",
    "encode_request",
    "encode_response",
    "op_of",
]
