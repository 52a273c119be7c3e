"""Positions in a log stream: :class:`DLSN` and :class:`StartPosition` (pure, no I/O).

A **DLSN** (DistributedLog sequence number) is ``(segment seqno, entry id, slot id)``:
the segment (one ledger) a record lives in, the ledger entry (one record set) inside it,
and the record's index inside that set. DLSNs are totally ordered in stream order.

Byte form (24 bytes, big-endian; the docs/core-api.md contract)::

    offset  size  field
    0       8     segment seqno   (signed)
    8       8     entry id        (signed)
    16      8     slot id         (signed)

For non-negative DLSNs (every real position) the bytes sort like the DLSNs, so they can
be used as keys in ordered stores. No version byte: the length is the format, and a
future form will have another length. String form: ``"seg:entry:slot"``.
"""

from __future__ import annotations

import dataclasses
import enum
import struct
from typing import NamedTuple

from foundation.errors import BadRequestError

__all__ = ["DLSN", "DLSN_BYTES", "DLSN_INITIAL", "PositionKind", "StartPosition"]

_BARE = struct.Struct(">qqq")
DLSN_BYTES = _BARE.size  # 24


class DLSN(NamedTuple):
    """``(segment_seqno, entry_id, slot_id)``; a tuple, so ordering and hashing are free
    and creating one on the hot path is cheap."""

    segment_seqno: int
    entry_id: int
    slot_id: int

    def __bytes__(self) -> bytes:
        return _BARE.pack(*self)

    def __str__(self) -> str:
        return f"{self.segment_seqno}:{self.entry_id}:{self.slot_id}"

    @classmethod
    def from_bytes(cls, data: bytes) -> DLSN:
        if len(data) != DLSN_BYTES:
            raise BadRequestError(f"DLSN bytes must be {DLSN_BYTES} long, got {len(data)}")
        seg, entry, slot = _BARE.unpack(data)
        return cls(seg, entry, slot)

    @classmethod
    def parse(cls, text: str) -> DLSN:
        parts = text.strip().split(":")
        if len(parts) != 3:
            raise BadRequestError(f"DLSN must look like 'seg:entry:slot', got {text!r}")
        try:
            seg, entry, slot = (int(p) for p in parts)
        except ValueError as exc:
            raise BadRequestError(f"DLSN parts must be integers, got {text!r}") from exc
        return cls(seg, entry, slot)

    def next_slot(self) -> DLSN:
        return DLSN(self.segment_seqno, self.entry_id, self.slot_id + 1)


DLSN.__module__ = __name__
# The position before every record of a stream (segment seqnos start at 1).
DLSN_INITIAL = DLSN(1, 0, 0)


class PositionKind(enum.Enum):
    EARLIEST = "earliest"
    LATEST = "latest"
    DLSN = "dlsn"
    SEQUENCE = "sequence"
    TXID = "txid"
    TIMESTAMP = "timestamp"


@dataclasses.dataclass(frozen=True, slots=True)
class StartPosition:
    """Where a reader starts: the first record at or after the given point."""

    kind: PositionKind
    dlsn_value: DLSN | None = None  # for DLSN
    value: int = 0  # sequence id, txid or timestamp (ms)

    @classmethod
    def earliest(cls) -> StartPosition:
        return cls(PositionKind.EARLIEST)

    @classmethod
    def latest(cls) -> StartPosition:
        """After the last record written so far: only new records."""
        return cls(PositionKind.LATEST)

    @classmethod
    def dlsn(cls, dlsn: DLSN) -> StartPosition:
        return cls(PositionKind.DLSN, dlsn_value=DLSN(*dlsn))

    @classmethod
    def sequence(cls, sequence_id: int) -> StartPosition:
        return cls(PositionKind.SEQUENCE, value=_non_negative(sequence_id, "sequence id"))

    @classmethod
    def txid(cls, txid: int) -> StartPosition:
        return cls(PositionKind.TXID, value=txid)

    @classmethod
    def timestamp(cls, ms: int) -> StartPosition:
        return cls(PositionKind.TIMESTAMP, value=ms)

    @classmethod
    def coerce(cls, start: StartPosition | DLSN | str | None) -> StartPosition:
        """Accept what ``open_reader`` accepts: a StartPosition, a DLSN, ``"earliest"``,
        ``"latest"`` or a DLSN string ``"seg:entry:slot"``."""
        if start is None:
            return cls.earliest()
        if isinstance(start, StartPosition):
            return start
        if isinstance(start, DLSN):
            return cls.dlsn(start)
        if isinstance(start, str):
            text = start.strip().lower()
            if text == "earliest":
                return cls.earliest()
            if text == "latest":
                return cls.latest()
            return cls.dlsn(DLSN.parse(text))
        raise BadRequestError(f"not a start position: {start!r}")


def _non_negative(value: int, what: str) -> int:
    if value < 0:
        raise BadRequestError(f"{what} must be >= 0, got {value}")
    return value
