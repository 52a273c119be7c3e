"""Garbage collection of deleted ledgers: drop what the metadata no longer knows.

Every ``gc_interval_ms`` the bookie compares the ledgers it holds with the ledger ids in
the metadata store, deletes the ones that are gone (index, ledger state, memtable, read
cache) and compacts the entry logs that became mostly garbage.

Safety: a ledger is deleted only when it was missing from the metadata in **two
consecutive** rounds, and the bookie's list is taken *before* the metadata's in each
round. Ledger metadata is always created before the first add reaches a bookie, so a
ledger this bookie holds has metadata by the time its list is read; the second round
covers any listing race or a store that answered from a stale view. A round whose
metadata listing fails deletes nothing and forgets its candidates.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final, Protocol

from foundation.errors import BooklineError

log = logging.getLogger(__name__)

__all__ = ["GcRound", "LedgerGc", "LedgerStorage"]

# At most this many ledgers are deleted per round, so one round's index batch and
# memtable sweep stay short; the rest wait for the next round.
DELETES_PER_ROUND_MAX: Final = 10_000


class LedgerStorage(Protocol):
    def ledgers(self) -> list[int]: ...

    async def delete_ledgers(self, ledger_ids: set[int]) -> None: ...

    async def compact(self) -> int: ...


# Every ledger id in the metadata store (BookKeeper: the ledger manager's listing).
ListLedgerIds = Callable[[], Awaitable[list[int]]]


@dataclass(frozen=True, slots=True)
class GcRound:
    """What one round did (for logs and tests)."""

    held: int  # ledgers held when the round began
    candidates: int  # held and missing from the metadata this round
    deleted: tuple[int, ...]  # missing in this round and the previous one
    reclaimed_bytes: int  # freed by the compaction that followed


class LedgerGc:
    """Runs GC rounds; :meth:`run_once` is one round, :meth:`run` loops until cancelled."""

    def __init__(
        self, storage: LedgerStorage, list_ledger_ids: ListLedgerIds, interval_s: float
    ) -> None:
        if interval_s <= 0:
            raise ValueError("gc interval must be positive")
        self._storage = storage
        self._list_ledger_ids = list_ledger_ids
        self._interval_s = interval_s
        self._candidates: set[int] = set()  # missing from the metadata last round

    async def run_once(self) -> GcRound:
        held = set(self._storage.ledgers())  # first: see the module docstring
        try:
            known = set(await self._list_ledger_ids())
        except BooklineError as exc:
            log.warning("ledger gc: cannot list ledger metadata, skipping a round: %s", exc)
            self._candidates = set()
            return GcRound(len(held), 0, (), 0)
        missing = held - known
        doomed = sorted(missing & self._candidates)[:DELETES_PER_ROUND_MAX]
        self._candidates = missing - set(doomed)
        reclaimed = 0
        if doomed:
            log.info("ledger gc: deleting %d ledgers gone from the metadata", len(doomed))
            await self._storage.delete_ledgers(set(doomed))
            reclaimed = await self._storage.compact()
        return GcRound(len(held), len(missing), tuple(doomed), reclaimed)

    async def run(self) -> None:
        """Rounds every interval until cancelled. Storage failures end the loop (the
        storage has already failed the bookie); metadata failures skip a round."""
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                result = await self.run_once()
            except BooklineError:
                log.exception("ledger gc: storage failed; no more gc rounds")
                return
            if result.deleted:
                log.info(
                    "ledger gc: deleted %d ledgers, compaction freed %d bytes",
                    len(result.deleted),
                    result.reclaimed_bytes,
                )
