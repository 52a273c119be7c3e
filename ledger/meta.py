"""What the ledger client needs from its neighbours, as small typed interfaces.

* :class:`LedgerMeta` -- the ledger client's view of one ledger's metadata: quorums,
  digest type, state (OPEN -> IN_RECOVERY -> CLOSED), and the *segments*: ensemble
  ``bookies`` hold entries from ``first_entry_id`` up to the next segment's first entry.
  Metadata is the truth about where entries live: a segment is only added by a
  compare-and-set before any entry is sent to its new bookies.
* :class:`MetadataStore` -- create / read / compare-and-set / delete ledger metadata,
  ledger ids and writable bookies (adapted to :mod:`metadata` in ``ledger.adapters``).
* :class:`BookieTransport` -- add / read / fence / read-LAC on one bookie by id (adapted
  to :mod:`bookie.client` in ``ledger.adapters``).
* :class:`ReplicaInspector` -- what the autorecovery scrub asks a bookie: fingerprints of
  the entries it stores and the entries it found damaged.

Keeping these narrow lets the protocol logic run against in-memory fakes
(``ledger.memory``) with injected faults, and against real processes unchanged.
"""

from __future__ import annotations

import asyncio
import bisect
import dataclasses
import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from foundation.errors import ConfigError
from foundation.invariants import invariant
from ledger.digest import DigestType
from ledger.placement import BookieCandidate

__all__ = [
    "NO_ENTRY",
    "BookieTransport",
    "ChecksumPage",
    "Fingerprint",
    "LacAnswer",
    "LedgerMeta",
    "LedgerState",
    "MetadataStore",
    "ReadAnswer",
    "ReplicaInspector",
    "Segment",
    "validate_quorums",
]

# Entry id / LAC meaning "none yet".
NO_ENTRY = -1
# (CRC32C, length) of a stored entry blob: replicas holding the same bytes agree on it.
Fingerprint = tuple[int, int]


class LedgerState(enum.Enum):
    OPEN = "OPEN"
    IN_RECOVERY = "IN_RECOVERY"
    CLOSED = "CLOSED"


@dataclass(frozen=True, slots=True)
class Segment:
    first_entry_id: int
    bookies: tuple[str, ...]


def validate_quorums(ensemble_size: int, write_quorum: int, ack_quorum: int) -> None:
    if not ensemble_size >= write_quorum >= ack_quorum >= 1:
        raise ConfigError(
            "quorums must satisfy ensemble_size >= write_quorum >= ack_quorum >= 1, got "
            f"E={ensemble_size} Qw={write_quorum} Qa={ack_quorum}"
        )


@dataclass(frozen=True, slots=True)
class LedgerMeta:
    ledger_id: int
    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    digest_type: DigestType
    segments: tuple[Segment, ...]
    state: LedgerState = LedgerState.OPEN
    last_entry_id: int = NO_ENTRY  # meaningful when CLOSED
    length: int = 0  # total payload bytes, meaningful when CLOSED
    custom: Mapping[str, bytes] = field(default_factory=dict)
    # Kept so recovery tools and autorecovery can derive the master key (ZooKeeper ACLs
    # guard the metadata; bookies only ever see the derived key).
    password: bytes = b""
    ctime_ms: int = 0

    def __post_init__(self) -> None:
        validate_quorums(self.ensemble_size, self.write_quorum, self.ack_quorum)
        invariant(bool(self.segments), "ledger %d has no segment", self.ledger_id)
        invariant(self.segments[0].first_entry_id == 0, "first segment must start at 0")
        for prev, seg in zip(self.segments, self.segments[1:], strict=False):
            invariant(
                seg.first_entry_id > prev.first_entry_id,
                "ledger %d: segment starts must increase (%d then %d)",
                self.ledger_id,
                prev.first_entry_id,
                seg.first_entry_id,
            )
        for seg in self.segments:
            invariant(
                len(seg.bookies) == self.ensemble_size == len(set(seg.bookies)),
                "ledger %d: segment at %d has ensemble %r, want %d distinct bookies",
                self.ledger_id,
                seg.first_entry_id,
                seg.bookies,
                self.ensemble_size,
            )

    @property
    def is_closed(self) -> bool:
        return self.state is LedgerState.CLOSED

    @property
    def last_segment(self) -> Segment:
        return self.segments[-1]

    def segment_index(self, entry_id: int) -> int:
        starts = [s.first_entry_id for s in self.segments]
        return bisect.bisect_right(starts, entry_id) - 1

    def ensemble_for(self, entry_id: int) -> tuple[str, ...]:
        """The bookies of the segment holding ``entry_id``."""
        invariant(entry_id >= 0, "ensemble of negative entry id %d", entry_id)
        return self.segments[self.segment_index(entry_id)].bookies

    def all_bookies(self) -> set[str]:
        return {b for s in self.segments for b in s.bookies}

    def with_segment(self, first_entry_id: int, bookies: Sequence[str]) -> LedgerMeta:
        """A new last segment from ``first_entry_id``; replaces the last one if it
        starts there too (it holds no entry yet, so nothing is lost)."""
        last = self.segments[-1]
        invariant(
            first_entry_id >= last.first_entry_id,
            "ledger %d: new segment at %d before last segment at %d",
            self.ledger_id,
            first_entry_id,
            last.first_entry_id,
        )
        seg = Segment(first_entry_id, tuple(bookies))
        if first_entry_id == last.first_entry_id:
            segments = (*self.segments[:-1], seg)
        else:
            segments = (*self.segments, seg)
        return dataclasses.replace(self, segments=segments)

    def closed(self, last_entry_id: int, length: int) -> LedgerMeta:
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


@dataclass(frozen=True, slots=True)
class ReadAnswer:
    entry_id: int
    lac: int  # the bookie's LAC (after fencing, for fencing reads)
    data: bytes  # the packaged entry, still to be verified


@dataclass(frozen=True, slots=True)
class LacAnswer:
    lac: int
    next_entry_id: int | None
    next_entry: bytes | None
    # Entries next_entry_id + 1, ... (bookies that piggyback runs; see read_lac).
    more_entries: tuple[bytes, ...] = ()


class MetadataStore(Protocol):
    async def next_ledger_id(self) -> int: ...

    async def create(self, meta: LedgerMeta) -> int:
        """Store new metadata; return its version. AlreadyExistsError if taken."""

    async def read(self, ledger_id: int) -> tuple[LedgerMeta, int]:
        """Metadata and its version; NoLedgerError if absent."""

    async def write(self, meta: LedgerMeta, version: int) -> int:
        """Compare-and-set; return the new version. BadVersionError if it moved."""

    async def delete(self, ledger_id: int) -> None:
        """NoLedgerError if absent."""

    async def writable_bookies(self) -> list[BookieCandidate]: ...


class BookieTransport(Protocol):
    """Requests to one bookie, named by bookie id. Non-OK answers raise
    :mod:`foundation.errors` classes; every call honours ``timeout_s``."""

    async def add(  # noqa: PLR0917 - mirrors the wire request
        self,
        bookie: str,
        ledger_id: int,
        entry_id: int,
        lac: int,
        master_key: bytes,
        data: bytes,
        *,
        recovery: bool,
        timeout_s: float,
    ) -> None: ...

    def add_callback(  # noqa: PLR0917 - mirrors the wire request
        self,
        bookie: str,
        ledger_id: int,
        entry_id: int,
        lac: int,
        master_key: bytes,
        data: bytes,
        callback: Callable[[BaseException | None], None],
        *,
        recovery: bool,
        timeout_s: float,
    ) -> asyncio.Future[None] | None:
        """:meth:`add` without a coroutine (the writer's hot path): ``callback`` gets
        None or the error :meth:`add` would raise. Adds to one bookie leave in call
        order. Returns a future to cancel (then no callback) when the add had to wait
        in a task, else None."""

    async def read(
        self,
        bookie: str,
        ledger_id: int,
        entry_id: int,
        *,
        fence: bool,
        master_key: bytes,
        timeout_s: float,
    ) -> ReadAnswer: ...

    async def read_lac(
        self,
        bookie: str,
        ledger_id: int,
        previous_lac: int,
        timeout_ms: int,
        *,
        timeout_s: float,
        piggyback_bytes_max: int = 0,
    ) -> LacAnswer:
        """Long poll for the LAC. With ``piggyback_bytes_max`` > 0 the answer may carry
        a run of entries from ``previous_lac + 1`` (bookies that cannot, ignore it)."""

    async def write_lac(
        self, bookie: str, ledger_id: int, lac: int, master_key: bytes, *, timeout_s: float
    ) -> bool:
        """Explicit LAC; False (nothing sent) when the bookie does not serve it."""


@dataclass(frozen=True, slots=True)
class ChecksumPage:
    """What one bookie stores of a ledger's entries from the asked first entry up to
    ``last_entry_id``; entries in neither map nor set are not held there."""

    last_entry_id: int  # the page covers the asked range up to here (inclusive)
    fingerprints: Mapping[int, Fingerprint]  # entries held and read intact
    damaged: frozenset[int]  # entries held but failing their checksum


class ReplicaInspector(Protocol):
    """The scrub's questions to one bookie (named by id); errors as in BookieTransport."""

    async def entry_checksums(
        self,
        bookie: str,
        ledger_id: int,
        first_entry_id: int,
        last_entry_id: int,
        *,
        timeout_s: float,
    ) -> ChecksumPage:
        """Fingerprints of ``first..last`` (the page may stop early: its
        ``last_entry_id``). A bookie holding nothing of the ledger answers an empty page
        covering the whole range."""

    async def damaged_entries(
        self, bookie: str, *, limit: int, timeout_s: float
    ) -> list[tuple[int, int]]:
        """``(ledger_id, entry_id)`` pairs the bookie found damaged, sorted, at most
        ``limit`` of them (the first ones)."""
