"""Packaging and verification of ledger entries (pure: no I/O).

A bookie stores each entry as an opaque blob; the ledger client wraps the user's
payload so any reader can check that the blob is the entry it asked for and that no
byte changed on disk or on the wire. Byte layout (all integers big-endian)::

    offset  size  field
    0       1     format version (ENTRY_FORMAT_VERSION = 1)
    1       1     digest type (0 = CRC32C, 1 = HMAC-SHA256)
    2       8     ledger id            (unsigned)
    10      8     entry id             (signed, >= 0)
    18      8     LAC at packaging     (signed, -1 = nothing confirmed yet)
    26      8     cumulative length    (unsigned: payload bytes of entries 0..entry id)
    34      D     digest: D = 4 (CRC32C) or 32 (HMAC-SHA256)
    34+D    n     payload

The digest covers bytes ``[0, 34)`` (the header) followed by the payload, so a flipped
bit anywhere but in the digest itself fails verification, and a digest flip fails too.
CRC32C detects corruption; HMAC-SHA256, keyed by a key derived from the ledger key,
also stops someone without the key from forging entries.

The *master key* is a separate derivation of the ledger key
(:func:`metadata.ledger_metadata.master_key`): the client sends it with every add,
fence, read and LAC request, and a bookie refuses a ledger's requests under another key
(UNAUTHORIZED). The ledger key itself (ledger/keys.py) never leaves the client.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from dataclasses import dataclass

import crc32c

from foundation.errors import ChecksumError, ConfigError
from foundation.invariants import invariant
from metadata.ledger_metadata import DigestType, master_key  # part of a ledger's metadata

__all__ = [
    "ENTRY_FORMAT_VERSION",
    "HEADER_BYTES",
    "DigestManager",
    "DigestType",
    "UnpackedEntry",
    "mac_key",
    "master_key",
]

ENTRY_FORMAT_VERSION = 1
_HEADER = struct.Struct(">BBQqqQ")
HEADER_BYTES = _HEADER.size  # 34
_CRC = struct.Struct(">I")

# Domain separation: the master key (metadata.ledger_metadata) and the MAC key come from
# the same ledger key but must never be equal (a bookie knows the master key; it must
# not be able to MAC).
_MAC_KEY_PREFIX = b"bookline-ledger-mac-key\x00"


def mac_key(password: bytes) -> bytes:
    """The HMAC key of HMAC-SHA256 digests (never sent to bookies)."""
    return hashlib.sha256(_MAC_KEY_PREFIX + password).digest()


@dataclass(frozen=True, slots=True)
class UnpackedEntry:
    """A verified entry."""

    entry_id: int
    lac: int
    length: int  # cumulative payload bytes of entries 0..entry_id
    payload: bytes


class DigestManager:
    """Packages and verifies the entries of one ledger."""

    __slots__ = ("_digest_bytes", "_mac_key", "digest_type", "ledger_id")

    def __init__(self, ledger_id: int, digest_type: DigestType, password: bytes) -> None:
        if not 0 <= ledger_id < 1 << 64:
            raise ConfigError(f"ledger id out of range: {ledger_id}")
        self.ledger_id = ledger_id
        self.digest_type = digest_type
        self._digest_bytes = digest_type.digest_bytes
        self._mac_key = mac_key(password) if digest_type is DigestType.HMAC_SHA256 else b""

    def _digest(self, header: bytes, payload: bytes | memoryview) -> bytes:
        if self.digest_type is DigestType.CRC32C:
            return _CRC.pack(crc32c.crc32c(payload, crc32c.crc32c(header)))
        mac = hmac.new(self._mac_key, header, hashlib.sha256)
        mac.update(payload)
        return mac.digest()

    def package(self, entry_id: int, lac: int, length: int, payload: bytes) -> bytes:
        """The bytes to store on bookies for entry ``entry_id``."""
        invariant(entry_id >= 0, "entry id %d is negative", entry_id)
        invariant(-1 <= lac < entry_id, "LAC %d not below entry id %d", lac, entry_id)
        invariant(length >= len(payload), "cumulative length %d < payload %d", length, len(payload))
        header = _HEADER.pack(
            ENTRY_FORMAT_VERSION, self.digest_type, self.ledger_id, entry_id, lac, length
        )
        return b"".join((header, self._digest(header, payload), payload))

    def verify(
        self, data: bytes | memoryview, expected_entry_id: int | None = None
    ) -> UnpackedEntry:
        """Check ``data`` is an intact entry of this ledger; ChecksumError otherwise.

        ``expected_entry_id`` guards against a bookie answering with another entry.
        """
        view = memoryview(data)
        body_start = HEADER_BYTES + self._digest_bytes
        if len(view) < HEADER_BYTES:
            raise ChecksumError(
                f"ledger {self.ledger_id}: entry of {len(view)} bytes is shorter than a header"
            )
        header = bytes(view[:HEADER_BYTES])
        version, dtype, ledger_id, entry_id, lac, length = _HEADER.unpack(header)
        if version != ENTRY_FORMAT_VERSION:
            raise ChecksumError(f"ledger {self.ledger_id}: unknown entry format version {version}")
        if dtype != self.digest_type:
            raise ChecksumError(
                f"ledger {self.ledger_id}: entry digest type {dtype}, ledger uses "
                f"{int(self.digest_type)}"
            )
        if len(view) < body_start:
            raise ChecksumError(
                f"ledger {self.ledger_id}: entry of {len(view)} bytes lacks a digest"
            )
        payload = view[body_start:]
        expected = self._digest(header, payload)
        if not hmac.compare_digest(expected, view[HEADER_BYTES:body_start]):
            raise ChecksumError(f"ledger {self.ledger_id} entry {entry_id}: digest mismatch")
        if ledger_id != self.ledger_id:
            raise ChecksumError(f"entry of ledger {ledger_id} served for ledger {self.ledger_id}")
        if expected_entry_id is not None and entry_id != expected_entry_id:
            raise ChecksumError(
                f"ledger {self.ledger_id}: asked for entry {expected_entry_id}, got {entry_id}"
            )
        return UnpackedEntry(entry_id=entry_id, lac=lac, length=length, payload=bytes(payload))
