"""What the ledger client needs from its neighbours, as small typed interfaces.

A ledger's metadata is :class:`metadata.ledger_metadata.LedgerMetadata` (the one model,
shared with the store and autorecovery).

* :class:`MetadataStore` -- create / read / compare-and-set / delete ledger metadata,
  ledger ids and writable bookies (adapted to :mod:`metadata` in ``ledger.adapters``).
* :class:`BookieTransport` -- add (through a per-ledger :class:`EntryAdder`) / read /
  fence / read-LAC on one bookie by id (adapted to :mod:`bookie.client` in
  ``ledger.adapters``).
* :class:`ReplicaInspector` -- what the autorecovery scrub asks a bookie: fingerprints of
  the entries it stores and the entries it found damaged.

Keeping these narrow lets the protocol logic run against in-memory fakes
(``ledger.testing``) with injected faults, and against real processes unchanged.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from ledger.placement import BookieCandidate
from metadata.ledger_metadata import LedgerMetadata

__all__ = [
    "AddCallback",
    "BookieTransport",
    "ChecksumPage",
    "EntryAdder",
    "Fingerprint",
    "LacAnswer",
    "MetadataStore",
    "ReadAnswer",
    "ReplicaInspector",
]

# (CRC32C, length) of a stored entry blob: replicas holding the same bytes agree on it.
Fingerprint = tuple[int, int]


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

    async def create(self, meta: LedgerMetadata) -> int:
        """Store new metadata; return its version. AlreadyExistsError if taken."""

    async def read(self, ledger_id: int) -> tuple[LedgerMetadata, int]:
        """Metadata and its version; NoLedgerError if absent."""

    async def write(self, meta: LedgerMetadata, version: int) -> int:
        """Compare-and-set; return the new version. BadVersionError if it moved."""

    async def delete(self, ledger_id: int) -> None:
        """NoLedgerError if absent."""

    async def writable_bookies(self) -> list[BookieCandidate]: ...


# The outcome of one add, handed to an add callback: None, or the error add() raises.
AddCallback = Callable[[BaseException | None], None]


class EntryAdder(Protocol):
    """Adds to one ledger on one bookie (:meth:`BookieTransport.adder`): the ledger id,
    master key, RECOVERY flag and timeout are bound once; each add takes only
    ``(entry_id, lac, data)``. Adds through the adders of one bookie leave in call
    order."""

    def add(self, entry_id: int, lac: int, data: bytes) -> Awaitable[None]:
        """Store one packaged entry (``lac``: the writer's LAC it carries); done once
        the bookie has it durably, or raising the bookie's error."""

    def add_callback(
        self, entry_id: int, lac: int, data: bytes, callback: AddCallback
    ) -> asyncio.Future[None] | None:
        """:meth:`add` without a coroutine (the writer's hot path): ``callback`` gets
        None or the error :meth:`add` would raise. Returns a future to cancel (then no
        callback) when the add had to wait in a task, else None."""


class BookieTransport(Protocol):
    """Requests to one bookie, named by bookie id. Non-OK answers raise
    :mod:`foundation.errors` classes; every call honours ``timeout_s``."""

    def adder(
        self,
        bookie: str,
        ledger_id: int,
        master_key: bytes,
        *,
        recovery: bool = False,
        timeout_s: float,
    ) -> EntryAdder:
        """A handle for adds to ``ledger_id`` on ``bookie`` (cheap: no request)."""

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
        master_key: bytes = b"",
    ) -> LacAnswer:
        """Long poll for the LAC (``master_key``: the ledger's). With
        ``piggyback_bytes_max`` > 0 the answer may carry a run of entries from
        ``previous_lac + 1``."""

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
