"""The proxies' HTTP API as data: paths, media types, body codecs. Sans-I/O.

Shared by the write proxy, the read proxy, the thin client and the CLI; imports no
asyncio, socket or aiohttp, so the fuzz/unit tests hit it directly.

Bodies
------
Two media types carry the same objects:

* ``application/msgpack`` for clients (bytes stay bytes, fast to decode);
* ``application/json`` for humans (bytes as UTF-8 text when they decode, otherwise
  base64 under a ``*_b64`` key).

The server answers in the type the ``Accept`` header prefers (msgpack only when asked
for), reads the type ``Content-Type`` names (JSON when absent). Versioning is in the
path (``/v1/...``); an incompatible change gets ``/v2``.

Write request (``POST /v1/streams/{name}/records``)::

    {"producer": str?,          # producer id (idempotence); omit for fire-and-forget
     "epoch": int?,             # the producer's epoch on this stream (default 0)
     "seq": int?,               # sequence number of the first record (required with producer)
     "payloads": [bytes, ...]   # plain records, or:
     "records": [{"payload": bytes, "key": bytes?, "headers": {str: bytes}?,
                  "txid": int?}, ...],
     "crc": int?}               # CRC32C of all payloads concatenated (msgpack clients)

Record ``i`` of the request has producer sequence ``seq + i`` within ``epoch``. A producer
bumps its epoch after a batch failed for good and starts again at sequence 0; the proxy
then refuses older epochs of it (PRODUCER_FENCED) -- see docs/proxies.md. The answer
carries the
records' DLSNs: JSON ``{"dlsns": ["seg:entry:slot", ...]}``, msgpack
``{"runs": [[seg, entry, first_slot, count], ...]}`` (consecutive slots of one entry
collapse into one run; a 1000-record batch is a handful of runs).

Read answer (``GET /v1/streams/{name}/records``)::

    {"records": [{"dlsn": "s:e:s", "seq": int, "txid": int, "ts": int,
                  "payload": bytes, "key": bytes?, "headers": {...}?}, ...],
     "next": "seq:N"}          # where to continue

Every error is ``{"code": int, "name": str, "message": str}`` (plus ``"owner"`` for
OWNER_MOVED) with the stable codes of :mod:`foundation.errors`.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import crc32c
import msgpack

from foundation.errors import BadRequestError, BooklineError, OwnerMovedError, for_code
from foundation.limits import record_bytes

__all__ = [
    "API_PREFIX",
    "EPOCH_MAX",
    "JSON",
    "MSGPACK",
    "PRODUCER_EPOCH_HEADER",
    "PRODUCER_HEADER",
    "PRODUCER_SEQ_HEADER",
    "Position",
    "WireRecord",
    "WriteRequest",
    "decode_body",
    "decode_error",
    "decode_runs",
    "encode_body",
    "encode_error",
    "encode_runs",
    "error_body",
    "negotiate",
    "parse_dlsn",
    "parse_position",
    "payloads_crc",
]

API_PREFIX: Final = "/v1"
MSGPACK: Final = "application/msgpack"
JSON: Final = "application/json"
_MSGPACK_ALIASES: Final = frozenset({MSGPACK, "application/x-msgpack", "application/vnd.msgpack"})

# Record headers the write proxy adds to the first record of each producer batch so a
# new owner can rebuild its de-duplication table from the log (see docs/proxies.md).
PRODUCER_HEADER: Final = "bl.producer"
PRODUCER_SEQ_HEADER: Final = "bl.seq"
PRODUCER_COUNT_HEADER: Final = "bl.count"
# The batch's producer epoch (4 bytes big-endian), present when it is not 0.
PRODUCER_EPOCH_HEADER: Final = "bl.epoch"

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


# -- content negotiation -------------------------------------------------------------


def _media(value: str) -> str:
    return value.split(";", 1)[0].strip().lower()


def is_msgpack(content_type: str | None) -> bool:
    return content_type is not None and _media(content_type) in _MSGPACK_ALIASES


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
            if media in _MSGPACK_ALIASES
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
    return json.dumps(_to_json(obj), separators=(",", ":")).encode()


def decode_body(body: bytes, content_type: str | None) -> dict[str, Any]:
    """Decode a request/answer body; BadRequestError when it is not an object."""
    if not body:
        return {}
    try:
        if is_msgpack(content_type):
            obj = msgpack.unpackb(body, raw=False, strict_map_key=True)
        else:
            obj = json.loads(body)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise BadRequestError(f"malformed body: {exc}") from exc
    if not isinstance(obj, dict):
        raise BadRequestError(f"body must be an object, got {type(obj).__name__}")
    return obj


def _to_json(value: Any) -> Any:
    """Bytes become text when they are UTF-8, else ``{"b64": ...}``-free ``*_b64`` keys."""
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for k, v in value.items():
            if isinstance(v, bytes | bytearray | memoryview):
                text = _utf8(bytes(v))
                if text is None:
                    out[f"{k}_b64"] = base64.b64encode(bytes(v)).decode()
                else:
                    out[k] = text
            else:
                out[k] = _to_json(v)
        return out
    if isinstance(value, list | tuple):
        return [_to_json(v) for v in value]
    if isinstance(value, bytes):
        return _utf8(value) or base64.b64encode(value).decode()
    return value


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


def _get_int(obj: Mapping[str, Any], key: str, lo: int, hi: int) -> int | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise BadRequestError(f"field {key!r} must be an integer within {lo}..{hi}")
    return value


# -- records ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WireRecord:
    """A record to write, as a request carries it."""

    payload: bytes
    key: bytes | None = None
    headers: dict[str, bytes] | None = None
    txid: int | None = None

    @property
    def size_bytes(self) -> int:
        """The size every record limit counts (:func:`foundation.limits.record_bytes`)."""
        return record_bytes(self.payload, self.key, self.headers)

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"payload": self.payload}
        if self.key is not None:
            out["key"] = self.key
        if self.headers:
            out["headers"] = self.headers
        if self.txid is not None:
            out["txid"] = self.txid
        return out


def _headers(value: Any) -> dict[str, bytes] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or len(value) > HEADERS_PER_RECORD_MAX:
        raise BadRequestError(f"headers must be an object of at most {HEADERS_PER_RECORD_MAX}")
    out: dict[str, bytes] = {}
    for k, v in value.items():
        if not isinstance(k, str) or not k or len(k) > HEADER_KEY_CHARS_MAX:
            raise BadRequestError(f"header names must be 1..{HEADER_KEY_CHARS_MAX} characters")
        if k.startswith("bl."):
            raise BadRequestError(f"header {k!r}: the prefix 'bl.' is reserved")
        if isinstance(v, bytes):
            out[k] = v
        elif isinstance(v, str):
            out[k] = v.encode("utf-8")
        else:
            raise BadRequestError(f"header {k!r} must be bytes or text")
    return out


def _record(obj: Any) -> WireRecord:
    if not isinstance(obj, dict):
        raise BadRequestError("each record must be an object")
    payload = get_bytes(obj, "payload", required=True)
    assert payload is not None  # required=True
    return WireRecord(
        payload=payload,
        key=get_bytes(obj, "key"),
        headers=_headers(obj.get("headers")),
        txid=_get_int(obj, "txid", 0, TXID_MAX),
    )


class WriteRequest:
    """A validated write. A plain ``payloads`` body keeps its list of payloads
    (``payloads``) and makes :class:`WireRecord` objects only if asked (``records``):
    the write proxy's fast path hands the payloads to the writer directly."""

    __slots__ = ("_records", "epoch", "payloads", "producer", "seq")

    def __init__(
        self,
        producer: str | None,
        seq: int | None,
        records: list[WireRecord] | None = None,
        payloads: list[bytes] | None = None,
        epoch: int = 0,
    ) -> None:
        if (records is None) == (payloads is None):
            raise BadRequestError("a write request has records or payloads, not both")
        self.producer = producer
        self.seq = seq
        self.epoch = epoch
        self._records = records
        self.payloads = payloads

    @property
    def records(self) -> list[WireRecord]:
        if self._records is None:
            assert self.payloads is not None  # one of the two, checked above
            self._records = [WireRecord(p) for p in self.payloads]
        return self._records

    @property
    def count(self) -> int:
        return len(self.payloads) if self.payloads is not None else len(self.records)

    @property
    def size_bytes(self) -> int:
        if self.payloads is not None:
            return sum(map(len, self.payloads))
        return sum(r.size_bytes for r in self.records)

    @property
    def record_bytes_max(self) -> int:
        """The largest record's size."""
        if self.payloads is not None:
            return max(map(len, self.payloads), default=0)
        return max((r.size_bytes for r in self.records), default=0)


def payloads_crc(payloads: Iterable[bytes]) -> int:
    """CRC32C of the payloads concatenated (one C call over the joined bytes)."""
    return int(crc32c.crc32c(b"".join(payloads)))


def parse_write(obj: Mapping[str, Any], *, records_max: int) -> WriteRequest:
    """Validate a write body (one record or a batch) into a :class:`WriteRequest`."""
    producer = obj.get("producer")
    if producer is not None and (
        not isinstance(producer, str) or not 0 < len(producer) <= PRODUCER_CHARS_MAX
    ):
        raise BadRequestError(f"producer must be a string of 1..{PRODUCER_CHARS_MAX} characters")
    seq = _get_int(obj, "seq", 0, SEQ_MAX)
    if producer is not None and seq is None:
        raise BadRequestError("a producer id needs a sequence number 'seq'")
    epoch = _get_int(obj, "epoch", 0, EPOCH_MAX) or 0
    if epoch and producer is None:
        raise BadRequestError("an epoch belongs to a producer id")
    if "payloads" in obj:
        raw = obj["payloads"]
        if not isinstance(raw, list):
            raise BadRequestError("payloads must be a list")
        payloads: list[bytes] = raw
        if not all(type(p) is bytes for p in raw):  # text or junk: convert or refuse
            payloads = [_payload(p) for p in raw]
        return _checked(
            WriteRequest(producer, seq, payloads=payloads, epoch=epoch), obj, records_max
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
    crc = _get_int(obj, "crc", 0, 0xFFFFFFFF)
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
    if all(r.key is None and not r.headers and r.txid is None for r in records):
        payloads = [r.payload for r in records]
        body["payloads"] = payloads
    else:
        payloads = [r.payload for r in records]
        body["records"] = [r.to_wire() for r in records]
    body["crc"] = payloads_crc(payloads)
    return body


# -- positions -------------------------------------------------------------------------

DlsnTuple = tuple[int, int, int]


def parse_dlsn(text: str) -> DlsnTuple:
    parts = text.split(":")
    if len(parts) != 3:
        raise BadRequestError(f"{text!r} is not a DLSN 'segment:entry:slot'")
    try:
        seg, entry, slot = (int(p) for p in parts)
    except ValueError as exc:
        raise BadRequestError(f"{text!r} is not a DLSN 'segment:entry:slot'") from exc
    if seg < 0 or entry < 0 or slot < 0:
        raise BadRequestError(f"{text!r}: DLSN parts must be non-negative")
    return seg, entry, slot


def format_dlsn(dlsn: DlsnTuple) -> str:
    return f"{dlsn[0]}:{dlsn[1]}:{dlsn[2]}"


@dataclass(frozen=True, slots=True)
class Position:
    """A read start: ``earliest``, ``latest``, ``dlsn:s:e:s`` (or bare ``s:e:s``),
    ``seq:N``, ``txid:N`` or ``time:MS``."""

    kind: str  # earliest | latest | dlsn | seq | txid | time
    dlsn: DlsnTuple | None = None
    value: int | None = None

    def __str__(self) -> str:
        if self.kind in ("earliest", "latest"):
            return self.kind
        if self.kind == "dlsn":
            assert self.dlsn is not None
            return f"dlsn:{format_dlsn(self.dlsn)}"
        return f"{self.kind}:{self.value}"


def parse_position(text: str | None) -> Position:
    if text is None or text in {"", "earliest"}:
        return Position("earliest")
    if text == "latest":
        return Position("latest")
    kind, sep, rest = text.partition(":")
    if sep and kind in ("seq", "txid", "time"):
        try:
            value = int(rest)
        except ValueError as exc:
            raise BadRequestError(f"position {text!r}: {kind} needs an integer") from exc
        if value < 0:
            raise BadRequestError(f"position {text!r} must be non-negative")
        return Position(kind, value=value)
    if kind == "dlsn":
        return Position("dlsn", dlsn=parse_dlsn(rest))
    if text.count(":") == 2:
        return Position("dlsn", dlsn=parse_dlsn(text))
    raise BadRequestError(
        f"position {text!r}: expected earliest, latest, DLSN, seq:N, txid:N or time:MS"
    )


# -- DLSN runs (compact batch answers) --------------------------------------------------


def encode_runs(dlsns: Iterable[DlsnTuple]) -> list[list[int]]:
    runs: list[list[int]] = []
    last: list[int] | None = None
    for seg, entry, slot in dlsns:
        if last is not None and last[0] == seg and last[1] == entry and last[2] + last[3] == slot:
            last[3] += 1
        else:
            last = [seg, entry, slot, 1]
            runs.append(last)
    return runs


def decode_runs(runs: Any) -> list[DlsnTuple]:
    if not isinstance(runs, list):
        raise BadRequestError("runs must be a list")
    out: list[DlsnTuple] = []
    for run in runs:
        if not isinstance(run, list) or len(run) != 4:
            raise BadRequestError("each run is [segment, entry, first_slot, count]")
        seg, entry, slot, count = run
        out.extend((seg, entry, slot + i) for i in range(count))
    return out


def write_answer(dlsns: Sequence[DlsnTuple], media: str) -> dict[str, Any]:
    if media == MSGPACK:
        return {"runs": encode_runs(dlsns)}
    return {"dlsns": [format_dlsn(d) for d in dlsns]}


def answer_dlsns(obj: Mapping[str, Any]) -> list[DlsnTuple]:
    if "runs" in obj:
        return decode_runs(obj["runs"])
    raw = obj.get("dlsns")
    if not isinstance(raw, list):
        raise BadRequestError("answer carries neither runs nor dlsns")
    return [parse_dlsn(d) for d in raw]


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
