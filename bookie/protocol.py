"""The bookie wire protocol: a sans-I/O codec (no asyncio, no sockets).

Server, clients, the CLI and the fuzz tests all use this module. A connection is a TCP
byte stream of *frames*; requests are pipelined and responses may come back in any
order, matched by request id.

Frame layout (all integers big-endian)::

    offset size  field
    0      2     magic            b"BL"
    2      1     version          PROTOCOL_VERSION (1); anything else is refused
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
    28     M     meta             msgpack array of the op's fields (below)
    28+M   L-M   payload          raw entry bytes (ADD request, READ / READ_LAC response)

The payload travels outside msgpack so entries are neither re-packed nor re-parsed.
The CRC is verified before the meta is decoded. Because the request id sits in the
fixed header, a frame whose CRC is good but whose meta is malformed is answered with
BAD_REQUEST for that id and the stream stays in sync; a bad magic, version, length or
CRC means frame boundaries can no longer be trusted and the connection must be closed.

Meta per op (requests)::

    ADD           [ledger_id, entry_id, lac, master_key]         payload = entry
    READ          [ledger_id, entry_id, master_key]  entry_id -1 = last; key for FENCE
    READ_LAC      [ledger_id, previous_lac, timeout_ms(, piggyback_bytes_max)]
                                                     timeout 0 = no wait; see LAC_ENTRIES
    INFO          []
    LIST_LEDGERS  []
    LIST_ENTRIES  [ledger_id]
    WRITE_LAC     [ledger_id, lac, master_key]                   explicit LAC (below)
    LIST_DAMAGED  [from_ledger_id, from_entry_id]                entries found damaged
    ENTRY_CHECKSUMS [ledger_id, first_entry_id, last_entry_id]   replica check (below)

Meta per op (responses with status OK; a non-OK response's meta is ``[message]``)::

    ADD           [ledger_id, entry_id]
    READ          [ledger_id, entry_id, lac]                     payload = entry
    READ_LAC      [ledger_id, lac, next_entry_id or nil(, [length, ...])]
                                                     payload = next entry (or entries)
    INFO          {"bookie_id": str, "state": str, "used_fraction": float,
                   "free_bytes": int, "total_bytes": int}
    LIST_LEDGERS  [[ledger_id, ...]]
    LIST_ENTRIES  [ledger_id, [entry_id, ...]]
    WRITE_LAC     [ledger_id, lac]                               the bookie's LAC after it
    LIST_DAMAGED  [[[ledger_id, entry_id], ...], next]           next: [ledger_id,
                                                     entry_id] to ask from, or nil: done
    ENTRY_CHECKSUMS [ledger_id, last_entry_id, [[entry_id, crc32c, length], ...],
                   [damaged_entry_id, ...]]          both lists ascending, disjoint, and
                                                     within first..last_entry_id

WRITE_LAC (op 7, added after version 1 shipped, same PROTOCOL_VERSION) is the explicit
LAC: the writer tells the bookies a new LastAddConfirmed without waiting for a later
entry to carry it, so tailing readers' long polls return one add round trip after the
entry was acknowledged. It is not journaled (a LAC is a hint readers may see late, never
early). A bookie that knows the op lists ``"write_lac"`` in INFO's optional
``features`` array; a bookie older than the op would treat it as an unknown op and close
the connection, so clients send it only to bookies that advertise it. The ``lac`` an ADD
carries is taken the same way, on receipt (not when the add is durable), so a writer
whose next add reaches a bookie needs no WRITE_LAC to it.

LAC_ENTRIES (feature ``"lac_entries"``, same PROTOCOL_VERSION) lets one long poll carry a
run of entries instead of one: a READ_LAC request with a fourth field
``piggyback_bytes_max`` > 0 is answered with the contiguous entries ``previous_lac + 1 ..``
that the bookie holds in memory, up to its LAC and about that many bytes (at least one),
and a fourth response field listing their lengths; the payload is their concatenation.
A tailing reader then needs one round trip per batch of entries rather than one read per
entry. Clients send the field only to bookies that advertise the feature: an older
bookie would answer a four-field READ_LAC with BAD_REQUEST.

REPLICA_CHECK (feature ``"replica_check"``, ops 8 and 9, same PROTOCOL_VERSION) serves
the autorecovery scrub, which compares a ledger's replicas across its ensemble.
LIST_DAMAGED pages through the ``(ledger_id, entry_id)`` pairs the bookie's storage found
damaged (a checksum failure on a read, in compaction or journal replay), in order from
the pair asked for, at most ``DAMAGED_PAGE_ENTRIES_MAX`` per answer. ENTRY_CHECKSUMS
reads the entries ``first..last`` of one ledger and answers, per entry held, the CRC32C
and length of the stored blob (the packaged entry, digest included, so replicas holding
the same bytes give the same CRC without any entry crossing the wire), and the ids whose
read failed a checksum or that storage marks damaged; entries not held are in neither
list. One answer covers at most ``CHECKSUM_RANGE_ENTRIES_MAX`` entries (the bookie may
stop earlier to bound its reads): ``last_entry_id`` says how far it got, the client asks
again from the next id. NO_LEDGER when the bookie holds nothing of the ledger. Clients
send these ops only to bookies that advertise the feature (an older bookie closes the
connection on an unknown op).
"""

from __future__ import annotations

import enum
import itertools
import struct
from dataclasses import dataclass
from typing import Any, Final, NoReturn, TypeAlias

import crc32c
import msgpack

from foundation.errors import (
    BadRequestError,
    BooklineError,
    ProtocolVersionError,
    TooLargeError,
    UnknownError,
    for_code,
)

__all__ = [
    "CHECKSUM_RANGE_ENTRIES_MAX",
    "DAMAGED_PAGE_ENTRIES_MAX",
    "FEATURE_LAC_ENTRIES",
    "FEATURE_REPLICA_CHECK",
    "FEATURE_WRITE_LAC",
    "FLAG_FENCE",
    "FLAG_RECOVERY",
    "HEADER_BYTES",
    "MAGIC",
    "NEED_DATA",
    "PROTOCOL_VERSION",
    "AddEncoder",
    "AddRequest",
    "AddResponse",
    "BookieInfo",
    "Decoder",
    "EntryChecksum",
    "EntryChecksumsRequest",
    "EntryChecksumsResponse",
    "ErrorResponse",
    "FrameBodyError",
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
    "encode_add_request",
    "encode_add_response",
    "encode_error",
    "encode_request",
    "encode_response",
]

MAGIC: Final = b"BL"
PROTOCOL_VERSION: Final = 1
# magic, version, op, kind, flags, status, body_len, meta_len, request_id
_HEADER = struct.Struct(">2sBBBBHIIQ")
_CRC = struct.Struct(">I")
HEADER_BYTES: Final = _HEADER.size + _CRC.size  # 28
# Default largest frame body; the bookie overrides it with config.frame_bytes_max.
FRAME_BYTES_MAX_DEFAULT: Final = 8 << 20
# A master key is a digest of the ledger password; anything longer is a bad request.
MASTER_KEY_BYTES_MAX: Final = 256
# Ids are u64 on the wire; entry ids and LACs also use -1 ("none" / "last").
_U64_MAX: Final = (1 << 64) - 1
_U32_MAX: Final = (1 << 32) - 1
# Damaged (ledger, entry) pairs per LIST_DAMAGED answer: ~60 KiB of meta, far inside a
# frame, and a scrub pages through more.
DAMAGED_PAGE_ENTRIES_MAX: Final = 4096
# Entries per ENTRY_CHECKSUMS answer: ~64 KiB of meta; bounds the bookie's reads for one
# request too (it reads every entry of the range to checksum it).
CHECKSUM_RANGE_ENTRIES_MAX: Final = 4096

KIND_REQUEST: Final = 0
KIND_RESPONSE: Final = 1
FLAG_RECOVERY: Final = 0x01
FLAG_FENCE: Final = 0x02
_FLAGS_KNOWN: Final = FLAG_RECOVERY | FLAG_FENCE


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


_OPS: Final = frozenset(int(op) for op in Op)
# Plain ints for the hot path (IntEnum members are slower to pack and compare).
_OP_ADD: Final = int(Op.ADD)
_OP_READ: Final = int(Op.READ)
_OP_READ_LAC: Final = int(Op.READ_LAC)
_OP_INFO: Final = int(Op.INFO)
_OP_LIST_LEDGERS: Final = int(Op.LIST_LEDGERS)
_OP_LIST_ENTRIES: Final = int(Op.LIST_ENTRIES)
_OP_WRITE_LAC: Final = int(Op.WRITE_LAC)
_OP_LIST_DAMAGED: Final = int(Op.LIST_DAMAGED)
_OP_ENTRY_CHECKSUMS: Final = int(Op.ENTRY_CHECKSUMS)
# Header bytes 0..7 of an OK ADD response (magic, version, op, kind, flags, status) and
# the rest of its fixed header (body_len, meta_len, request id, crc): the client's
# per-add answer is matched on these without decoding its meta.
_ADD_OK_PREFIX: Final = struct.pack(
    ">2sBBBBH", MAGIC, PROTOCOL_VERSION, _OP_ADD, KIND_RESPONSE, 0, 0
)
_ADD_OK_TAIL = struct.Struct(">IIQI")
# INFO ``features`` entry of a bookie that serves WRITE_LAC.
FEATURE_WRITE_LAC: Final = "write_lac"
# INFO ``features`` entry of a bookie that piggybacks runs of entries on READ_LAC.
FEATURE_LAC_ENTRIES: Final = "lac_entries"
# INFO ``features`` entry of a bookie that serves LIST_DAMAGED and ENTRY_CHECKSUMS.
FEATURE_REPLICA_CHECK: Final = "replica_check"


class NeedData:
    """Sentinel type: the decoder needs more bytes before it can return a frame."""

    _instance: NeedData | None = None

    def __new__(cls) -> NeedData:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "NEED_DATA"


NEED_DATA: Final = NeedData()


class FrameBodyError(BadRequestError):
    """A frame arrived whole with a good CRC but its meta is malformed.

    The stream is still in sync: answer BAD_REQUEST for ``request_id`` and go on.
    (No ``code`` of its own: on the wire it is BAD_REQUEST.)
    """

    def __init__(self, message: str, *, request_id: int, op: int) -> None:
        super().__init__(message)
        self.request_id = request_id
        self.op = op


# --- messages -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AddRequest:
    request_id: int
    ledger_id: int
    entry_id: int
    lac: int
    master_key: bytes
    payload: bytes
    recovery: bool = False


@dataclass(frozen=True, slots=True)
class ReadRequest:
    request_id: int
    ledger_id: int
    entry_id: int  # -1 = the last entry held
    fence: bool = False
    master_key: bytes = b""


@dataclass(frozen=True, slots=True)
class ReadLacRequest:
    request_id: int
    ledger_id: int
    previous_lac: int
    timeout_ms: int  # long poll; 0 = answer at once
    # > 0: piggyback a run of entries of about this many bytes (FEATURE_LAC_ENTRIES);
    # 0: at most the one next entry (the original form, understood by every bookie).
    piggyback_bytes_max: int = 0


@dataclass(frozen=True, slots=True)
class InfoRequest:
    request_id: int


@dataclass(frozen=True, slots=True)
class ListLedgersRequest:
    request_id: int


@dataclass(frozen=True, slots=True)
class ListEntriesRequest:
    request_id: int
    ledger_id: int


@dataclass(frozen=True, slots=True)
class WriteLacRequest:
    request_id: int
    ledger_id: int
    lac: int
    master_key: bytes


@dataclass(frozen=True, slots=True)
class ListDamagedRequest:
    request_id: int
    # Answer the damaged pairs at or after (from_ledger_id, from_entry_id), in order.
    from_ledger_id: int = 0
    from_entry_id: int = 0


@dataclass(frozen=True, slots=True)
class EntryChecksumsRequest:
    request_id: int
    ledger_id: int
    first_entry_id: int
    last_entry_id: int  # inclusive, >= first_entry_id


@dataclass(frozen=True, slots=True)
class AddResponse:
    request_id: int
    ledger_id: int
    entry_id: int


@dataclass(frozen=True, slots=True)
class ReadResponse:
    request_id: int
    ledger_id: int
    entry_id: int  # the actual id, also when -1 (last) was asked for
    lac: int  # the bookie's LAC for the ledger (after fencing, for fence reads)
    payload: bytes


@dataclass(frozen=True, slots=True)
class ReadLacResponse:
    request_id: int
    ledger_id: int
    lac: int
    next_entry_id: int | None  # previous_lac + 1 when piggybacked, else None
    next_entry: bytes | None
    # Entries next_entry_id + 1, + 2, ... (only for requests with piggyback_bytes_max).
    more_entries: tuple[bytes, ...] = ()
    # The request asked for a run: answer in the four-field form even with one entry.
    run_form: bool = False


@dataclass(frozen=True, slots=True)
class WriteLacResponse:
    request_id: int
    ledger_id: int
    lac: int  # the bookie's LAC for the ledger after the request


@dataclass(frozen=True, slots=True)
class BookieInfo:
    bookie_id: str
    state: str  # "writable" | "read_only"
    used_fraction: float
    free_bytes: int
    total_bytes: int
    # Optional ops this bookie serves (e.g. FEATURE_WRITE_LAC); absent from old bookies.
    features: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class InfoResponse:
    request_id: int
    info: BookieInfo


@dataclass(frozen=True, slots=True)
class ListLedgersResponse:
    request_id: int
    ledger_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ListEntriesResponse:
    request_id: int
    ledger_id: int
    entry_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ListDamagedResponse:
    request_id: int
    damaged: tuple[tuple[int, int], ...]  # (ledger_id, entry_id), ascending
    # Where the next page starts; None: this was the last page.
    next_from: tuple[int, int] | None = None


@dataclass(frozen=True, slots=True)
class EntryChecksum:
    entry_id: int
    crc32c: int  # CRC32C of the stored blob (the packaged entry)
    length: int  # bytes of the stored blob


@dataclass(frozen=True, slots=True)
class EntryChecksumsResponse:
    request_id: int
    ledger_id: int
    last_entry_id: int  # the answer covers the request's first entry up to this one
    checksums: tuple[EntryChecksum, ...]  # entries held and read intact, ascending
    damaged: tuple[int, ...]  # entries held but damaged, ascending


@dataclass(frozen=True, slots=True)
class ErrorResponse:
    """A non-OK answer: ``code`` is a foundation.errors code, never 0."""

    request_id: int
    op: Op
    code: int
    message: str

    def error(self) -> BooklineError:
        return for_code(self.code, self.message)


Request: TypeAlias = (
    AddRequest
    | ReadRequest
    | ReadLacRequest
    | InfoRequest
    | ListLedgersRequest
    | ListEntriesRequest
    | WriteLacRequest
    | ListDamagedRequest
    | EntryChecksumsRequest
)
Response: TypeAlias = (
    AddResponse
    | ReadResponse
    | ReadLacResponse
    | InfoResponse
    | ListLedgersResponse
    | ListEntriesResponse
    | WriteLacResponse
    | ListDamagedResponse
    | EntryChecksumsResponse
    | ErrorResponse
)

# --- encoding -----------------------------------------------------------------------

_packb = msgpack.Packer(use_bin_type=True, autoreset=True).pack
_EMPTY_META: Final = _packb([])


def _frame(  # noqa: PLR0917 - positional on purpose: this is the hot path
    op: int, kind: int, flags: int, status: int, request_id: int, meta: bytes, payload: bytes
) -> bytes:
    body_len = len(meta) + len(payload)
    header = _HEADER.pack(
        MAGIC, PROTOCOL_VERSION, op, kind, flags, status, body_len, len(meta), request_id
    )
    crc = crc32c.crc32c(header)
    crc = crc32c.crc32c(meta, crc)
    if payload:
        crc = crc32c.crc32c(payload, crc)
    return b"".join((header, _CRC.pack(crc), meta, payload))


def encode_add_request(  # noqa: PLR0917 - positional on purpose: this is the hot path
    request_id: int,
    ledger_id: int,
    entry_id: int,
    lac: int,
    master_key: bytes,
    payload: bytes,
    recovery: bool,
) -> bytes:
    """An ADD request frame without building an :class:`AddRequest` first (the client's
    per-entry path); same bytes as ``encode_request(AddRequest(...))``."""
    meta = _packb([ledger_id, entry_id, lac, master_key])
    flags = FLAG_RECOVERY if recovery else 0
    return _frame(_OP_ADD, KIND_REQUEST, flags, 0, request_id, meta, payload)


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
        meta = _packb([self._ledger_id, entry_id, lac, self._master_key])
        return _frame(_OP_ADD, KIND_REQUEST, self._flags, 0, request_id, meta, payload)


def encode_add_response(request_id: int, ledger_id: int, entry_id: int) -> bytes:
    """An OK ADD response frame without building an :class:`AddResponse` (the bookie's
    per-entry path); same bytes as ``encode_response(AddResponse(...))``."""
    meta = _packb([ledger_id, entry_id])
    header = _HEADER.pack(
        MAGIC, PROTOCOL_VERSION, _OP_ADD, KIND_RESPONSE, 0, 0, len(meta), len(meta), request_id
    )
    crc = crc32c.crc32c(meta, crc32c.crc32c(header))
    return b"".join((header, _CRC.pack(crc), meta))


def encode_request(req: Request) -> bytes:
    """One request frame. The payload is copied once, into the frame, and never packed."""
    rid = req.request_id
    if type(req) is AddRequest:
        return encode_add_request(
            rid, req.ledger_id, req.entry_id, req.lac, req.master_key, req.payload, req.recovery
        )
    if type(req) is ReadRequest:
        flags = FLAG_FENCE if req.fence else 0
        meta = _packb([req.ledger_id, req.entry_id, req.master_key])
        return _frame(_OP_READ, KIND_REQUEST, flags, 0, rid, meta, b"")
    if type(req) is ReadLacRequest:
        fields = [req.ledger_id, req.previous_lac, req.timeout_ms]
        if req.piggyback_bytes_max:
            fields.append(req.piggyback_bytes_max)
        return _frame(_OP_READ_LAC, KIND_REQUEST, 0, 0, rid, _packb(fields), b"")
    if type(req) is InfoRequest:
        return _frame(_OP_INFO, KIND_REQUEST, 0, 0, rid, _EMPTY_META, b"")
    if type(req) is ListLedgersRequest:
        return _frame(_OP_LIST_LEDGERS, KIND_REQUEST, 0, 0, rid, _EMPTY_META, b"")
    if type(req) is ListEntriesRequest:
        meta = _packb([req.ledger_id])
        return _frame(_OP_LIST_ENTRIES, KIND_REQUEST, 0, 0, rid, meta, b"")
    if type(req) is WriteLacRequest:
        meta = _packb([req.ledger_id, req.lac, req.master_key])
        return _frame(_OP_WRITE_LAC, KIND_REQUEST, 0, 0, rid, meta, b"")
    if type(req) is ListDamagedRequest:
        meta = _packb([req.from_ledger_id, req.from_entry_id])
        return _frame(_OP_LIST_DAMAGED, KIND_REQUEST, 0, 0, rid, meta, b"")
    if type(req) is EntryChecksumsRequest:
        meta = _packb([req.ledger_id, req.first_entry_id, req.last_entry_id])
        return _frame(_OP_ENTRY_CHECKSUMS, KIND_REQUEST, 0, 0, rid, meta, b"")
    raise TypeError(f"not a request: {req!r}")


def encode_response(resp: Response) -> bytes:
    """One response frame (OK or error)."""
    rid = resp.request_id
    if type(resp) is AddResponse:
        return encode_add_response(rid, resp.ledger_id, resp.entry_id)
    if type(resp) is ReadResponse:
        meta = _packb([resp.ledger_id, resp.entry_id, resp.lac])
        return _frame(_OP_READ, KIND_RESPONSE, 0, 0, rid, meta, resp.payload)
    if type(resp) is ReadLacResponse:
        first = resp.next_entry
        if not resp.run_form:
            if resp.more_entries:
                raise ValueError("more_entries need the run form")
            meta = _packb([resp.ledger_id, resp.lac, resp.next_entry_id])
            payload = first if first is not None else b""
            return _frame(_OP_READ_LAC, KIND_RESPONSE, 0, 0, rid, meta, payload)
        run = () if first is None else (first, *resp.more_entries)
        meta = _packb([resp.ledger_id, resp.lac, resp.next_entry_id, [len(e) for e in run]])
        return _frame(_OP_READ_LAC, KIND_RESPONSE, 0, 0, rid, meta, b"".join(run))
    if type(resp) is InfoResponse:
        i = resp.info
        fields: dict[str, Any] = {
            "bookie_id": i.bookie_id,
            "state": i.state,
            "used_fraction": i.used_fraction,
            "free_bytes": i.free_bytes,
            "total_bytes": i.total_bytes,
        }
        if i.features:
            fields["features"] = list(i.features)
        meta = _packb(fields)
        return _frame(_OP_INFO, KIND_RESPONSE, 0, 0, rid, meta, b"")
    if type(resp) is ListLedgersResponse:
        meta = _packb([list(resp.ledger_ids)])
        return _frame(_OP_LIST_LEDGERS, KIND_RESPONSE, 0, 0, rid, meta, b"")
    if type(resp) is ListEntriesResponse:
        meta = _packb([resp.ledger_id, list(resp.entry_ids)])
        return _frame(_OP_LIST_ENTRIES, KIND_RESPONSE, 0, 0, rid, meta, b"")
    if type(resp) is WriteLacResponse:
        meta = _packb([resp.ledger_id, resp.lac])
        return _frame(_OP_WRITE_LAC, KIND_RESPONSE, 0, 0, rid, meta, b"")
    if type(resp) is ListDamagedResponse:
        nxt = list(resp.next_from) if resp.next_from is not None else None
        meta = _packb([[list(pair) for pair in resp.damaged], nxt])
        return _frame(_OP_LIST_DAMAGED, KIND_RESPONSE, 0, 0, rid, meta, b"")
    if type(resp) is EntryChecksumsResponse:
        sums = [[c.entry_id, c.crc32c, c.length] for c in resp.checksums]
        meta = _packb([resp.ledger_id, resp.last_entry_id, sums, list(resp.damaged)])
        return _frame(_OP_ENTRY_CHECKSUMS, KIND_RESPONSE, 0, 0, rid, meta, b"")
    if type(resp) is ErrorResponse:
        if not 0 < resp.code <= 0xFFFF:
            raise ValueError(f"error response needs a non-zero u16 code, got {resp.code}")
        return _frame(resp.op, KIND_RESPONSE, 0, resp.code, rid, _packb([resp.message]), b"")
    raise TypeError(f"not a response: {resp!r}")


def encode_error(request_id: int, op: int, error: BooklineError) -> bytes:
    """An error response frame carrying ``error``'s stable code and message."""
    code = error.original_code if isinstance(error, UnknownError) else error.code
    op_value = Op(op) if op in _OPS else Op.INFO
    return encode_response(ErrorResponse(request_id, op_value, code, error.message))


# --- decoding -----------------------------------------------------------------------


def _is_id(v: object) -> bool:
    """A non-negative u64 (ledger ids)."""
    return type(v) is int and 0 <= v <= _U64_MAX


def _is_eid(v: object) -> bool:
    """An entry id or LAC: a u64 or -1 ("none yet" / "last")."""
    return type(v) is int and -1 <= v <= _U64_MAX


def _is_key(v: object) -> bool:
    return type(v) is bytes and len(v) <= MASTER_KEY_BYTES_MAX


def _is_id_list(v: object, *, entry_ids: bool = False) -> bool:
    check = _is_eid if entry_ids else _is_id
    return type(v) is list and all(check(x) for x in v)


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
    as the header has arrived, so the body is never buffered.
    """

    __slots__ = ("_buf", "_error", "_expect_kind", "_frame_bytes_max", "_pos")

    def __init__(self, *, responses: bool, frame_bytes_max: int = FRAME_BYTES_MAX_DEFAULT):
        if frame_bytes_max <= 0:
            raise ValueError("frame_bytes_max must be positive")
        self._expect_kind = KIND_RESPONSE if responses else KIND_REQUEST
        self._frame_bytes_max = frame_bytes_max
        self._buf = bytearray()
        self._pos = 0  # start of the unconsumed bytes in _buf
        self._error: BooklineError | None = None

    @property
    def buffered_bytes(self) -> int:
        return len(self._buf) - self._pos

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        if self._error is not None:
            raise self._error
        if self._pos and self._pos == len(self._buf):
            self._buf.clear()
            self._pos = 0
        self._buf += data

    def next_frame(self) -> Request | Response | NeedData:
        if self._error is not None:
            raise self._error
        buf = self._buf
        pos = self._pos
        if len(buf) - pos < HEADER_BYTES:
            self._compact()
            return NEED_DATA
        header = _HEADER.unpack_from(buf, pos)
        self._check_header(header)
        _magic, _version, op, kind, flags, status, body_len, meta_len, rid = header
        end = pos + HEADER_BYTES + body_len
        if len(buf) < end:
            self._compact()
            return NEED_DATA
        (crc_wire,) = _CRC.unpack_from(buf, pos + _HEADER.size)
        view = memoryview(buf)
        try:
            crc = crc32c.crc32c(view[pos : pos + _HEADER.size])
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
            return _decode_request(op, flags, rid, meta, payload)
        return _decode_response(op, status, rid, meta, payload)

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
        if len(buf) < start or not buf.startswith(_ADD_OK_PREFIX, pos):
            return self.next_frame()
        body_len, meta_len, rid, crc_wire = _ADD_OK_TAIL.unpack_from(buf, pos + 8)
        end = start + body_len
        if body_len > self._frame_bytes_max or meta_len > body_len or len(buf) < end:
            return self.next_frame()  # refuses the frame or waits for the rest of it
        crc = crc32c.crc32c(buf[start:end], crc32c.crc32c(buf[pos : pos + _HEADER.size]))
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
        if op not in _OPS:
            self._fail(BadRequestError(f"unknown op {op}"))
        if flags & ~_FLAGS_KNOWN:
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


def _unpack_meta(meta: bytes, rid: int, op: int) -> Any:
    try:
        return msgpack.unpackb(meta, raw=False, strict_map_key=True)
    # ValueError covers truncated data, ExtraData, FormatError and StackError.
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise FrameBodyError(f"undecodable meta: {exc}", request_id=rid, op=op) from exc


def _read_lac_run(rid: int, op: int, m: list[Any], payload: bytes) -> ReadLacResponse:
    """The four-field READ_LAC answer: entries ``next_entry_id ..`` cut by lengths."""
    ledger_id, lac, first_id, lengths = m
    if not (type(lengths) is list and all(type(n) is int and n >= 0 for n in lengths)):
        raise _bad(rid, op, "lengths")
    if sum(lengths) != len(payload):
        raise _bad(rid, op, "lengths do not add up to the payload")
    if first_id is None:
        if lengths:
            raise _bad(rid, op, "entries without next_entry_id")
        return ReadLacResponse(rid, ledger_id, lac, None, None, (), True)
    if not _is_id(first_id) or not lengths or first_id + len(lengths) - 1 > lac:
        raise _bad(rid, op, "next_entry_id or entries past the LAC")
    entries = []
    pos = 0
    for n in lengths:
        entries.append(payload[pos : pos + n])
        pos += n
    return ReadLacResponse(rid, ledger_id, lac, first_id, entries[0], tuple(entries[1:]), True)


def _bad(rid: int, op: int, what: str) -> FrameBodyError:
    return FrameBodyError(f"malformed {Op(op).name} request: {what}", request_id=rid, op=op)


def _decode_request(op: int, flags: int, rid: int, meta: bytes, payload: bytes) -> Request:
    m = _unpack_meta(meta, rid, op)
    if type(m) is not list:
        raise _bad(rid, op, "meta is not an array")
    if op != _OP_ADD and payload:
        raise _bad(rid, op, "unexpected payload")
    if op == _OP_ADD:
        if len(m) != 4:
            raise _bad(rid, op, "expected [ledger_id, entry_id, lac, master_key]")
        ledger_id, entry_id, lac, key = m
        if not (_is_id(ledger_id) and _is_id(entry_id) and _is_eid(lac) and _is_key(key)):
            raise _bad(rid, op, "field types or ranges")
        if flags & FLAG_FENCE:
            raise _bad(rid, op, "FENCE flag on ADD")
        return AddRequest(rid, ledger_id, entry_id, lac, key, payload, bool(flags & FLAG_RECOVERY))
    if flags & FLAG_RECOVERY:
        raise _bad(rid, op, "RECOVERY flag is for ADD only")
    if op == _OP_READ:
        if len(m) != 3:
            raise _bad(rid, op, "expected [ledger_id, entry_id, master_key]")
        ledger_id, entry_id, key = m
        if not (_is_id(ledger_id) and _is_eid(entry_id) and _is_key(key)):
            raise _bad(rid, op, "field types or ranges")
        return ReadRequest(rid, ledger_id, entry_id, bool(flags & FLAG_FENCE), key)
    if flags:
        raise _bad(rid, op, "flags are for ADD and READ only")
    if op == _OP_READ_LAC:
        if len(m) not in (3, 4):
            raise _bad(rid, op, "expected [ledger_id, previous_lac, timeout_ms(, bytes_max)]")
        ledger_id, previous_lac, timeout_ms = m[:3]
        bytes_max = m[3] if len(m) == 4 else 0
        if not (
            _is_id(ledger_id)
            and _is_eid(previous_lac)
            and type(timeout_ms) is int
            and 0 <= timeout_ms <= _U32_MAX
            and type(bytes_max) is int
            and 0 <= bytes_max <= _U32_MAX
            and (len(m) == 3 or bytes_max > 0)
        ):
            raise _bad(rid, op, "field types or ranges")
        return ReadLacRequest(rid, ledger_id, previous_lac, timeout_ms, bytes_max)
    if op == _OP_INFO:
        if m:
            raise _bad(rid, op, "expected []")
        return InfoRequest(rid)
    if op == _OP_LIST_LEDGERS:
        if m:
            raise _bad(rid, op, "expected []")
        return ListLedgersRequest(rid)
    if op == _OP_WRITE_LAC:
        if len(m) != 3:
            raise _bad(rid, op, "expected [ledger_id, lac, master_key]")
        ledger_id, lac, key = m
        if not (_is_id(ledger_id) and _is_eid(lac) and _is_key(key)):
            raise _bad(rid, op, "field types or ranges")
        return WriteLacRequest(rid, ledger_id, lac, key)
    if op == _OP_LIST_DAMAGED:
        if len(m) != 2 or not (_is_id(m[0]) and _is_id(m[1])):
            raise _bad(rid, op, "expected [from_ledger_id, from_entry_id]")
        return ListDamagedRequest(rid, m[0], m[1])
    if op == _OP_ENTRY_CHECKSUMS:
        if len(m) != 3 or not (_is_id(m[0]) and _is_id(m[1]) and _is_id(m[2])):
            raise _bad(rid, op, "expected [ledger_id, first_entry_id, last_entry_id]")
        if m[1] > m[2]:
            raise _bad(rid, op, "first_entry_id after last_entry_id")
        return EntryChecksumsRequest(rid, m[0], m[1], m[2])
    if len(m) != 1 or not _is_id(m[0]):  # LIST_ENTRIES
        raise _bad(rid, op, "expected [ledger_id]")
    return ListEntriesRequest(rid, m[0])


def _decode_response(op: int, status: int, rid: int, meta: bytes, payload: bytes) -> Response:
    m = _unpack_meta(meta, rid, op)
    if status != 0:
        if type(m) is not list or len(m) != 1 or type(m[0]) is not str or payload:
            raise _bad(rid, op, "error response must be [message]")
        return ErrorResponse(rid, Op(op), status, m[0])
    if op == _OP_INFO:
        if type(m) is not dict:
            raise _bad(rid, op, "INFO response must be a map")
        try:
            info = BookieInfo(
                bookie_id=str(m["bookie_id"]),
                state=str(m["state"]),
                used_fraction=float(m["used_fraction"]),
                free_bytes=int(m["free_bytes"]),
                total_bytes=int(m["total_bytes"]),
                features=tuple(str(f) for f in m.get("features", ())),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise _bad(rid, op, f"INFO fields: {exc}") from exc
        return InfoResponse(rid, info)
    if type(m) is not list:
        raise _bad(rid, op, "meta is not an array")
    if op == _OP_ADD:
        if len(m) != 2 or not (_is_id(m[0]) and _is_id(m[1])):
            raise _bad(rid, op, "expected [ledger_id, entry_id]")
        return AddResponse(rid, m[0], m[1])
    if op == _OP_READ:
        if len(m) != 3 or not (_is_id(m[0]) and _is_id(m[1]) and _is_eid(m[2])):
            raise _bad(rid, op, "expected [ledger_id, entry_id, lac]")
        return ReadResponse(rid, m[0], m[1], m[2], payload)
    if op == _OP_READ_LAC:
        if len(m) not in (3, 4) or not (_is_id(m[0]) and _is_eid(m[1])):
            raise _bad(rid, op, "expected [ledger_id, lac, next_entry_id(, lengths)]")
        if len(m) == 4:
            return _read_lac_run(rid, op, m, payload)
        if m[2] is None:
            if payload:
                raise _bad(rid, op, "payload without next_entry_id")
            return ReadLacResponse(rid, m[0], m[1], None, None)
        if not _is_id(m[2]):
            raise _bad(rid, op, "next_entry_id")
        return ReadLacResponse(rid, m[0], m[1], m[2], payload)
    if op == _OP_WRITE_LAC:
        if len(m) != 2 or not (_is_id(m[0]) and _is_eid(m[1])):
            raise _bad(rid, op, "expected [ledger_id, lac]")
        return WriteLacResponse(rid, m[0], m[1])
    if op == _OP_LIST_LEDGERS:
        if len(m) != 1 or not _is_id_list(m[0]):
            raise _bad(rid, op, "expected [[ledger_id, ...]]")
        return ListLedgersResponse(rid, tuple(m[0]))
    if op == _OP_LIST_DAMAGED:
        return _list_damaged_response(rid, op, m)
    if op == _OP_ENTRY_CHECKSUMS:
        return _entry_checksums_response(rid, op, m)
    if len(m) != 2 or not _is_id(m[0]) or not _is_id_list(m[1]):  # LIST_ENTRIES
        raise _bad(rid, op, "expected [ledger_id, [entry_id, ...]]")
    return ListEntriesResponse(rid, m[0], tuple(m[1]))


def _is_pair(v: object) -> bool:
    return type(v) is list and len(v) == 2 and _is_id(v[0]) and _is_id(v[1])


def _ascending(items: list[Any]) -> bool:
    return all(a < b for a, b in itertools.pairwise(items))


def _list_damaged_response(rid: int, op: int, m: list[Any]) -> ListDamagedResponse:
    if len(m) != 2 or type(m[0]) is not list or not all(_is_pair(x) for x in m[0]):
        raise _bad(rid, op, "expected [[[ledger_id, entry_id], ...], next]")
    pairs = [(x[0], x[1]) for x in m[0]]
    if len(pairs) > DAMAGED_PAGE_ENTRIES_MAX or not _ascending(pairs):
        raise _bad(rid, op, "damaged pairs not ascending or too many")
    nxt = m[1]
    if nxt is None:
        return ListDamagedResponse(rid, tuple(pairs), None)
    if not _is_pair(nxt) or (pairs and (nxt[0], nxt[1]) <= pairs[-1]):
        raise _bad(rid, op, "next must be a pair after the page")
    return ListDamagedResponse(rid, tuple(pairs), (nxt[0], nxt[1]))


def _entry_checksums_response(rid: int, op: int, m: list[Any]) -> EntryChecksumsResponse:
    if len(m) != 4 or not (_is_id(m[0]) and _is_id(m[1])):
        raise _bad(rid, op, "expected [ledger_id, last_entry_id, [[id, crc, len], ...], [id]]")
    ledger_id, last, sums, damaged = m
    if type(sums) is not list or not all(
        type(x) is list
        and len(x) == 3
        and _is_id(x[0])
        and type(x[1]) is int
        and 0 <= x[1] <= _U32_MAX
        and type(x[2]) is int
        and 0 <= x[2] <= _U32_MAX
        for x in sums
    ):
        raise _bad(rid, op, "checksums must be [entry_id, crc32c, length] triples")
    if not _is_id_list(damaged):
        raise _bad(rid, op, "damaged must be entry ids")
    ids = [x[0] for x in sums]
    if len(ids) + len(damaged) > CHECKSUM_RANGE_ENTRIES_MAX:
        raise _bad(rid, op, "more entries than one answer may cover")
    if not (_ascending(ids) and _ascending(damaged)) or set(ids) & set(damaged):
        raise _bad(rid, op, "entry ids not ascending or listed twice")
    if (ids and ids[-1] > last) or (damaged and damaged[-1] > last):
        raise _bad(rid, op, "entries past last_entry_id")
    checksums = tuple(EntryChecksum(x[0], x[1], x[2]) for x in sums)
    return EntryChecksumsResponse(rid, ledger_id, last, checksums, tuple(damaged))
