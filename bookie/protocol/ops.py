"""The ops of the bookie wire protocol, in one table: each op's request and response
classes and how their fields travel in the frame's meta (a msgpack array) and payload.

Meta per op (requests)::

    ADD           [ledger_id, entry_id, lac, master_key]         payload = entry
    READ          [ledger_id, entry_id, master_key]  entry_id -1 = last
    READ_LAC      [ledger_id, previous_lac, timeout_ms, piggyback_bytes_max, master_key]
                                                     timeout 0 = no wait; see LAC_ENTRIES
    INFO          []
    LIST_LEDGERS  []
    LIST_ENTRIES  [ledger_id, master_key]
    WRITE_LAC     [ledger_id, lac, master_key]                   explicit LAC (below)
    LIST_DAMAGED  [from_ledger_id, from_entry_id]                entries found damaged
    ENTRY_CHECKSUMS [ledger_id, first_entry_id, last_entry_id]   replica check (below)
    AUTH          [token]                                        authentication (below)
    HELLO         [nonce]                     32 bytes: the bookie proves itself (below)

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
    AUTH          [principal]                                    who the bookie says you are
    HELLO         [bookie_id, address, proof]  proof: 32 bytes, bookie/identity.py

Every request naming a ledger carries its master key (protocol version 2, issue 15):
version 1's READ_LAC and LIST_ENTRIES carried none and its READ only when fencing, so
anyone could read any ledger. A bookie answers UNAUTHORIZED when the key is not the
ledger's (the key its first add or fence stored; a bookie that does not hold the ledger
yet checks an ADD's or fence's key against the ledger's metadata, see bookie/access.py).
A version-1 frame is answered PROTOCOL_VERSION and the connection closed.

AUTH (op 10, version 2): a bookie with ``[bookie] auth_enabled`` serves a connection only
after an AUTH request carrying a token (``foundation.auth``: signed with a cluster
secret, or a static one) names a principal; any other request first is answered
UNAUTHENTICATED and the connection closed, as is a failed AUTH. LIST_LEDGERS,
LIST_DAMAGED and ENTRY_CHECKSUMS (a bookie's inventory) then need an admin of the
cluster (the services' principal or a grant), else FORBIDDEN. With auth off an AUTH is
answered with the principal ``""``, so a client with a token may always send one.

HELLO (op 11, same PROTOCOL_VERSION, issue 21): a client holding the cluster's ledger
secret sends it first, before AUTH, and sends nothing else until the proof checks out
(bookie/identity.py: HMAC-SHA256 under the bookie's credential of "bookline-bookie-hello-v1"
0x00, the nonce, the bookie id, 0x00 and the address). A bookie serves HELLO before AUTH;
one without a credential answers UNAUTHENTICATED.

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
entry; 0 asks for the one-entry form.

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

import itertools
from collections.abc import Callable
from typing import Any, Final, NamedTuple

import msgpack

from .frames import (
    FLAG_FENCE,
    FLAG_RECOVERY,
    FrameBodyError,
    Op,
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
# INFO ``features`` entry of a bookie that serves WRITE_LAC.
FEATURE_WRITE_LAC: Final = "write_lac"
# INFO ``features`` entry of a bookie that piggybacks runs of entries on READ_LAC.
FEATURE_LAC_ENTRIES: Final = "lac_entries"
# INFO ``features`` entry of a bookie that serves LIST_DAMAGED and ENTRY_CHECKSUMS.
FEATURE_REPLICA_CHECK: Final = "replica_check"

pack_meta = msgpack.Packer(use_bin_type=True, autoreset=True).pack
Meta = list[Any]


class OpCodec(NamedTuple):
    """One row of the op table: how one op's request and response travel."""

    op: Op
    request: type
    response: type
    # Request flags the op's request decoder deals with; any other flag is refused.
    request_flags: int
    # Whether the request carries a payload (ADD); others must not.
    request_payload: bool
    # Whether the OK response's meta is a map (INFO) rather than an array.
    response_map: bool
    # request -> (flags, meta fields, payload)
    encode_request: Callable[[Any], tuple[int, Meta, bytes]]
    # (request id, flags, meta array, payload) -> request; FrameBodyError when malformed
    decode_request: Callable[[int, int, Meta, bytes], Request]
    # response -> (meta, payload)
    encode_response: Callable[[Any], tuple[Any, bytes]]
    # (request id, meta, payload) -> response; FrameBodyError when malformed
    decode_response: Callable[[int, Any, bytes], Response]


# --- field checks -----------------------------------------------------------------------


def _is_id(v: object) -> bool:
    """A non-negative u64 (ledger ids)."""
    return type(v) is int and 0 <= v <= _U64_MAX


def _is_eid(v: object) -> bool:
    """An entry id or LAC: a u64 or -1 ("none yet" / "last")."""
    return type(v) is int and -1 <= v <= _U64_MAX


def _is_key(v: object) -> bool:
    return type(v) is bytes and len(v) <= MASTER_KEY_BYTES_MAX


def _is_u32(v: object) -> bool:
    return type(v) is int and 0 <= v <= _U32_MAX


def _is_id_list(v: object) -> bool:
    return type(v) is list and all(_is_id(x) for x in v)


def _is_pair(v: object) -> bool:
    return type(v) is list and len(v) == 2 and _is_id(v[0]) and _is_id(v[1])


def _ascending(items: list[Any]) -> bool:
    return all(a < b for a, b in itertools.pairwise(items))


def bad_meta(rid: int, op: int, what: str) -> FrameBodyError:
    return FrameBodyError(f"malformed {Op(op).name} request: {what}", request_id=rid, op=op)


# --- ADD: store one entry ---------------------------------------------------------------


def _add_request(r: AddRequest) -> tuple[int, Meta, bytes]:
    flags = FLAG_RECOVERY if r.recovery else 0
    return flags, [r.ledger_id, r.entry_id, r.lac, r.master_key], r.payload


def _add_request_of(rid: int, flags: int, m: Meta, payload: bytes) -> AddRequest:
    if len(m) != 4:
        raise bad_meta(rid, Op.ADD, "expected [ledger_id, entry_id, lac, master_key]")
    ledger_id, entry_id, lac, key = m
    if not (_is_id(ledger_id) and _is_id(entry_id) and _is_eid(lac) and _is_key(key)):
        raise bad_meta(rid, Op.ADD, "field types or ranges")
    if flags & FLAG_FENCE:
        raise bad_meta(rid, Op.ADD, "FENCE flag on ADD")
    return AddRequest(rid, ledger_id, entry_id, lac, key, payload, bool(flags & FLAG_RECOVERY))


def _add_response(r: AddResponse) -> tuple[Meta, bytes]:
    return [r.ledger_id, r.entry_id], b""


def _add_response_of(rid: int, m: Meta, _payload: bytes) -> AddResponse:
    if len(m) != 2 or not (_is_id(m[0]) and _is_id(m[1])):
        raise bad_meta(rid, Op.ADD, "expected [ledger_id, entry_id]")
    return AddResponse(rid, m[0], m[1])


# --- READ: one entry (entry_id -1: the last held), optionally fencing first ---------------


def _read_request(r: ReadRequest) -> tuple[int, Meta, bytes]:
    flags = FLAG_FENCE if r.fence else 0
    return flags, [r.ledger_id, r.entry_id, r.master_key], b""


def _read_request_of(rid: int, flags: int, m: Meta, _payload: bytes) -> ReadRequest:
    if len(m) != 3:
        raise bad_meta(rid, Op.READ, "expected [ledger_id, entry_id, master_key]")
    ledger_id, entry_id, key = m
    if not (_is_id(ledger_id) and _is_eid(entry_id) and _is_key(key)):
        raise bad_meta(rid, Op.READ, "field types or ranges")
    return ReadRequest(rid, ledger_id, entry_id, bool(flags & FLAG_FENCE), key)


def _read_response(r: ReadResponse) -> tuple[Meta, bytes]:
    return [r.ledger_id, r.entry_id, r.lac], r.payload


def _read_response_of(rid: int, m: Meta, payload: bytes) -> ReadResponse:
    if len(m) != 3 or not (_is_id(m[0]) and _is_id(m[1]) and _is_eid(m[2])):
        raise bad_meta(rid, Op.READ, "expected [ledger_id, entry_id, lac]")
    return ReadResponse(rid, m[0], m[1], m[2], payload)


# --- READ_LAC: long poll for the LAC, with the next entry (or a run: LAC_ENTRIES) --------


def _read_lac_request(r: ReadLacRequest) -> tuple[int, Meta, bytes]:
    fields = [r.ledger_id, r.previous_lac, r.timeout_ms, r.piggyback_bytes_max, r.master_key]
    return 0, fields, b""


def _read_lac_request_of(rid: int, _flags: int, m: Meta, _payload: bytes) -> ReadLacRequest:
    if len(m) != 5:
        raise bad_meta(
            rid,
            Op.READ_LAC,
            "expected [ledger_id, previous_lac, timeout_ms, bytes_max, master_key]",
        )
    ledger_id, previous_lac, timeout_ms, bytes_max, key = m
    if not (
        _is_id(ledger_id)
        and _is_eid(previous_lac)
        and _is_u32(timeout_ms)
        and _is_u32(bytes_max)
        and _is_key(key)
    ):
        raise bad_meta(rid, Op.READ_LAC, "field types or ranges")
    return ReadLacRequest(rid, ledger_id, previous_lac, timeout_ms, bytes_max, key)


def _read_lac_response(r: ReadLacResponse) -> tuple[Meta, bytes]:
    first = r.next_entry
    if not r.run_form:
        if r.more_entries:
            raise ValueError("more_entries need the run form")
        return [r.ledger_id, r.lac, r.next_entry_id], first if first is not None else b""
    run = () if first is None else (first, *r.more_entries)
    return [r.ledger_id, r.lac, r.next_entry_id, [len(e) for e in run]], b"".join(run)


def _read_lac_response_of(rid: int, m: Meta, payload: bytes) -> ReadLacResponse:
    op = Op.READ_LAC
    if len(m) not in (3, 4) or not (_is_id(m[0]) and _is_eid(m[1])):
        raise bad_meta(rid, op, "expected [ledger_id, lac, next_entry_id(, lengths)]")
    if len(m) == 4:
        return _read_lac_run(rid, m, payload)
    if m[2] is None:
        if payload:
            raise bad_meta(rid, op, "payload without next_entry_id")
        return ReadLacResponse(rid, m[0], m[1], None, None)
    if not _is_id(m[2]):
        raise bad_meta(rid, op, "next_entry_id")
    return ReadLacResponse(rid, m[0], m[1], m[2], payload)


def _read_lac_run(rid: int, m: Meta, payload: bytes) -> ReadLacResponse:
    """The four-field READ_LAC answer: entries ``next_entry_id ..`` cut by lengths."""
    op = Op.READ_LAC
    ledger_id, lac, first_id, lengths = m
    if not (type(lengths) is list and all(type(n) is int and n >= 0 for n in lengths)):
        raise bad_meta(rid, op, "lengths")
    if sum(lengths) != len(payload):
        raise bad_meta(rid, op, "lengths do not add up to the payload")
    if first_id is None:
        if lengths:
            raise bad_meta(rid, op, "entries without next_entry_id")
        return ReadLacResponse(rid, ledger_id, lac, None, None, (), True)
    if not _is_id(first_id) or not lengths or first_id + len(lengths) - 1 > lac:
        raise bad_meta(rid, op, "next_entry_id or entries past the LAC")
    entries = []
    pos = 0
    for n in lengths:
        entries.append(payload[pos : pos + n])
        pos += n
    return ReadLacResponse(rid, ledger_id, lac, first_id, entries[0], tuple(entries[1:]), True)


# --- INFO: state, disk usage, id and optional features of the bookie ---------------------


def _info_request(_r: InfoRequest) -> tuple[int, Meta, bytes]:
    return 0, [], b""


def _info_request_of(rid: int, _flags: int, m: Meta, _payload: bytes) -> InfoRequest:
    if m:
        raise bad_meta(rid, Op.INFO, "expected []")
    return InfoRequest(rid)


def _info_response(r: InfoResponse) -> tuple[dict[str, Any], bytes]:
    i = r.info
    fields: dict[str, Any] = {
        "bookie_id": i.bookie_id,
        "state": i.state,
        "used_fraction": i.used_fraction,
        "free_bytes": i.free_bytes,
        "total_bytes": i.total_bytes,
    }
    if i.features:
        fields["features"] = list(i.features)
    return fields, b""


def _info_response_of(rid: int, m: Any, _payload: bytes) -> InfoResponse:
    if type(m) is not dict:
        raise bad_meta(rid, Op.INFO, "INFO response must be a map")
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
        raise bad_meta(rid, Op.INFO, f"INFO fields: {exc}") from exc
    return InfoResponse(rid, info)


# --- LIST_LEDGERS: ids of the ledgers held ------------------------------------------------


def _list_ledgers_request(_r: ListLedgersRequest) -> tuple[int, Meta, bytes]:
    return 0, [], b""


def _list_ledgers_request_of(rid: int, _flags: int, m: Meta, _payload: bytes) -> ListLedgersRequest:
    if m:
        raise bad_meta(rid, Op.LIST_LEDGERS, "expected []")
    return ListLedgersRequest(rid)


def _list_ledgers_response(r: ListLedgersResponse) -> tuple[Meta, bytes]:
    return [list(r.ledger_ids)], b""


def _list_ledgers_response_of(rid: int, m: Meta, _payload: bytes) -> ListLedgersResponse:
    if len(m) != 1 or not _is_id_list(m[0]):
        raise bad_meta(rid, Op.LIST_LEDGERS, "expected [[ledger_id, ...]]")
    return ListLedgersResponse(rid, tuple(m[0]))


# --- LIST_ENTRIES: ids of one ledger's entries held ---------------------------------------


def _list_entries_request(r: ListEntriesRequest) -> tuple[int, Meta, bytes]:
    return 0, [r.ledger_id, r.master_key], b""


def _list_entries_request_of(rid: int, _flags: int, m: Meta, _payload: bytes) -> ListEntriesRequest:
    if len(m) != 2 or not _is_id(m[0]) or not _is_key(m[1]):
        raise bad_meta(rid, Op.LIST_ENTRIES, "expected [ledger_id, master_key]")
    return ListEntriesRequest(rid, m[0], m[1])


def _list_entries_response(r: ListEntriesResponse) -> tuple[Meta, bytes]:
    return [r.ledger_id, list(r.entry_ids)], b""


def _list_entries_response_of(rid: int, m: Meta, _payload: bytes) -> ListEntriesResponse:
    if len(m) != 2 or not _is_id(m[0]) or not _is_id_list(m[1]):
        raise bad_meta(rid, Op.LIST_ENTRIES, "expected [ledger_id, [entry_id, ...]]")
    return ListEntriesResponse(rid, m[0], tuple(m[1]))


# --- WRITE_LAC: the explicit LAC --------------------------------------------------------------


def _write_lac_request(r: WriteLacRequest) -> tuple[int, Meta, bytes]:
    return 0, [r.ledger_id, r.lac, r.master_key], b""


def _write_lac_request_of(rid: int, _flags: int, m: Meta, _payload: bytes) -> WriteLacRequest:
    if len(m) != 3:
        raise bad_meta(rid, Op.WRITE_LAC, "expected [ledger_id, lac, master_key]")
    ledger_id, lac, key = m
    if not (_is_id(ledger_id) and _is_eid(lac) and _is_key(key)):
        raise bad_meta(rid, Op.WRITE_LAC, "field types or ranges")
    return WriteLacRequest(rid, ledger_id, lac, key)


def _write_lac_response(r: WriteLacResponse) -> tuple[Meta, bytes]:
    return [r.ledger_id, r.lac], b""


def _write_lac_response_of(rid: int, m: Meta, _payload: bytes) -> WriteLacResponse:
    if len(m) != 2 or not (_is_id(m[0]) and _is_eid(m[1])):
        raise bad_meta(rid, Op.WRITE_LAC, "expected [ledger_id, lac]")
    return WriteLacResponse(rid, m[0], m[1])


# --- LIST_DAMAGED: one page of the entries found damaged (REPLICA_CHECK) -------------------


def _list_damaged_request(r: ListDamagedRequest) -> tuple[int, Meta, bytes]:
    return 0, [r.from_ledger_id, r.from_entry_id], b""


def _list_damaged_request_of(rid: int, _flags: int, m: Meta, _payload: bytes) -> ListDamagedRequest:
    if len(m) != 2 or not (_is_id(m[0]) and _is_id(m[1])):
        raise bad_meta(rid, Op.LIST_DAMAGED, "expected [from_ledger_id, from_entry_id]")
    return ListDamagedRequest(rid, m[0], m[1])


def _list_damaged_response(r: ListDamagedResponse) -> tuple[Meta, bytes]:
    nxt = list(r.next_from) if r.next_from is not None else None
    return [[list(pair) for pair in r.damaged], nxt], b""


def _list_damaged_response_of(rid: int, m: Meta, _payload: bytes) -> ListDamagedResponse:
    op = Op.LIST_DAMAGED
    if len(m) != 2 or type(m[0]) is not list or not all(_is_pair(x) for x in m[0]):
        raise bad_meta(rid, op, "expected [[[ledger_id, entry_id], ...], next]")
    pairs = [(x[0], x[1]) for x in m[0]]
    if len(pairs) > DAMAGED_PAGE_ENTRIES_MAX or not _ascending(pairs):
        raise bad_meta(rid, op, "damaged pairs not ascending or too many")
    nxt = m[1]
    if nxt is None:
        return ListDamagedResponse(rid, tuple(pairs), None)
    if not _is_pair(nxt) or (pairs and (nxt[0], nxt[1]) <= pairs[-1]):
        raise bad_meta(rid, op, "next must be a pair after the page")
    return ListDamagedResponse(rid, tuple(pairs), (nxt[0], nxt[1]))


# --- ENTRY_CHECKSUMS: CRC32C and length of a range's stored entries (REPLICA_CHECK) -------


def _entry_checksums_request(r: EntryChecksumsRequest) -> tuple[int, Meta, bytes]:
    return 0, [r.ledger_id, r.first_entry_id, r.last_entry_id], b""


def _entry_checksums_request_of(
    rid: int, _flags: int, m: Meta, _payload: bytes
) -> EntryChecksumsRequest:
    op = Op.ENTRY_CHECKSUMS
    if len(m) != 3 or not (_is_id(m[0]) and _is_id(m[1]) and _is_id(m[2])):
        raise bad_meta(rid, op, "expected [ledger_id, first_entry_id, last_entry_id]")
    if m[1] > m[2]:
        raise bad_meta(rid, op, "first_entry_id after last_entry_id")
    return EntryChecksumsRequest(rid, m[0], m[1], m[2])


def _entry_checksums_response(r: EntryChecksumsResponse) -> tuple[Meta, bytes]:
    sums = [[c.entry_id, c.crc32c, c.length] for c in r.checksums]
    return [r.ledger_id, r.last_entry_id, sums, list(r.damaged)], b""


def _entry_checksums_response_of(rid: int, m: Meta, _payload: bytes) -> EntryChecksumsResponse:
    op = Op.ENTRY_CHECKSUMS
    if len(m) != 4 or not (_is_id(m[0]) and _is_id(m[1])):
        raise bad_meta(rid, op, "expected [ledger_id, last_entry_id, [[id, crc, len], ...], [id]]")
    ledger_id, last, sums, damaged = m
    if type(sums) is not list or not all(
        type(x) is list and len(x) == 3 and _is_id(x[0]) and _is_u32(x[1]) and _is_u32(x[2])
        for x in sums
    ):
        raise bad_meta(rid, op, "checksums must be [entry_id, crc32c, length] triples")
    if not _is_id_list(damaged):
        raise bad_meta(rid, op, "damaged must be entry ids")
    ids = [x[0] for x in sums]
    if len(ids) + len(damaged) > CHECKSUM_RANGE_ENTRIES_MAX:
        raise bad_meta(rid, op, "more entries than one answer may cover")
    if not (_ascending(ids) and _ascending(damaged)) or set(ids) & set(damaged):
        raise bad_meta(rid, op, "entry ids not ascending or listed twice")
    if (ids and ids[-1] > last) or (damaged and damaged[-1] > last):
        raise bad_meta(rid, op, "entries past last_entry_id")
    checksums = tuple(EntryChecksum(x[0], x[1], x[2]) for x in sums)
    return EntryChecksumsResponse(rid, ledger_id, last, checksums, tuple(damaged))


# --- AUTH: who is on this connection ---------------------------------------------------------

# A token longer than this is garbage (foundation.auth refuses it too).
TOKEN_CHARS_MAX: Final = 1024


def _auth_request(r: AuthRequest) -> tuple[int, Meta, bytes]:
    return 0, [r.token], b""


def _auth_request_of(rid: int, _flags: int, m: Meta, _payload: bytes) -> AuthRequest:
    if len(m) != 1 or type(m[0]) is not str or len(m[0]) > TOKEN_CHARS_MAX:
        raise bad_meta(rid, Op.AUTH, "expected [token]")
    return AuthRequest(rid, m[0])


def _auth_response(r: AuthResponse) -> tuple[Meta, bytes]:
    return [r.principal], b""


def _auth_response_of(rid: int, m: Meta, _payload: bytes) -> AuthResponse:
    if len(m) != 1 or type(m[0]) is not str:
        raise bad_meta(rid, Op.AUTH, "expected [principal]")
    return AuthResponse(rid, m[0])


# --- HELLO: the bookie proves it belongs to the cluster ----------------------------------

NONCE_BYTES_MIN: Final = 16
NONCE_BYTES_MAX: Final = 64
_ID_CHARS_MAX: Final = 1024


def _hello_request(r: HelloRequest) -> tuple[int, Meta, bytes]:
    return 0, [r.nonce], b""


def _hello_request_of(rid: int, _flags: int, m: Meta, _payload: bytes) -> HelloRequest:
    if (
        len(m) != 1
        or type(m[0]) is not bytes
        or not NONCE_BYTES_MIN <= len(m[0]) <= NONCE_BYTES_MAX
    ):
        raise bad_meta(rid, Op.HELLO, "expected [nonce]")
    return HelloRequest(rid, m[0])


def _hello_response(r: HelloResponse) -> tuple[Meta, bytes]:
    return [r.bookie_id, r.address, r.proof], b""


def _hello_response_of(rid: int, m: Meta, _payload: bytes) -> HelloResponse:
    if (
        len(m) != 3
        or not all(type(x) is str and len(x) <= _ID_CHARS_MAX for x in m[:2])
        or type(m[2]) is not bytes
        or len(m[2]) != 32
    ):
        raise bad_meta(rid, Op.HELLO, "expected [bookie_id, address, proof]")
    return HelloResponse(rid, m[0], m[1], m[2])


# --- the table ------------------------------------------------------------------------------

_R, _F = FLAG_RECOVERY, FLAG_FENCE
# fmt: off
TABLE: Final = (
    #       op, request, response, flags, payload, map; then encode/decode request, response
    OpCodec(Op.ADD, AddRequest, AddResponse, _R | _F, True, False,
            _add_request, _add_request_of, _add_response, _add_response_of),
    OpCodec(Op.READ, ReadRequest, ReadResponse, _F, False, False,
            _read_request, _read_request_of, _read_response, _read_response_of),
    OpCodec(Op.READ_LAC, ReadLacRequest, ReadLacResponse, 0, False, False,
            _read_lac_request, _read_lac_request_of, _read_lac_response, _read_lac_response_of),
    OpCodec(Op.INFO, InfoRequest, InfoResponse, 0, False, True,
            _info_request, _info_request_of, _info_response, _info_response_of),
    OpCodec(Op.LIST_LEDGERS, ListLedgersRequest, ListLedgersResponse, 0, False, False,
            _list_ledgers_request, _list_ledgers_request_of,
            _list_ledgers_response, _list_ledgers_response_of),
    OpCodec(Op.LIST_ENTRIES, ListEntriesRequest, ListEntriesResponse, 0, False, False,
            _list_entries_request, _list_entries_request_of,
            _list_entries_response, _list_entries_response_of),
    OpCodec(Op.WRITE_LAC, WriteLacRequest, WriteLacResponse, 0, False, False,
            _write_lac_request, _write_lac_request_of,
            _write_lac_response, _write_lac_response_of),
    OpCodec(Op.LIST_DAMAGED, ListDamagedRequest, ListDamagedResponse, 0, False, False,
            _list_damaged_request, _list_damaged_request_of,
            _list_damaged_response, _list_damaged_response_of),
    OpCodec(Op.ENTRY_CHECKSUMS, EntryChecksumsRequest, EntryChecksumsResponse, 0, False, False,
            _entry_checksums_request, _entry_checksums_request_of,
            _entry_checksums_response, _entry_checksums_response_of),
    OpCodec(Op.AUTH, AuthRequest, AuthResponse, 0, False, False,
            _auth_request, _auth_request_of, _auth_response, _auth_response_of),
    OpCodec(Op.HELLO, HelloRequest, HelloResponse, 0, False, False,
            _hello_request, _hello_request_of, _hello_response, _hello_response_of),
)
# fmt: on
BY_OP: Final[dict[int, OpCodec]] = {int(c.op): c for c in TABLE}
BY_REQUEST: Final[dict[type, OpCodec]] = {c.request: c for c in TABLE}
BY_RESPONSE: Final[dict[type, OpCodec]] = {c.response: c for c in TABLE}
