"""Writes over HTTP: the write request, its records and its answer. Sans-I/O.

Write request (``POST /v1/streams/{name}/records``)::

    {"producer": str?,          # producer id (idempotence); omit for fire-and-forget
     "epoch": int?,             # the producer's epoch on this stream (default 0)
     "seq": int?,               # sequence number of the first record (required with producer)
     "payloads": [bytes | null, ...]   # plain records,
     "keys": [bytes | null, ...]?   # with payloads: their keys (as many as payloads)
     "records": [{"payload": bytes | null, "key": bytes?,
                  "headers": [[str, bytes | null], ...]?,
                  "timestamp": int?, "txid": int?}, ...],   # or full records
     "crc": int?}               # CRC32C of all payloads concatenated (msgpack clients)

``payloads`` + ``keys`` is the compact form of keyed records without headers, txids or
timestamps (what a topic producer sends): two flat lists, no map per record.

A record's value may be null (``payload: null``): Kafka's null value, a tombstone when
the record is keyed. ``headers`` are Kafka's: an ordered list of ``[name, value]``
pairs, names may repeat, a value may be null; in JSON a value is UTF-8 text, or all
values are base64 under ``headers_b64``; an object ``{name: value}`` is still taken
(its items in order). ``timestamp`` is the producer's time in ms since the epoch
(Kafka's CreateTime); without it the log stamps the append time. A topic whose
``timestamp_type`` is LogAppendTime overwrites it.

Record ``i`` of the request has producer sequence ``seq + i`` within ``epoch``. A producer
bumps its epoch after a batch failed for good and starts again at sequence 0; the proxy
then refuses older epochs of it (PRODUCER_FENCED) -- see docs/proxies.md. The answer
carries the records' DLSNs: JSON ``{"dlsns": ["seg:entry:slot", ...]}``, msgpack
``{"runs": [[seg, entry, first_slot, count], ...]}`` (consecutive slots of one entry
collapse into one run; a 1000-record batch is a handful of runs), plus ``"duplicates":
n`` when the first ``n`` records were retries (and ``"dlsn"`` for one record in JSON).
It also carries their *offsets* (sequence ids in the stream: 0, 1, 2, ... across
segments; a topic partition's offsets): JSON ``"offsets": [n, ...]`` (and ``"offset"``
for one record), msgpack ``"offset_runs": [[first, count], ...]`` (consecutive offsets
collapse; a request's new records are consecutive, retries answered from the proxy's
table carry their original offsets).

Header names starting ``bl.`` are reserved: Bookline's producer markers were stored
under them before they moved into the record set (:mod:`serving.write.dedup`), and
every reader still drops them from old data. The route
hands the write core a ``serving.write.batch.WriteBatch`` made of the request's lists
(no copy).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any, Final, cast

import crc32c

from foundation.errors import BadRequestError
from foundation.limits import record_bytes
from httpapi.positions import format_dlsn, parse_dlsn
from httpapi.wire import MSGPACK, get_bytes, get_header_pairs, get_int
from streams.dlsn import DLSN, DLSNSequence

__all__ = [
    "EPOCH_MAX",
    "TIMESTAMP_MAX",
    "HeaderPairs",
    "HeadersLike",
    "WireRecord",
    "WriteRequest",
    "answer_count",
    "answer_dlsns",
    "answer_offsets",
    "checked_headers",
    "decode_offset_runs",
    "decode_runs",
    "encode_offset_runs",
    "encode_runs",
    "parse_write",
    "payloads_crc",
    "write_answer",
    "write_body",
]


# Builds a DLSN (a tuple subclass) without a Python-level call.
_NEW_DLSN = tuple.__new__
# A producer id is a client-chosen token (uuid4 hex); bounded so a table entry is small.
PRODUCER_CHARS_MAX: Final = 64
# Producer sequences are unsigned 63-bit (JSON-safe enough and fits msgpack int64).
SEQ_MAX: Final = (1 << 63) - 1
# Producer epochs fit the 4-byte header; a client that runs out takes a new producer id.
EPOCH_MAX: Final = (1 << 31) - 1
TXID_MAX: Final = (1 << 63) - 1
# Headers per record and their sizes: metadata, not a second payload.
HEADERS_PER_RECORD_MAX: Final = 32
HEADER_KEY_CHARS_MAX: Final = 128
# Producer timestamps are ms since the epoch, non-negative, within an int64 like Kafka's.
TIMESTAMP_MAX: Final = (1 << 63) - 1
RESERVED_HEADER_PREFIX: Final = "bl."

# Kafka's headers: ordered (name, value) pairs, names may repeat, values may be null.
HeaderPairs = list[tuple[str, bytes | None]]
# What callers may give: such pairs (text values are UTF-8) or a mapping (its items).
HeadersLike = Mapping[str, bytes | str | None] | Iterable[tuple[str, bytes | str | None]]


# -- records ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WireRecord:
    """A record to write, as a request carries it."""

    payload: bytes | None  # None: Kafka's null value
    key: bytes | None = None
    headers: HeaderPairs | None = None
    txid: int | None = None
    timestamp_ms: int | None = None  # the producer's (CreateTime); None: the log's

    @property
    def size_bytes(self) -> int:
        """The size every record limit counts (:func:`foundation.limits.record_bytes`)."""
        return record_bytes(self.payload, self.key, self.headers)

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"payload": self.payload}
        if self.key is not None:
            out["key"] = self.key
        if self.headers:
            out["headers"] = [list(h) for h in self.headers]
        if self.txid is not None:
            out["txid"] = self.txid
        if self.timestamp_ms is not None:
            out["timestamp"] = self.timestamp_ms
        return out


def checked_headers(value: HeadersLike | None) -> HeaderPairs | None:
    """Headers a caller gave (pairs or a mapping; text values UTF-8) as checked pairs,
    order and repeated names kept; None for none. BAD_REQUEST for a malformed header,
    too many of them or the reserved ``bl.`` prefix."""
    if value is None:
        return None
    items: Any = value.items() if isinstance(value, Mapping) else value  # from a body: any
    if isinstance(items, str | bytes) or not isinstance(items, Iterable):
        raise BadRequestError("headers are a list of (name, value) pairs or a mapping")
    out: HeaderPairs = []
    for item in items:
        if not isinstance(item, tuple | list) or len(item) != 2:
            raise BadRequestError("each header is a (name, value) pair")
        out.append(_header(*item))
        if len(out) > HEADERS_PER_RECORD_MAX:
            raise BadRequestError(f"at most {HEADERS_PER_RECORD_MAX} headers per record")
    return out or None


def _header(name: object, value: object) -> tuple[str, bytes | None]:
    if not isinstance(name, str) or not name or len(name) > HEADER_KEY_CHARS_MAX:
        raise BadRequestError(f"header names must be 1..{HEADER_KEY_CHARS_MAX} characters")
    if name.startswith(RESERVED_HEADER_PREFIX):
        raise BadRequestError(f"header {name!r}: the prefix {RESERVED_HEADER_PREFIX!r} is reserved")
    if value is None or isinstance(value, bytes):
        return (name, value)
    if isinstance(value, str):
        return (name, value.encode("utf-8"))
    if isinstance(value, bytearray | memoryview):
        return (name, bytes(value))
    raise BadRequestError(f"header {name!r} must be bytes, text or null")


# What one record of a ``records`` list may carry ("_b64": bytes as base64 in JSON).
RECORD_FIELDS: Final = frozenset(
    {"payload", "payload_b64", "key", "key_b64", "headers", "headers_b64", "timestamp", "txid"}
)


def _value(obj: Mapping[str, Any]) -> bytes | None:
    """A record's value: null (Kafka's null value) when ``payload`` is given as null."""
    if obj.get("payload") is None and obj.get("payload_b64") is None:
        if "payload" in obj or "payload_b64" in obj:
            return None
        raise BadRequestError("missing field 'payload' (null for a null value)")
    return get_bytes(obj, "payload")


def _record(obj: Any) -> WireRecord:
    if not isinstance(obj, dict):
        raise BadRequestError("each record must be an object")
    unknown = obj.keys() - RECORD_FIELDS
    if unknown:
        names = ", ".join(sorted(str(k)[:100] for k in unknown))
        raise BadRequestError(f"unknown field(s) in a record: {names}")
    return WireRecord(
        payload=_value(obj),
        key=get_bytes(obj, "key"),
        headers=checked_headers(get_header_pairs(obj, "headers")),
        txid=get_int(obj, "txid", 0, TXID_MAX),
        timestamp_ms=get_int(obj, "timestamp", 0, TIMESTAMP_MAX),
    )


class WriteRequest:
    """A validated write. A ``payloads`` body keeps its list of payloads (``payloads``,
    and ``keys`` when it has them) and makes :class:`WireRecord` objects only if asked
    (``records``): the write proxy's fast path hands them to the writer directly."""

    __slots__ = ("_records", "epoch", "keys", "payloads", "producer", "seq")

    def __init__(
        self,
        producer: str | None,
        seq: int | None,
        records: list[WireRecord] | None = None,
        payloads: list[bytes] | None = None,
        epoch: int = 0,
        *,
        keys: list[bytes | None] | None = None,
    ) -> None:
        if (records is None) == (payloads is None):
            raise BadRequestError("a write request has records or payloads, not both")
        if keys is not None and (payloads is None or len(keys) != len(payloads)):
            raise BadRequestError("keys go with payloads, one each")
        self.producer = producer
        self.seq = seq
        self.epoch = epoch
        self._records = records
        self.payloads = payloads
        self.keys = keys

    @property
    def records(self) -> list[WireRecord]:
        if self._records is None:
            assert self.payloads is not None  # one of the two, checked above
            if self.keys is None:
                self._records = [WireRecord(p) for p in self.payloads]
            else:
                self._records = list(map(WireRecord, self.payloads, self.keys))
        return self._records

    @property
    def count(self) -> int:
        return len(self.payloads) if self.payloads is not None else len(self.records)


def payloads_crc(payloads: Iterable[bytes | None]) -> int:
    """CRC32C of the payloads concatenated, null values adding nothing (one C call over
    the joined bytes)."""
    return int(crc32c.crc32c(b"".join(filter(None, payloads))))


def parse_write(obj: Mapping[str, Any], *, records_max: int) -> WriteRequest:
    """Validate a write body (one record or a batch) into a :class:`WriteRequest`."""
    producer = obj.get("producer")
    if producer is not None and (
        not isinstance(producer, str) or not 0 < len(producer) <= PRODUCER_CHARS_MAX
    ):
        raise BadRequestError(f"producer must be a string of 1..{PRODUCER_CHARS_MAX} characters")
    seq = get_int(obj, "seq", 0, SEQ_MAX)
    if producer is not None and seq is None:
        raise BadRequestError("a producer id needs a sequence number 'seq'")
    epoch = get_int(obj, "epoch", 0, EPOCH_MAX) or 0
    if epoch and producer is None:
        raise BadRequestError("an epoch belongs to a producer id")
    if "keys" in obj and "payloads" not in obj:
        raise BadRequestError("keys go with payloads (records carry their own keys)")
    if "payloads" in obj:
        raw = obj["payloads"]
        if not isinstance(raw, list):
            raise BadRequestError("payloads must be a list")
        payloads: list[bytes] = raw
        if set(map(type, raw)) - {bytes}:  # text, null or junk: convert or refuse (C-level scan)
            values = [None if p is None else _payload(p) for p in raw]
            keys = _keys(obj.get("keys"), len(values))
            if None in values:  # null values travel as records (the columns are bytes)
                nulls = [
                    WireRecord(v, k)
                    for v, k in zip(values, keys or [None] * len(values), strict=True)
                ]
                return _checked(
                    WriteRequest(producer, seq, records=nulls, epoch=epoch), obj, records_max
                )
            payloads = cast("list[bytes]", values)
        keys = _keys(obj.get("keys"), len(payloads))
        return _checked(
            WriteRequest(producer, seq, payloads=payloads, epoch=epoch, keys=keys), obj, records_max
        )
    elif "records" in obj:
        raw = obj["records"]
        if not isinstance(raw, list):
            raise BadRequestError("records must be a list")
        records = [_record(r) for r in raw]
    elif "payload" in obj or "payload_b64" in obj:
        records = [_record(obj)]
    else:
        raise BadRequestError("a write needs 'payload', 'payloads' or 'records'")
    return _checked(WriteRequest(producer, seq, records=records, epoch=epoch), obj, records_max)


def _keys(raw: object, count: int) -> list[bytes | None] | None:
    if raw is None:
        return None
    if not isinstance(raw, list) or len(raw) != count:
        raise BadRequestError("keys must be a list with one key (or null) per payload")
    keys: list[bytes | None] = raw
    if not all(type(k) is bytes or k is None for k in raw):  # text or junk
        keys = [None if k is None else _payload(k) for k in raw]
    return keys


def _payload(value: object) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    raise BadRequestError("each payload must be bytes or text")


def _checked(req: WriteRequest, obj: Mapping[str, Any], records_max: int) -> WriteRequest:
    count, seq = req.count, req.seq
    if not count:
        raise BadRequestError("a write needs at least one record")
    if count > records_max:
        raise BadRequestError(f"{count} records in one request; at most {records_max}")
    if seq is not None and seq + count - 1 > SEQ_MAX:
        raise BadRequestError("sequence numbers overflow")
    crc = get_int(obj, "crc", 0, 0xFFFFFFFF)
    if crc is not None:
        payloads = req.payloads if req.payloads is not None else [r.payload for r in req.records]
        if crc != payloads_crc(payloads):
            raise BadRequestError("payload checksum mismatch (crc)")
    return req


def write_body(
    records: Sequence[WireRecord], producer: str | None, seq: int | None, epoch: int = 0
) -> dict[str, Any]:
    """The client side of :func:`parse_write` (compact form when records are plain)."""
    body: dict[str, Any] = {}
    if producer is not None:
        body["producer"] = producer
        body["seq"] = seq
        if epoch:
            body["epoch"] = epoch
    payloads = [r.payload for r in records]
    if all(not r.headers and r.txid is None and r.timestamp_ms is None for r in records):
        body["payloads"] = payloads
        if any(r.key is not None for r in records):
            body["keys"] = [r.key for r in records]
    else:
        payloads = [r.payload for r in records]
        body["records"] = [r.to_wire() for r in records]
    body["crc"] = payloads_crc(payloads)
    return body


# -- DLSN runs (compact batch answers) --------------------------------------------------


def encode_runs(dlsns: Iterable[tuple[int, int, int]]) -> list[list[int]]:
    if isinstance(dlsns, DLSNSequence):  # a writer's answer: already runs (one per entry)
        return _merged_runs(dlsns.runs)
    runs: list[list[int]] = []
    last: list[int] | None = None
    for seg, entry, slot in dlsns:
        if last is not None and last[0] == seg and last[1] == entry and last[2] + last[3] == slot:
            last[3] += 1
        else:
            last = [seg, entry, slot, 1]
            runs.append(last)
    return runs


def _merged_runs(given: Iterable[tuple[int, int, int, int]]) -> list[list[int]]:
    """Runs as :func:`encode_runs` gives them: adjacent ones of one entry joined."""
    runs: list[list[int]] = []
    last: list[int] | None = None
    for seg, entry, slot, count in given:
        if last is not None and last[0] == seg and last[1] == entry and last[2] + last[3] == slot:
            last[3] += count
        else:
            last = [seg, entry, slot, count]
            runs.append(last)
    return runs


def decode_runs(runs: Any) -> list[DLSN]:
    if not isinstance(runs, list):
        raise BadRequestError("runs must be a list")
    out: list[DLSN] = []
    for run in runs:
        if not isinstance(run, list) or len(run) != 4:
            raise BadRequestError("each run is [segment, entry, first_slot, count]")
        seg, entry, slot, count = run
        # C-level: one tuple.__new__ per DLSN, no Python call per record
        parts = zip(
            repeat(seg, count), repeat(entry, count), range(slot, slot + count), strict=True
        )
        out.extend(map(_NEW_DLSN, repeat(DLSN, count), parts))
    return out


def encode_offset_runs(offsets: Iterable[int]) -> list[list[int]]:
    """``[[first, count], ...]``: consecutive offsets collapse into one run."""
    if (
        isinstance(offsets, list)
        and offsets
        and offsets == list(range(offsets[0], offsets[0] + len(offsets)))
    ):  # a batch's new records (the usual answer): one run, compared in C
        return [[offsets[0], len(offsets)]]
    runs: list[list[int]] = []
    last: list[int] | None = None
    for offset in offsets:
        if last is not None and last[0] + last[1] == offset:
            last[1] += 1
        else:
            last = [offset, 1]
            runs.append(last)
    return runs


def decode_offset_runs(runs: Any) -> list[int]:
    if not isinstance(runs, list):
        raise BadRequestError("offset_runs must be a list")
    out: list[int] = []
    for run in runs:
        if not (isinstance(run, list) and len(run) == 2 and all(type(x) is int for x in run)):
            raise BadRequestError("each offset run is [first, count]")
        first, count = run
        out.extend(range(first, first + count))
    return out


def write_answer(
    dlsns: Sequence[tuple[int, int, int]],
    media: str,
    duplicates: int = 0,
    offsets: Sequence[int] | None = None,
) -> dict[str, Any]:
    """The answer to a write whose first ``duplicates`` records were retries."""
    if media == MSGPACK:
        answer: dict[str, Any] = {"runs": encode_runs(dlsns)}
        if offsets is not None:
            answer["offset_runs"] = encode_offset_runs(offsets)
    else:
        answer = {"dlsns": [format_dlsn(d) for d in dlsns]}
        if offsets is not None:
            answer["offsets"] = list(offsets)
    if duplicates:
        answer["duplicates"] = duplicates
    if len(dlsns) == 1 and media != MSGPACK:
        answer["dlsn"] = format_dlsn(dlsns[0])
        if offsets is not None:
            answer["offset"] = offsets[0]
    return answer


def answer_dlsns(obj: Mapping[str, Any]) -> list[DLSN]:
    if "runs" in obj:
        return decode_runs(obj["runs"])
    raw = obj.get("dlsns")
    if not isinstance(raw, list):
        raise BadRequestError("answer carries neither runs nor dlsns")
    return [parse_dlsn(d) for d in raw]


def answer_count(obj: Mapping[str, Any]) -> int:
    """How many records a write answer answers (without building their DLSNs)."""
    if "runs" in obj:
        runs = obj["runs"]
        if not isinstance(runs, list) or not all(isinstance(r, list) and len(r) == 4
                                                 for r in runs):  # fmt: skip
            raise BadRequestError("each run is [segment, entry, first_slot, count]")
        return sum(r[3] for r in runs)
    raw = obj.get("dlsns")
    if not isinstance(raw, list):
        raise BadRequestError("answer carries neither runs nor dlsns")
    return len(raw)


def answer_offsets(obj: Mapping[str, Any]) -> list[int] | None:
    """The records' offsets of a write answer (None from a proxy that sends none)."""
    if "offset_runs" in obj:
        return decode_offset_runs(obj["offset_runs"])
    raw = obj.get("offsets")
    if raw is None:
        return None
    if not isinstance(raw, list) or not all(type(x) is int for x in raw):
        raise BadRequestError("offsets must be a list of integers")
    return raw
