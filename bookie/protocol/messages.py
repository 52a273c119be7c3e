"""The messages of the bookie wire protocol: one frozen dataclass per request and
response (their meta layouts and checks are in ops.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

from foundation.errors import BooklineError, for_code

from .frames import Op


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
    # 0: at most the one next entry (the original form).
    piggyback_bytes_max: int = 0
    master_key: bytes = b""


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
    master_key: bytes = b""


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
class AuthRequest:
    request_id: int
    token: str  # a foundation.auth token (signed, or a static one)


@dataclass(frozen=True, slots=True)
class AuthResponse:
    request_id: int
    principal: str  # who the bookie takes this connection to be ("" with auth off)


@dataclass(frozen=True, slots=True)
class HelloRequest:
    request_id: int
    nonce: bytes  # the client's fresh nonce (bookie/identity.py)


@dataclass(frozen=True, slots=True)
class HelloResponse:
    request_id: int
    bookie_id: str
    address: str  # the address the bookie is registered at
    proof: bytes  # HMAC of the nonce, id and address under the bookie's credential


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
    | AuthRequest
    | HelloRequest
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
    | AuthResponse
    | HelloResponse
    | ErrorResponse
)
