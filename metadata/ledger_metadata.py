"""One ledger's metadata: the single model the ledger client, autorecovery and the tools
share, and its stored format (pure: no I/O; :mod:`metadata.ledgers` keeps it in
ZooKeeper).

A ledger has quorums (E, Qw, Qa), a digest type, a state (OPEN -> IN_RECOVERY ->
CLOSED) and *segments*: ensemble ``bookies`` hold entries from ``first_entry_id`` up to
the next segment's first entry. Metadata is the truth about where entries live: a
segment is only added by a compare-and-set before any entry is sent to its new bookies.

Stored format (``metadata.serde`` kind ``"ledger"``, format version 2 for ledgers with a
per-ledger key, 1 for the older ones, which lack the two key fields; the body map, in
this key order)::

    ledger_id        int    >= 0
    ensemble_size    int    E
    write_quorum     int    Qw
    ack_quorum       int    Qa (E >= Qw >= Qa >= 1)
    ensembles        [[first_entry_id, [bookie id, ...]], ...]
                            first entries increase from 0; E distinct bookies each
    password         bytes  the ledger key in clear: legacy ledgers (a configured
                            password) and ledgers made without a cluster ledger secret
                            (a random key); empty when the key is derived (below)
    digest_type      str    "crc32c" | "hmac"
    state            str    "OPEN" | "IN_RECOVERY" | "CLOSED"
    last_entry_id    int    -1 (none) or the last entry, meaningful once CLOSED
    length           int    payload bytes, meaningful once CLOSED
    custom_metadata  {str: bytes}   user tags, at most CUSTOM_METADATA_BYTES_MAX
    ctime_ms         int    creation time (wall clock)
    key_salt         bytes  (v2) random salt: the key is HMAC(cluster ledger secret,
                            ledger id || salt) (ledger/keys.py); empty: key = password
    key_check        bytes  (v2) SHA-256 of the master key (the digest of the key a
                            bookie is sent): what a bookie checks a presented master
                            key against; reveals neither key

The key check lets a bookie refuse adds, fences and reads under a wrong key without
knowing the cluster's secret, and without any key in a world-readable znode.

ZooKeeper checksums its storage and wire; ``serde`` carries the kind and version.
"""

from __future__ import annotations

import bisect
import dataclasses
import enum
import hashlib
import hmac
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from foundation.errors import BadRequestError, ConfigError
from foundation.quorum import check_quorum, write_set
from metadata import serde

__all__ = [
    "CUSTOM_METADATA_BYTES_MAX",
    "FORMAT_VERSION",
    "KIND",
    "NO_ENTRY",
    "DigestType",
    "LedgerMetadata",
    "LedgerState",
    "Segment",
    "master_key",
    "master_key_check",
]

KIND = "ledger"
FORMAT_VERSION = 2
# Written for ledgers without a key check, so older builds keep reading them.
FORMAT_VERSION_LEGACY = 1
CUSTOM_METADATA_BYTES_MAX = 64 * 1024  # user tags, not payload
# Entry id / LAC meaning "none yet".
NO_ENTRY = -1


class LedgerState(enum.Enum):
    OPEN = "OPEN"
    IN_RECOVERY = "IN_RECOVERY"
    CLOSED = "CLOSED"


class DigestType(enum.IntEnum):
    """How entries are checksummed. The values are the digest byte of the entry format
    (:mod:`ledger.digest`); the stored names are in :data:`_DIGEST_NAMES`."""

    CRC32C = 0
    HMAC_SHA256 = 1

    @property
    def digest_bytes(self) -> int:
        return 4 if self is DigestType.CRC32C else 32

    @classmethod
    def parse(cls, value: str | int | DigestType) -> DigestType:
        """Accept the enum, its value, or its name in any case: "crc32c", or "hmac" (the
        stored name; "hmac_sha256" too). Every config and the metadata use these names."""
        if isinstance(value, DigestType):
            return value
        try:
            if isinstance(value, int):
                return cls(value)
            by_stored_name = _DIGEST_BY_NAME.get(value.lower())
            if by_stored_name is not None:
                return by_stored_name
            return cls[value.upper().replace("-", "_")]
        except (KeyError, ValueError) as exc:
            raise ConfigError(f"unknown digest type {value!r}") from exc


# Domain-separation prefixes: the master key, its check value and the MAC key
# (ledger/digest.py) come from the same ledger key but must never be equal.
_MASTER_KEY_PREFIX = b"bookline-ledger-master-key\x00"
_KEY_CHECK_PREFIX = b"bookline-ledger-key-check\x00"


def master_key(password: bytes) -> bytes:
    """The access key bookies check for a ledger's adds, fences and reads: a digest of
    the ledger key (the key itself never leaves the client)."""
    return hashlib.sha256(_MASTER_KEY_PREFIX + password).digest()


def master_key_check(key: bytes) -> bytes:
    """What the metadata stores so a bookie can check a presented master key."""
    return hashlib.sha256(_KEY_CHECK_PREFIX + key).digest()


# The digest type's name in the stored format.
_DIGEST_NAMES = {DigestType.CRC32C: "crc32c", DigestType.HMAC_SHA256: "hmac"}
_DIGEST_BY_NAME = {name: dtype for dtype, name in _DIGEST_NAMES.items()}


@dataclass(frozen=True, slots=True)
class Segment:
    first_entry_id: int
    bookies: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class LedgerMetadata:
    ledger_id: int
    ensemble_size: int  # E: bookies per ensemble
    write_quorum: int  # Qw: replicas of each entry
    ack_quorum: int  # Qa: acks that complete an add
    segments: tuple[Segment, ...]  # increasing first entries; the first starts at 0
    digest_type: DigestType = DigestType.CRC32C
    # The ledger key in clear, for legacy ledgers and those made without a cluster
    # ledger secret (ZooKeeper ACLs guard it then); empty when derived from key_salt.
    password: bytes = b""
    state: LedgerState = LedgerState.OPEN
    last_entry_id: int = NO_ENTRY  # meaningful once CLOSED
    length: int = 0  # bytes of payload, meaningful once CLOSED
    custom: Mapping[str, bytes] = field(default_factory=dict)
    ctime_ms: int = 0
    # Of the bytes this was decoded from (where it came from, not what it says: not
    # compared, as a ledger without a key check is written in version 1).
    format_version: int = field(default=FORMAT_VERSION, compare=False)
    # Random salt of a derived key (ledger/keys.py); empty: the key is `password`.
    key_salt: bytes = b""
    # master_key_check(master key); empty on legacy ledgers (checked against password).
    key_check: bytes = b""

    def __post_init__(self) -> None:
        where = f"ledger {self.ledger_id}"
        if self.ledger_id < 0:
            raise BadRequestError(f"ledger id must be >= 0, got {self.ledger_id}")
        check_quorum(
            self.ensemble_size, self.write_quorum, self.ack_quorum, where, error=BadRequestError
        )
        if not isinstance(self.digest_type, DigestType):
            raise BadRequestError(f"{where}: digest_type must be a DigestType")
        if self.last_entry_id < NO_ENTRY or self.length < 0:
            raise BadRequestError(f"{where}: last_entry_id must be >= -1 and length >= 0")
        self._check_segments(where)
        custom = dict(self.custom)
        if sum(len(k) + len(v) for k, v in custom.items()) > CUSTOM_METADATA_BYTES_MAX:
            raise BadRequestError(
                f"{where}: custom metadata over {CUSTOM_METADATA_BYTES_MAX} bytes"
            )
        object.__setattr__(self, "custom", MappingProxyType(custom))

    def _check_segments(self, where: str) -> None:
        if not self.segments or self.segments[0].first_entry_id != 0:
            raise BadRequestError(f"{where}: the first ensemble must start at entry 0")
        previous = NO_ENTRY
        for seg in self.segments:
            if seg.first_entry_id <= previous:
                raise BadRequestError(f"{where}: ensemble first entry ids must increase")
            if len(seg.bookies) != self.ensemble_size or len(set(seg.bookies)) != len(seg.bookies):
                raise BadRequestError(
                    f"{where}: ensemble at entry {seg.first_entry_id} must have "
                    f"{self.ensemble_size} distinct bookies, got {list(seg.bookies)}"
                )
            previous = seg.first_entry_id

    # -- queries -------------------------------------------------------------------

    def accepts_master_key(self, key: bytes) -> bool:
        """Whether ``key`` is this ledger's master key (constant-time comparison)."""
        if self.key_check:
            return hmac.compare_digest(master_key_check(key), self.key_check)
        return hmac.compare_digest(master_key(self.password), key)

    @property
    def is_closed(self) -> bool:
        return self.state is LedgerState.CLOSED

    @property
    def last_segment(self) -> Segment:
        return self.segments[-1]

    def segment_index(self, entry_id: int) -> int:
        """Index of the segment holding ``entry_id``."""
        if entry_id < 0:
            raise BadRequestError(f"entry id must be >= 0, got {entry_id}")
        starts = [s.first_entry_id for s in self.segments]
        return bisect.bisect_right(starts, entry_id) - 1

    def ensemble_for(self, entry_id: int) -> tuple[str, ...]:
        """The bookies of the segment holding ``entry_id``."""
        return self.segments[self.segment_index(entry_id)].bookies

    def replicas(self, entry_id: int) -> tuple[str, ...]:
        """Bookies holding ``entry_id``, in write-set order."""
        ensemble = self.ensemble_for(entry_id)
        return tuple(
            ensemble[p] for p in write_set(entry_id, self.ensemble_size, self.write_quorum)
        )

    def all_bookies(self) -> set[str]:
        return {b for s in self.segments for b in s.bookies}

    # -- copies --------------------------------------------------------------------

    def with_state(self, state: LedgerState) -> LedgerMetadata:
        return dataclasses.replace(self, state=state)

    def with_segment(self, first_entry_id: int, bookies: Sequence[str]) -> LedgerMetadata:
        """A new last segment from ``first_entry_id``; replaces the last one if it
        starts there too (it holds no entry yet, so nothing is lost)."""
        if self.is_closed:
            raise BadRequestError(f"ledger {self.ledger_id} is closed; its ensemble is final")
        last = self.segments[-1]
        if first_entry_id < last.first_entry_id:
            raise BadRequestError(
                f"ledger {self.ledger_id}: new segment at {first_entry_id} before the last "
                f"segment at {last.first_entry_id}"
            )
        seg = Segment(first_entry_id, tuple(bookies))
        kept = self.segments[:-1] if first_entry_id == last.first_entry_id else self.segments
        return dataclasses.replace(self, segments=(*kept, seg))

    def closed(self, last_entry_id: int, length: int) -> LedgerMetadata:
        """CLOSED at ``last_entry_id``; trailing segments holding no entry are dropped."""
        segments = list(self.segments)
        while len(segments) > 1 and segments[-1].first_entry_id > last_entry_id:
            segments.pop()
        return dataclasses.replace(
            self,
            state=LedgerState.CLOSED,
            last_entry_id=last_entry_id,
            length=length,
            segments=tuple(segments),
        )

    # -- stored format ---------------------------------------------------------------

    def encode(self) -> bytes:
        body: dict[str, Any] = {
            "ledger_id": self.ledger_id,
            "ensemble_size": self.ensemble_size,
            "write_quorum": self.write_quorum,
            "ack_quorum": self.ack_quorum,
            "ensembles": [[s.first_entry_id, list(s.bookies)] for s in self.segments],
            "password": self.password,
            "digest_type": _DIGEST_NAMES[self.digest_type],
            "state": self.state.value,
            "last_entry_id": self.last_entry_id,
            "length": self.length,
            "custom_metadata": dict(self.custom),
            "ctime_ms": self.ctime_ms,
        }
        if not self.key_check:
            return serde.encode(KIND, FORMAT_VERSION_LEGACY, body)
        body["key_salt"] = self.key_salt
        body["key_check"] = self.key_check
        return serde.encode(KIND, FORMAT_VERSION, body)

    @classmethod
    def decode(cls, data: bytes, where: str = "") -> LedgerMetadata:
        version, body = serde.decode(data, KIND, FORMAT_VERSION, where)
        f = serde.field
        try:
            segments = tuple(
                Segment(int(first), tuple(str(b) for b in bookies))
                for first, bookies in f(body, "ensembles", list, where)
            )
            state = LedgerState(f(body, "state", str, where))
        except (TypeError, ValueError) as exc:
            raise serde.MetadataFormatError(f"ledger metadata at {where} is malformed") from exc
        digest_name = f(body, "digest_type", str, where)
        digest_type = _DIGEST_BY_NAME.get(digest_name)
        if digest_type is None:
            raise BadRequestError(
                f"ledger metadata at {where}: digest_type must be one of "
                f"{tuple(_DIGEST_BY_NAME)}, got {digest_name!r}"
            )
        return cls(
            ledger_id=f(body, "ledger_id", int, where),
            ensemble_size=f(body, "ensemble_size", int, where),
            write_quorum=f(body, "write_quorum", int, where),
            ack_quorum=f(body, "ack_quorum", int, where),
            segments=segments,
            password=f(body, "password", bytes, where),
            digest_type=digest_type,
            state=state,
            last_entry_id=f(body, "last_entry_id", int, where),
            length=f(body, "length", int, where),
            custom=f(body, "custom_metadata", dict, where),
            ctime_ms=f(body, "ctime_ms", int, where),
            format_version=version,
            key_salt=f(body, "key_salt", bytes, where) if version >= 2 else b"",
            key_check=f(body, "key_check", bytes, where) if version >= 2 else b"",
        )
